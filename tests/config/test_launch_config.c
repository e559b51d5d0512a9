/* mlxdist-launch refuses a bad hostfile (same rules as the ranks: one JSON
 * document, regular files only, bounded, duplicates named) and bad numeric
 * options with exit status 2 and a usage message naming the problem, before
 * anything starts and within BOUND_S (each run is a child process with that
 * bound).
 *   Usage: test_launch_config PATH_TO_MLXDIST_LAUNCH */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bounded.h"
#include "testutil.h"

static const char* g_launcher;
static char g_dir[256];
static bool g_verbose;

#define ARGV(...) ((const char* const[]){__VA_ARGS__, NULL})

/* Run the launcher with args (and env: "K=V" or NULL); expect exit 2 and every
 * want (NULL-terminated) on its output, and nothing started. */
static void expect_usage_error(const char* const* args, const char* env, ...) {
  char* argv[32];
  int n = 0;
  argv[n++] = (char*)g_launcher;
  for (; *args && n < 30; args++) argv[n++] = (char*)*args;
  argv[n] = NULL;
  const char* envs[2] = {env, NULL};
  static bounded_result r;
  bounded_exec(argv, env ? envs : NULL, &r);
  if (r.status == -1) T_FAIL("%s %s: no answer within %.0f s", argv[1], argv[2], BOUND_S);
  if (r.status != 2) T_FAIL("%s %s: exit %d, expected 2:\n%s", argv[1], argv[2], r.status, r.out);
  T_ASSERT(strstr(r.out, "[launch] ") != NULL);
  T_ASSERT(strstr(r.out, "Run 'mlxdist-launch --help' for usage.") != NULL);
  T_ASSERT(strstr(r.out, "STARTED") == NULL);
  va_list ap;
  va_start(ap, env);
  const char* w;
  while ((w = va_arg(ap, const char*)) != NULL)
    if (!strstr(r.out, w)) T_FAIL("%s %s: the message lacks '%s':\n%s", argv[1], argv[2], w, r.out);
  va_end(ap);
  if (g_verbose) printf("  %s %s %s\n    -> %s", argv[1], argv[2], env ? env : "", r.out);
}

static const char* hostfile(const char* name, const char* text) {
  static char path[8][300];
  static int next;
  char* p = path[next++ % 8];
  snprintf(p, 300, "%s/%s", g_dir, name);
  write_file(p, text, strlen(text));
  return p;
}

#define PROG "--", "/bin/sh", "-c", "echo STARTED"

static void hostfile_tests(void) {
  const char* p;
  p = hostfile("stray.json", "[[\"127.0.0.1:45001\"]], [\"127.0.0.1:45002\"]]");
  expect_usage_error(ARGV("--hostfile", p, PROG), NULL, "has more after its JSON value",
                     "a stray ']' or a second document?", NULL);
  p = hostfile("two.json", "[[\"127.0.0.1:45001\"]]\n[[\"127.0.0.1:45002\"]]\n");
  expect_usage_error(ARGV("--hostfile", p, PROG), NULL, "at line 2, column 1", NULL);
  p = hostfile("dup.json", "[[\"127.0.0.1:45001\"], [\"127.0.0.1:45001\"]]");
  expect_usage_error(ARGV("--hostfile", p, PROG), NULL,
                     "duplicate address: rank 0 connection 0 and rank 1 connection 0 both list "
                     "'127.0.0.1:45001'",
                     NULL);
  p = hostfile("empty.json", "");
  expect_usage_error(ARGV("--hostfile", p, PROG), NULL, "is empty", NULL);
  expect_usage_error(ARGV("--hostfile", "/dev/zero", PROG), NULL,
                     "hostfile '/dev/zero' is a character device (expected a regular file)", NULL);
  char fifo[300];
  snprintf(fifo, sizeof fifo, "%s/fifo", g_dir);
  T_ASSERT(mkfifo(fifo, 0600) == 0);
  expect_usage_error(ARGV("--hostfile", fifo, PROG), NULL, "is a FIFO (named pipe)", NULL);
  expect_usage_error(ARGV("--hostfile", g_dir, PROG), NULL, "is a directory", NULL);
  /* more ranks than the launcher starts */
  size_t cap = 65537 * 24 + 16, o = 0;
  char* text = malloc(cap);
  T_ASSERT(text != NULL);
  text[o++] = '[';
  for (int r = 0; r < 65537; r++)
    o += (size_t)snprintf(text + o, cap - o, "%s[\"127.0.0.1:%d\"]", r ? "," : "", 1 + r % 60000);
  snprintf(text + o, cap - o, "]");
  p = hostfile("many.json", text);
  free(text);
  expect_usage_error(ARGV("--hostfile", p, PROG), NULL, "lists 65537 ranks", "at most 65536", NULL);
  /* disagreements with the command line */
  p = hostfile("ok.json", "[[\"127.0.0.1:45001\"], [\"127.0.0.1:45002\"]]");
  expect_usage_error(ARGV("-n", "3", "--hostfile", p, PROG), NULL, "-n 3 does not match hostfile",
                     "which lists 2 ranks", NULL);
  expect_usage_error(ARGV("--connections", "2", "--hostfile", p, PROG), NULL,
                     "lists 1 address per rank but --connections is 2", NULL);
  printf("hostfiles: OK\n");
}

static void option_tests(void) {
  const char* bad_n[] = {"0", "-1", "2x", " 2", "+2", "0x2", "1e3", "", "65537", "99999999999999"};
  for (size_t i = 0; i < sizeof bad_n / sizeof bad_n[0]; i++) {
    char want[128];
    snprintf(want, sizeof want, "must be an integer from 1 to 65536, got '%s'", bad_n[i]);
    expect_usage_error(ARGV("-n", bad_n[i], PROG), NULL, "-n (the number of ranks)", want, NULL);
  }
  const char* bad_k[] = {"0", "65", "1.5", "two"};
  for (size_t i = 0; i < sizeof bad_k / sizeof bad_k[0]; i++)
    expect_usage_error(ARGV("-n", "2", "--connections", bad_k[i], PROG), NULL,
                       "--connections must be an integer from 1 to 64", NULL);
  const char* bad_t[] = {"-1", "nan", "inf", "1e999", "0x10", "5s", "", "31536001"};
  for (size_t i = 0; i < sizeof bad_t / sizeof bad_t[0]; i++) {
    char want[160];
    snprintf(want, sizeof want,
             "--timeout must be seconds, a number from 0 to 31536000 (0: no limit), got '%s'",
             bad_t[i]);
    expect_usage_error(ARGV("-n", "2", "--timeout", bad_t[i], PROG), NULL, want, NULL);
  }
  expect_usage_error(ARGV("-n", "2", PROG), "MLXDIST_LAUNCH_TIMEOUT=inf",
                     "MLXDIST_LAUNCH_TIMEOUT must be seconds, a number from 0 to 31536000 (0: no "
                     "limit), got 'inf'",
                     NULL);
  expect_usage_error(ARGV("-n", "2", PROG), "MLXDIST_LAUNCH_TIMEOUT=-5",
                     "MLXDIST_LAUNCH_TIMEOUT must be", "got '-5'", NULL);
  /* a value the ranks would refuse at init is refused before they start */
  expect_usage_error(ARGV("-n", "2", "--env", "MLXDIST_TIMEOUT=0", PROG), NULL,
                     "--env MLXDIST_TIMEOUT=0: MLXDIST_TIMEOUT='0' is out of range; expected "
                     "seconds, a number from 0.001 to 86400",
                     NULL);
  expect_usage_error(ARGV("-n", "2", "--env", "MLXDIST_TRANSPORT=udp", PROG), NULL,
                     "MLXDIST_TRANSPORT='udp' is not valid; expected auto, tcp or shm", NULL);
  printf("options: OK\n");
}

/* Across hosts: the options and hostfiles of hosts, refused before any ssh starts. */
static void hosts_tests(void) {
  expect_usage_error(ARGV("--hosts", "", PROG), NULL, "--hosts needs a list of hosts", NULL);
  expect_usage_error(ARGV("--hosts", "h1,,h2", PROG), NULL,
                     "--hosts 'h1,,h2' has an empty host name", NULL);
  expect_usage_error(ARGV("--hosts", "-oProxyCommand=sh", PROG), NULL,
                     "host '-oProxyCommand=sh' is not a host name or address", NULL);
  expect_usage_error(ARGV("--hosts", "h1", "-n", "0", PROG), NULL,
                     "must be an integer from 1 to 65536, got '0'", NULL);
  expect_usage_error(ARGV("--hosts", "h1,h2", "-n", "40000", PROG), NULL, "more than 65536 ranks",
                     NULL);
  const char* p = hostfile("hosts.json", "[{\"ssh\": \"h1\"}]");
  expect_usage_error(ARGV("--hosts", "h1", "--hostfile", p, PROG), NULL,
                     "--hosts and --hostfile both name the hosts; give one of them", NULL);
  expect_usage_error(ARGV("--hosts", "h1", "--connections", "2", PROG), NULL,
                     "--connections applies to a job on this host only", NULL);
  const char* bad_range[] = {"5000",    "5000-", "-5000",  "6000-5000", "0-10",
                             "1-65536", "a-b",   "10-20x", "+1-2"};
  for (size_t i = 0; i < sizeof bad_range / sizeof *bad_range; i++) {
    char want[160];
    snprintf(want, sizeof want, "--port-range must be A-B with 1 <= A <= B <= 65535, got '%s'",
             bad_range[i]);
    expect_usage_error(ARGV("--hosts", "h1", "--port-range", bad_range[i], PROG), NULL, want, NULL);
  }
  const char* bad_if[] = {"", "a/b", "eth 0", "averyveryverylongname", "eth0:1"};
  for (size_t i = 0; i < sizeof bad_if / sizeof *bad_if; i++)
    expect_usage_error(ARGV("--hosts", "h1", "--ifname", bad_if[i], PROG), NULL,
                       "--ifname must be a network interface name (1..15 characters)", NULL);
  const char* bad_ct[] = {"0", "-1", "x", "", "1e9", "nan"};
  for (size_t i = 0; i < sizeof bad_ct / sizeof *bad_ct; i++)
    expect_usage_error(ARGV("--hosts", "h1", "--connect-timeout", bad_ct[i], PROG), NULL,
                       "--connect-timeout must be a number of seconds above 0", NULL);
  expect_usage_error(ARGV("--hosts", "h1", "--cwd", "", PROG), NULL, "--cwd needs a directory",
                     NULL);
  expect_usage_error(ARGV("--hosts", "h1", "--ssh", "ssh -F 'x", PROG), NULL,
                     "--ssh 'ssh -F 'x' has an unclosed single quote", NULL);
  /* hostfiles of hosts, through the launcher */
  p = hostfile("unknown.json", "[{\"ssh\": \"h1\", \"ip\": [\"10.0.0.1\"]}]");
  expect_usage_error(ARGV("--hostfile", p, PROG), NULL, "host 0: unknown key \"ip\"", NULL);
  p = hostfile("backend.json", "{\"backend\": \"nccl\", \"hosts\": [{\"ssh\": \"h1\"}]}");
  expect_usage_error(ARGV("--hostfile", p, PROG), NULL,
                     "\"backend\" must be \"ring\", \"mpi\", \"jaccl\" or \"jaccl-ring\"", NULL);
  /* jaccl: the "rdma" lists are checked before any name is resolved */
  p = hostfile("jaccl.json", "{\"backend\": \"jaccl\", \"hosts\": [{\"ssh\": \"h1\"}]}");
  expect_usage_error(ARGV("--hostfile", p, PROG), NULL,
                     "host 0 (h1) has no \"rdma\" list (jaccl needs one per host", NULL);
  p = hostfile("slots.txt", "h1:2\nh2:zero\n");
  expect_usage_error(ARGV("--hostfile", p, PROG), NULL,
                     "line 2: the slots of host 'h2' must be an integer from 1 to 65536", NULL);
  p = hostfile("ranks.json", "[[\"127.0.0.1:45001\"], [\"127.0.0.1:45002\"]]");
  expect_usage_error(ARGV("--backend", "mpi", "--hostfile", p, PROG), NULL,
                     "--hostfile of ranks (lists of \"ip:port\") applies to the ring backend only",
                     NULL);
  p = hostfile("conns.txt", "h1\nh2\n");
  expect_usage_error(ARGV("--connections", "2", "--hostfile", p, PROG), NULL,
                     "--connections applies to a job on this host only", NULL);
  p = hostfile("mpisecret.json", "{\"backend\": \"mpi\", \"hosts\": [{\"ssh\": \"h1\"}]}");
  expect_usage_error(ARGV("--secret", "--hostfile", p, PROG), NULL,
                     "--secret applies to the ring backend only", NULL);
  printf("hosts: OK\n");
}

int main(int argc, char** argv) {
  T_ASSERT(argc == 2);
  g_launcher = argv[1];
  g_verbose = t_env_int("MLXDIST_TEST_VERBOSE", 0) != 0;
  unsetenv("MLXDIST_LAUNCH_TIMEOUT");
  snprintf(g_dir, sizeof g_dir, "/tmp/mlxdist_launchcfg_XXXXXX");
  T_ASSERT(mkdtemp(g_dir) != NULL);
  hostfile_tests();
  option_tests();
  hosts_tests();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  T_ASSERT(system(cmd) == 0);
  return t_exit_status();
}

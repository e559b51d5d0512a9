/* mlxdist-launch across hosts, its pure parts (tools/launch/hosts.c, remote.c,
 * mpi.c): every form of --hosts and of a hostfile of hosts with every error
 * message; POSIX sh quoting (run through a real sh); --ssh's words; the ssh
 * command line; the remote script run for real by sh (environment, token on
 * stdin, its end stopping the program, the exit status); and mpirun's argv
 * across hosts for Open MPI and MPICH. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch/launch.h"
#include "testutil.h"

static char why[1024];

static void hosts_ok(const char* list, int k, launch_hosts* hs) {
  int rc = launch_hosts_from_list(list, k, hs, why, sizeof why);
  T_REQUIREF(rc == 0, "--hosts %s: %s", list, why);
}

static void list_bad(const char* list, int k, const char* want) {
  launch_hosts hs;
  int rc = launch_hosts_from_list(list, k, &hs, why, sizeof why);
  T_CHECKF(rc == -1 && strstr(why, want), "--hosts '%s': rc %d, '%s' lacks '%s'", list, rc, why,
           want);
  T_CHECK(hs.h == NULL && hs.n == 0);
}

static int file(const char* text, int k, launch_hosts* hs) {
  why[0] = '\0';
  return launch_hosts_from_file(text, strlen(text), "h.json", k, hs, why, sizeof why);
}

static void file_bad(const char* text, int k, const char* want) {
  launch_hosts hs;
  int rc = file(text, k, &hs);
  T_CHECKF(rc == -1 && strstr(why, want), "file '%s': rc %d, '%s' lacks '%s'", text, rc, why, want);
  T_CHECK(hs.h == NULL && hs.envs == NULL);
}

static void test_list(void) {
  launch_hosts hs;
  hosts_ok("h1,user@h2,10.0.0.3", 2, &hs);
  T_CHECK_EQ(hs.n, 3);
  T_CHECK_EQ(hs.ranks, 6);
  T_CHECK(strcmp(hs.h[1].name, "user@h2") == 0 && hs.h[1].slots == 2 && !hs.h[1].local);
  T_CHECK(hs.h[0].ip[0] == '\0' && hs.backend == -1);
  /* host-major: ranks 0,1 on h1, 2,3 on h2, 4,5 on 10.0.0.3 */
  int want[6] = {0, 0, 1, 1, 2, 2};
  for (int r = 0; r < 6; r++) T_CHECK_EQ(launch_hosts_of_rank(&hs, r), want[r]);
  T_CHECK_EQ(launch_hosts_of_rank(&hs, 6), -1);
  T_CHECK(!launch_hosts_all_local(&hs));
  launch_hosts_free(&hs);
  hosts_ok("localhost,127.0.0.1,::1", 0, &hs);
  T_CHECK(hs.ranks == 3 && launch_hosts_all_local(&hs));
  launch_hosts_free(&hs);
  hosts_ok("localhost,127.0.0.2", 1, &hs);
  T_CHECK(hs.h[0].local && !hs.h[1].local);
  launch_hosts_free(&hs);
  list_bad("h1,,h2", 1, "--hosts 'h1,,h2' has an empty host name");
  list_bad("h1,", 1, "has an empty host name");
  list_bad("-oProxyCommand=touch", 1,
           "--hosts: host '-oProxyCommand=touch' is not a host name or address");
  list_bad("h 1", 1, "not starting with '-'");
  list_bad("h1;reboot", 1, "host 'h1;reboot' is not a host name");
  list_bad("a,b", 40000, "more than 65536 ranks");
  char big[400];
  memset(big, 'x', 300);
  big[300] = '\0';
  list_bad(big, 1, "longer than 255 bytes");
  printf("--hosts: OK\n");
}

static void test_json(void) {
  launch_hosts hs;
  /* (b) MLX's list */
  T_REQUIREF(file("[{\"ssh\": \"h1\", \"ips\": [\"10.0.0.1\", \"10.1.0.1\"]}, {\"ssh\": \"h2\"}]",
                  2, &hs) == 0,
             "%s", why);
  T_CHECK(hs.n == 2 && hs.ranks == 4 && strcmp(hs.h[0].ip, "10.0.0.1") == 0 && !hs.h[1].ip[0]);
  launch_hosts_free(&hs);
  T_REQUIRE(file("[{\"ssh\": \"a\", \"ips\": [\"fe80::1\"], \"rdma\": []}]", 0, &hs) == 0);
  T_CHECK(hs.ranks == 1 && strcmp(hs.h[0].ip, "fe80::1") == 0);
  launch_hosts_free(&hs);
  /* (c) MLX's object */
  T_REQUIREF(file("{\"backend\": \"mpi\", \"envs\": [\"A=1\", \"B_2=x=y\"], \"hosts\": "
                  "[{\"ssh\": \"h1\"}, {\"ssh\": \"localhost\"}]}",
                  1, &hs) == 0,
             "%s", why);
  T_CHECK(hs.backend == 1 && hs.n_envs == 2 && strcmp(hs.envs[1], "B_2=x=y") == 0);
  T_CHECK(hs.h[1].local);
  launch_hosts_free(&hs);
  T_REQUIRE(file("{\"backend\": \"ring\", \"hosts\": [{\"ssh\": \"h1\"}]}", 1, &hs) == 0);
  T_CHECK(hs.backend == 0 && hs.n_envs == 0);
  launch_hosts_free(&hs);
  /* (a) the ring's own format, empty, or bad JSON: left to the ring's parser */
  T_CHECK_EQ(file("[[\"127.0.0.1:5000\"], [\"127.0.0.1:5001\"]]", 0, &hs), 1);
  T_CHECK_EQ(file("[]", 0, &hs), 1);
  T_CHECK_EQ(file("  \n", 0, &hs), 1);
  T_CHECK_EQ(file("[{\"ssh\": ", 0, &hs), 1);
  T_CHECK_EQ(file("[{\"ssh\": \"a\"}] [1]", 0, &hs), 1);
  /* an escaped NUL would cut the name short in cJSON: left to the ring's parser, which names it */
  T_CHECK_EQ(file("[{\"ssh\": \"h1\\u0000x\"}]", 0, &hs), 1);
  /* errors */
  file_bad("[\"h1\"]", 1, "hostfile 'h.json', host 0: expected an object {\"ssh\": \"host\"");
  file_bad("[{\"ssh\": \"h1\"}, {\"sh\": \"h2\"}]", 1,
           "host 1: unknown key \"sh\" (known: \"ssh\", \"ips\", \"rdma\")");
  file_bad("[{\"ips\": [\"10.0.0.1\"]}]", 1, "\"ssh\" (the host's ssh name) is missing");
  file_bad("[{\"ssh\": 7}]", 1, "is missing or not a string");
  file_bad("[{\"ssh\": \"h\", \"ips\": \"10.0.0.1\"}]", 1, "\"ips\" must be a list of addresses");
  file_bad("[{\"ssh\": \"h\", \"ips\": [\"h.example\"]}]", 1,
           "\"ips\" entries must be IPv4 or IPv6 addresses");
  file_bad("[{\"ssh\": \"-F/x\"}]", 1, "host '-F/x' is not a host name or address");
  file_bad("{\"hosts\": [{\"ssh\": \"h\"}], \"hostz\": 1}", 1,
           "unknown key \"hostz\" (known: \"backend\", \"envs\", \"hosts\")");
  file_bad("{\"backend\": \"nccl\", \"hosts\": []}", 1,
           "\"backend\" must be \"ring\", \"mpi\", \"jaccl\" or \"jaccl-ring\"");
  file_bad("{\"envs\": [\"1A=2\"], \"hosts\": []}", 1, "\"envs\" entry 0 is not \"NAME=VALUE\"");
  file_bad("{\"envs\": \"A=1\", \"hosts\": []}", 1, "\"envs\" must be a list");
  file_bad("{\"envs\": [\"A=1\", 5], \"hosts\": []}", 1, "\"envs\" entry 1 is not");
  file_bad("{\"backend\": \"ring\"}", 1,
           "\"hosts\" (a list of {\"ssh\": ..., \"ips\": [...]}) is "
           "missing or not a list");
  file_bad("{\"hosts\": []}", 1, "hostfile 'h.json' lists no host");
  file_bad("h1 h2", 1, "line 1: expected \"host\""); /* not JSON-looking: the text form */
  /* bytes JSON forbids (the ring's parser's rule, util/json_bytes.h), in both JSON forms */
  static const char nul_list[] = "[{\"ssh\": \"h1\"},\0{\"ssh\": \"h2\"}]";
  int rc = launch_hosts_from_file(nul_list, sizeof nul_list - 1, "h.json", 1, &hs, why, sizeof why);
  T_CHECKF(rc == -1 && strstr(why,
                              "hostfile 'h.json': byte 0x00 at offset 15 (line 1, column 16) is "
                              "not allowed in JSON (only space, tab, line feed and carriage "
                              "return may separate values)"),
           "rc %d: %s", rc, why);
  file_bad("[{\"ssh\": \"h1\"}\f]", 1, "byte 0x0c at offset 14 (line 1, column 15) is not");
  file_bad("\v{\"hosts\": [{\"ssh\": \"h\"}]}", 1, "byte 0x0b at offset 0");
  file_bad("{\"envs\": [\"A=1\x01\"], \"hosts\": [{\"ssh\": \"h\"}]}", 1,
           "byte 0x01 at offset 14 (line 1, column 15), inside a string, is not allowed in JSON");
  file_bad("{\"envs\": [\"A=1\tx\"], \"hosts\": [{\"ssh\": \"h\"}]}", 1,
           "byte 0x09 at offset 14 (line 1, column 15), inside a string");
  file_bad("\f[[\"127.0.0.1:5000\"]]", 0, "byte 0x0c at offset 0"); /* the ring's form too */
  T_REQUIREF(file("\t[{\"ssh\":\t\"h1\"},\r\n {\"ssh\": \"h2\"}]\r\n", 1, &hs) == 0, "%s", why);
  T_CHECK(hs.n == 2);
  launch_hosts_free(&hs);
  printf("hostfiles of hosts (JSON): OK\n");
}

static void test_text(void) {
  launch_hosts hs;
  T_REQUIREF(file("# cluster\nh1:2\n  h2 slots=3  # big\n\n[::1]:2\nfe80::1\nh3\n", 4, &hs) == 0,
             "%s", why);
  T_CHECK_EQ(hs.n, 5);
  T_CHECK(hs.h[0].slots == 2 && hs.h[1].slots == 3 && hs.h[2].slots == 2 && hs.h[2].local);
  T_CHECK(strcmp(hs.h[3].name, "fe80::1") == 0 && hs.h[3].slots == 4 && hs.h[4].slots == 4);
  T_CHECK_EQ(hs.ranks, 15);
  launch_hosts_free(&hs);
  file_bad("h1:0\n", 1,
           "hostfile 'h.json', line 1: the slots of host 'h1' must be an integer "
           "from 1 to 65536, got '0'");
  file_bad("h1\nh2:x\n", 1, "line 2: the slots of host 'h2'");
  file_bad("h1:70000\n", 1, "got '70000'");
  file_bad("h1 foo=2\n", 1, "line 1: expected \"host\", \"host:SLOTS\" or \"host slots=SLOTS\"");
  file_bad("h0\n[::1:2\n", 1, "line 2: '[::1:2' lacks its ']'");
  file_bad("h0\n[::1]x\n", 1, "line 2: unexpected text after ']'");
  file_bad("h1\n-oX\n", 1, "line 2: host '-oX' is not a host name");
  file_bad("# only a comment\n", 1, "lists no host");
  file_bad("h1:60000\nh2:6000\n", 2, "line 2: more than 65536 ranks");
  const char nul[] = "h1\nh\0x\n";
  T_CHECK_EQ(launch_hosts_from_file(nul, sizeof nul - 1, "n", 1, &hs, why, sizeof why), -1);
  T_CHECK(strstr(why, "line 2: a NUL byte") != NULL);
  printf("hostfiles of hosts (text): OK\n");
}

/* Run argv with stdin from a pipe fed in_text (kept open for hold_s unless
 * -1: forever until the child ends); stdout into out. Returns the wait status. */
static int run_sh(char* const* argv, const char* in_text, double close_after_s, char* out,
                  size_t cap, double* took) {
  int pi[2], po[2];
  T_REQUIRE(pipe(pi) == 0 && pipe(po) == 0);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pid_t pid = fork();
  T_REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(pi[0], 0);
    dup2(po[1], 1);
    close(pi[0]);
    close(pi[1]);
    close(po[0]);
    close(po[1]);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(pi[0]);
  close(po[1]);
  T_REQUIRE(write(pi[1], in_text, strlen(in_text)) == (ssize_t)strlen(in_text));
  size_t len = 0;
  bool in_open = true;
  for (;;) {
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double el = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (in_open && close_after_s >= 0 && el >= close_after_s) {
      close(pi[1]);
      in_open = false;
    }
    T_REQUIREF(el < 20, "the script did not end within 20 s");
    struct pollfd p = {.fd = po[0], .events = POLLIN};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t got = read(po[0], out + len, cap - 1 - len);
    if (got <= 0) break;
    len += (size_t)got;
  }
  out[len] = '\0';
  if (in_open) close(pi[1]);
  close(po[0]);
  int st = 0;
  T_REQUIRE(waitpid(pid, &st, 0) == pid);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  *took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  return st;
}

static void test_quote_and_words(void) {
  const char* nasty[] = {"",          "plain", "a b", "it's", "'", "$HOME `id` $(id) \\ \" ; & | *",
                         "new\nline", "-n"};
  for (size_t i = 0; i < sizeof nasty / sizeof *nasty; i++) {
    char* q = NULL;
    size_t len = 0;
    T_REQUIRE(launch_sh_quote(&q, &len, nasty[i]) == 0);
    char* cmd = malloc(len + 32);
    sprintf(cmd, "printf '%%s' %s", q);
    char* av[] = {"sh", "-c", cmd, NULL};
    char out[512];
    double took;
    int st = run_sh(av, "", 0, out, sizeof out, &took);
    T_CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0 && strcmp(out, nasty[i]) == 0,
             "quoted '%s' came back as '%s'", nasty[i], out);
    free(cmd);
    free(q);
  }
  char** w =
      launch_split_words("ssh -F '/tmp/my dir/cfg'  -o \"ProxyJump=a b\" x\\ y", why, sizeof why);
  T_REQUIREF(w != NULL, "%s", why);
  const char* want[] = {"ssh", "-F", "/tmp/my dir/cfg", "-o", "ProxyJump=a b", "x y", NULL};
  for (int i = 0; want[i]; i++) T_CHECKF(w[i] && strcmp(w[i], want[i]) == 0, "word %d", i);
  T_CHECK(w[6] == NULL);
  launch_argv_free(w);
  T_CHECK(launch_split_words("ssh -F 'x", why, sizeof why) == NULL &&
          strstr(why, "--ssh 'ssh -F 'x' has an unclosed single quote"));
  T_CHECK(launch_split_words("ssh \"x", why, sizeof why) == NULL &&
          strstr(why, "unclosed double quote"));
  T_CHECK(launch_split_words("   ", why, sizeof why) == NULL &&
          strstr(why, "--ssh needs a command"));
  char* words[] = {"ssh", "-p", "2222", NULL};
  char** av = launch_ssh_argv(words, 7.4, "user@h1", "echo 'hi'");
  T_REQUIRE(av != NULL);
  const char* wa[] = {"ssh",     "-p",
                      "2222",    "-T",
                      "-o",      "BatchMode=yes",
                      "-o",      "ConnectTimeout=7",
                      "-o",      "ServerAliveInterval=5",
                      "-o",      "ServerAliveCountMax=3",
                      "user@h1", "sh -c 'echo '\\''hi'\\'''",
                      NULL};
  for (int i = 0; wa[i]; i++)
    T_CHECKF(av[i] && strcmp(av[i], wa[i]) == 0, "ssh word %d: '%s', expected '%s'", i,
             av[i] ? av[i] : "(none)", wa[i]);
  T_CHECK(av[14] == NULL);
  launch_argv_free(av);
  printf("quoting and ssh words: OK\n");
}

static void test_script(void) {
  char dir[] = "/tmp/mlxdist_remote_XXXXXX";
  T_REQUIRE(mkdtemp(dir) != NULL);
  char* prog[] = {"sh", "-c",
                  "echo \"r=$MLX_RANK w=$MLX_WORLD_SIZE t=$MLXDIST_JOB_TOKEN "
                  "rdv=$MLXDIST_RENDEZVOUS a=$MLXDIST_RING_ADDR pr=$MLXDIST_PORT_RANGE "
                  "v=$MLX_RING_VERBOSE f=$FOO hf=${MLX_HOSTFILE:-none} d=$(pwd)\"; "
                  "cat \"$MLXDIST_SECRET_FILE\"; ls -l \"$MLXDIST_SECRET_FILE\" | cut -c1-10; "
                  "read x && echo \"stdin: $x\"; exit 3",
                  NULL};
  const char* envs[] = {"FOO=it's $x"};
  launch_remote r = {.rank = 5,
                     .world = 6,
                     .host = "h2",
                     .cwd = dir,
                     .rendezvous = "10.0.0.1:4000",
                     .ring_addr = "10.0.0.2",
                     .port_range = "5000-5100",
                     .envs = envs,
                     .n_envs = 1,
                     .verbose = true,
                     .secret = true,
                     .grace = 1,
                     .program = prog};
  char* script = launch_remote_script(&r);
  T_REQUIRE(script != NULL);
  T_CHECK(strstr(script, "0123456789abcdef") == NULL);
  char* av[] = {"sh", "-c", script, NULL};
  char out[4096];
  double took;
  setenv("MLX_HOSTFILE", "/stale", 1);
  int st = run_sh(av, "0123456789abcdef0123456789abcdef\nsecretsecret\nnot for the program\n", -1,
                  out, sizeof out, &took);
  unsetenv("MLX_HOSTFILE");
  char want[600];
  snprintf(want, sizeof want,
           "r=5 w=6 t=0123456789abcdef0123456789abcdef rdv=10.0.0.1:4000 a=10.0.0.2 pr=5000-5100 "
           "v=1 f=it's $x hf=none d=%s\nsecretsecret\n-rw-------\n",
           dir);
  T_CHECKF(strcmp(out, want) == 0, "the script printed:\n%s\nexpected:\n%s", out, want);
  T_CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 3, "status %d", st);
  free(script);
  /* the end of stdin stops the program: SIGTERM, status 128+15 */
  char* sleeper[] = {"sleep", "30", NULL};
  launch_remote s = {.rank = 0,
                     .world = 1,
                     .host = "h",
                     .cwd = "/",
                     .rendezvous = "x:1",
                     .grace = 1,
                     .program = sleeper};
  script = launch_remote_script(&s);
  av[2] = script;
  st = run_sh(av, "0123456789abcdef0123456789abcdef\n", 0.3, out, sizeof out, &took);
  T_CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 143 && took < 3, "status %d after %.2f s", st, took);
  free(script);
  /* a program that ignores SIGTERM gets SIGKILL after the grace: 128+9 */
  char* stubborn[] = {"sh", "-c", "trap '' TERM; sleep 30 & wait", NULL};
  s.program = stubborn;
  script = launch_remote_script(&s);
  av[2] = script;
  st = run_sh(av, "0123456789abcdef0123456789abcdef\n", 0.3, out, sizeof out, &took);
  T_CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 137 && took > 1.0 && took < 4,
           "status %d after %.2f s", st, took);
  free(script);
  /* no token: refused */
  s.program = sleeper;
  script = launch_remote_script(&s);
  av[2] = script;
  st = run_sh(av, "", 0, out, sizeof out, &took);
  T_CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 125, "status %d", st);
  free(script);
  /* a missing directory */
  s.cwd = "/nonexistent/dir";
  script = launch_remote_script(&s);
  av[2] = script;
  st = run_sh(av, "0123456789abcdef0123456789abcdef\n", -1, out, sizeof out, &took);
  T_CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 126, "status %d", st);
  free(script);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  T_ASSERT(system(cmd) == 0);
  printf("the remote script: OK\n");
}

static void expect_argv(char** av, const char* const* want) {
  T_REQUIREF(av != NULL, "%s", why);
  int i = 0;
  for (; want[i]; i++)
    T_CHECKF(av[i] && strcmp(av[i], want[i]) == 0, "mpirun word %d: '%s', expected '%s'", i,
             av[i] ? av[i] : "(end)", want[i]);
  T_CHECKF(av[i] == NULL, "mpirun has more words: '%s'", av[i]);
  launch_mpi_argv_free(av);
}

static void test_mpi(void) {
  char* prog[] = {"./app", "--x", NULL};
  const char* envs[] = {"K=V"};
  launch_opts o = {.n = 2,
                   .program = prog,
                   .envs = envs,
                   .n_envs = 1,
                   .connect_timeout = 10,
                   .ssh = "ssh -F /tmp/cfg"};
  launch_hosts hs;
  T_REQUIRE(file("{\"envs\": [\"H=1\"], \"hosts\": [{\"ssh\": \"u@h1\"}, {\"ssh\": \"h2\"}]}", 2,
                 &hs) == 0);
  expect_argv(launch_mpi_build(&o, &hs, LAUNCH_MPI_OPENMPI, false, why, sizeof why),
              (const char* const[]){"mpirun", "-np", "4", "-H", "h1:2,h2:2", "--mca",
                                    "plm_rsh_agent",
                                    "ssh -F /tmp/cfg -o BatchMode=yes -o ConnectTimeout=10",
                                    "--tag-output", "-x", "H=1", "-x", "K=V", "./app", "--x",
                                    NULL});
  expect_argv(launch_mpi_build(&o, &hs, LAUNCH_MPI_OPENMPI, true, why, sizeof why),
              (const char* const[]){"mpirun", "-np", "4", "-H", "h1:2,h2:2", "--mca",
                                    "plm_rsh_agent",
                                    "ssh -F /tmp/cfg -o BatchMode=yes -o ConnectTimeout=10",
                                    "--allow-run-as-root", "--tag-output", "-x", "H=1", "-x", "K=V",
                                    "./app", "--x", NULL});
  T_CHECK(launch_mpi_build(&o, &hs, LAUNCH_MPI_MPICH, false, why, sizeof why) == NULL &&
          strstr(why, "MPICH's mpirun takes an ssh program without options"));
  o.ssh = "/usr/local/bin/myssh";
  expect_argv(launch_mpi_build(&o, &hs, LAUNCH_MPI_MPICH, false, why, sizeof why),
              (const char* const[]){"mpirun", "-np", "4", "-hosts", "h1:2,h2:2", "-launcher", "ssh",
                                    "-launcher-exec", "/usr/local/bin/myssh", "-prepend-rank",
                                    "-genv", "H", "1", "-genv", "K", "V", "./app", "--x", NULL});
  o.ssh = NULL;
  expect_argv(launch_mpi_build(&o, &hs, LAUNCH_MPI_MPICH, false, why, sizeof why),
              (const char* const[]){"mpirun", "-np", "4", "-hosts", "h1:2,h2:2", "-launcher", "ssh",
                                    "-prepend-rank", "-genv", "H", "1", "-genv", "K", "V", "./app",
                                    "--x", NULL});
  launch_hosts_free(&hs);
  /* on this host only: today's command line */
  expect_argv(launch_mpi_build(&o, NULL, LAUNCH_MPI_OPENMPI, false, why, sizeof why),
              (const char* const[]){"mpirun", "-np", "2", "--oversubscribe", "--tag-output", "-x",
                                    "K=V", "./app", "--x", NULL});
  printf("mpirun across hosts: OK\n");
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  test_list();
  test_json();
  test_text();
  test_quote_and_words();
  test_script();
  test_mpi();
  return t_exit_status();
}

/* mlxdist-launch with real processes: output prefixes, the ring environment
 * and hostfile, exit status propagation, timeouts, signal forwarding and
 * argument errors.
 *
 * Usage: test_launch PATH_TO_MLXDIST_LAUNCH
 * The same program is also the rank of some launches ("--rank-check"). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mlx/c/distributed.h"
#include "mlx/c/distributed_group.h"
#include "testutil.h"

static const char* launcher;
static char self_exe[PATH_MAX];

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------------- */
/* rank mode: validate the environment the launcher gave this rank        */

static int rank_check(int want_size, int want_conns) {
  int rank = t_env_int("MLX_RANK", -1);
  int size = t_env_int("MLX_WORLD_SIZE", -1);
  const char* path = getenv("MLX_HOSTFILE");
  if (rank < 0 || rank >= want_size) T_FAIL("MLX_RANK=%d, expected 0..%d", rank, want_size - 1);
  T_EQ_INT(size, want_size);
  T_ASSERT(path != NULL && path[0] != '\0');
  FILE* f = fopen(path, "r");
  if (!f) T_FAIL("cannot open MLX_HOSTFILE '%s'", path);
  static char text[65536];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  cJSON* root = cJSON_Parse(text);
  if (!root) T_FAIL("hostfile is not valid JSON: %s", text);
  T_ASSERT(cJSON_IsArray(root));
  T_EQ_INT(cJSON_GetArraySize(root), want_size);
  int ports[4096];
  int np = 0;
  const cJSON* list;
  cJSON_ArrayForEach(list, root) {
    T_ASSERT(cJSON_IsArray(list));
    T_EQ_INT(cJSON_GetArraySize(list), want_conns);
    const cJSON* s;
    cJSON_ArrayForEach(s, list) {
      const char* a = cJSON_GetStringValue(s);
      T_ASSERT(a != NULL);
      int port = -1;
      char tail = 0;
      if (sscanf(a, "127.0.0.1:%d%c", &port, &tail) != 1)
        T_FAIL("hostfile entry '%s' is not 127.0.0.1:port", a);
      T_ASSERT(port > 0 && port < 65536);
      for (int i = 0; i < np; i++)
        if (ports[i] == port) T_FAIL("port %d appears twice in the hostfile", port);
      ports[np++] = port;
    }
  }
  cJSON_Delete(root);
  const char* foo = getenv("LAUNCH_TEST_FOO");
  const char* verbose = getenv("MLX_RING_VERBOSE");
  printf("rank %d ok foo=%s verbose=%s file=%s\n", rank, foo ? foo : "(unset)",
         verbose ? verbose : "(unset)", path);
  return 0;
}

/* How many children process pid has (/proc/PID/task/PID/children). */
static int children_of(long pid) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "/proc/%ld/task/%ld/children", pid, pid);
  FILE* f = fopen(path, "r");
  if (!f) T_FAIL("cannot open %s", path);
  int kids = 0;
  long child;
  while (fscanf(f, "%ld", &child) == 1) kids++;
  fclose(f);
  return kids;
}

/* The all-gather of gate_check's init: how many children the launcher has when the backend
 * starts its bootstrap (its first exchange), into *payload; then it fails the init. */
static int count_at_bootstrap(void* dst, const void* src, size_t n_bytes, int rank, int size,
                              void* payload) {
  (void)dst, (void)src, (void)n_bytes, (void)rank, (void)size;
  *(int*)payload = children_of((long)getppid());
  return 1;
}

/* rank mode (--gate-check N DIR): how many children the launcher has when this rank's init
 * begins its bootstrap (every rank's process exists by then: init waits for the launcher's
 * gate, opened once all are started, before any backend starts; the bootstrap is the caller's
 * all-gather here, which counts and fails the init), then wait (bounded) until all N ranks
 * have looked, so that none is reaped before the last one counts. */
static int gate_check(int n, const char* dir) {
  int rank = t_env_int("MLX_RANK", -1);
  int at_start = children_of((long)getppid()); /* anything from 1 to n: not asserted */
  int kids = -1;
  t_capture_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init_with_all_gather(&g, true, "ring", count_at_bootstrap, &kids, NULL) == 0)
    T_FAIL("rank %d: init succeeded, its all-gather failing", rank);
  if (kids < 0) T_FAIL("rank %d: init failed before its all-gather: %s", rank, t_last_error());
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%d", dir, rank);
  FILE* mark = fopen(path, "w");
  T_ASSERT(mark != NULL);
  fclose(mark);
  double t0 = now_s();
  for (int seen = 0; seen < n && now_s() - t0 < 20.0;) {
    seen = 0;
    for (int r = 0; r < n; r++) {
      snprintf(path, sizeof path, "%s/%d", dir, r);
      seen += access(path, F_OK) == 0;
    }
    if (seen < n) usleep(10000);
  }
  const char* dump = getenv("MLXDIST_DUMP_SIGNAL");
  printf("rank %d saw %d dump=%s\n", rank, kids, dump ? dump : "(unset)");
  fprintf(stderr, "rank %d: %d of %d at its start\n", rank, at_start, n);
  return 0;
}

/* rank mode (--gate-init [DIR]): init (ring, strict); on success the mark DIR/MLX_RANK (the
 * job ran) and exit 0, else exit 3 with init's message on stderr. */
static int gate_init(const char* dir) {
  t_capture_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) {
    fprintf(stderr, "%s\n", t_last_error());
    return 3;
  }
  if (dir) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%d", dir, t_env_int("MLX_RANK", -1));
    FILE* mark = fopen(path, "w");
    if (mark) fclose(mark);
  }
  mlx_distributed_group_free(g);
  return 0;
}

/* ---------------------------------------------------------------------- */
/* running the launcher                                                    */

typedef struct result {
  int status; /* exit code, or 128+signal */
  double seconds;
  char out[65536];
  char err[65536];
} result;

static result R;

/* Run argv (argv[0] == launcher) with optional "K=V" env additions; bounded to 30 s. */
static void run(const char* const* argv, const char* env_kv) {
  memset(&R, 0, sizeof R);
  int po[2], pe[2];
  T_ASSERT(pipe(po) == 0 && pipe(pe) == 0);
  double t0 = now_s();
  pid_t pid = fork();
  T_ASSERT(pid >= 0);
  if (pid == 0) {
    dup2(po[1], 1);
    dup2(pe[1], 2);
    close(po[0]);
    close(pe[0]);
    if (env_kv) putenv((char*)env_kv);
    execv(argv[0], (char* const*)argv);
    _exit(99);
  }
  close(po[1]);
  close(pe[1]);
  size_t no = 0, ne = 0;
  int fds[2] = {po[0], pe[0]};
  bool open_[2] = {true, true};
  while (open_[0] || open_[1]) {
    struct pollfd p[2];
    int k = 0, map[2];
    for (int i = 0; i < 2; i++)
      if (open_[i]) {
        p[k] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        map[k++] = i;
      }
    int left = (int)((t0 + 30.0 - now_s()) * 1000);
    if (left <= 0) {
      kill(pid, SIGKILL);
      T_FAIL("the launcher did not finish within 30 s (argv[1]=%s)", argv[1]);
    }
    int pr = poll(p, (nfds_t)k, left);
    if (pr < 0 && errno == EINTR) continue;
    for (int j = 0; j < k; j++) {
      if (!p[j].revents) continue;
      int i = map[j];
      char* buf = i == 0 ? R.out : R.err;
      size_t* len = i == 0 ? &no : &ne;
      char tmp[4096];
      ssize_t got = read(fds[i], tmp, sizeof tmp);
      if (got <= 0) {
        open_[i] = false;
        close(fds[i]);
        continue;
      }
      size_t room = sizeof R.out - 1 - *len;
      size_t c = (size_t)got < room ? (size_t)got : room;
      memcpy(buf + *len, tmp, c);
      *len += c;
      buf[*len] = '\0';
    }
  }
  int st;
  T_ASSERT(waitpid(pid, &st, 0) == pid);
  R.seconds = now_s() - t0;
  R.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int count_lines(const char* text) {
  int n = 0;
  for (const char* p = text; *p; p++) n += *p == '\n';
  return n;
}

/* Is `line` (without newline) a whole line of text? */
static bool has_line(const char* text, const char* line) {
  size_t n = strlen(line);
  for (const char* p = text; (p = strstr(p, line)) != NULL; p++)
    if ((p == text || p[-1] == '\n') && p[n] == '\n') return true;
  return false;
}

#define ARGV(...) ((const char* const[]){launcher, __VA_ARGS__, NULL})

/* ---------------------------------------------------------------------- */

static void test_prefixes(void) {
  run(ARGV("-n", "3", "--", "/bin/sh", "-c",
           "echo out$MLX_RANK; echo err$MLX_RANK >&2; echo two$MLX_RANK; printf tail$MLX_RANK"),
      NULL);
  T_EQ_INT(R.status, 0);
  for (int r = 0; r < 3; r++) {
    char want[64];
    snprintf(want, sizeof want, "[%d] out%d", r, r);
    if (!has_line(R.out, want)) T_FAIL("stdout lacks '%s':\n%s", want, R.out);
    snprintf(want, sizeof want, "[%d] two%d", r, r);
    if (!has_line(R.out, want)) T_FAIL("stdout lacks '%s':\n%s", want, R.out);
    snprintf(want, sizeof want, "[%d] tail%d", r, r); /* partial last line, flushed */
    if (!has_line(R.out, want)) T_FAIL("stdout lacks '%s':\n%s", want, R.out);
    snprintf(want, sizeof want, "[%d] err%d", r, r);
    if (!has_line(R.err, want)) T_FAIL("stderr lacks '%s':\n%s", want, R.err);
  }
  T_EQ_INT(count_lines(R.out), 9);
  T_ASSERT(strstr(R.out, "err") == NULL);
  T_ASSERT(strstr(R.err, "out") == NULL);
  /* a rank's order of lines is kept */
  T_ASSERT(strstr(R.out, "[1] out1") < strstr(R.out, "[1] two1"));
}

static void test_long_output(void) {
  /* many lines from every rank: none lost, none interleaved inside a line */
  run(ARGV("-n", "2", "--", "/bin/sh", "-c",
           "i=0; while [ $i -lt 500 ]; do echo line-$MLX_RANK-$i-abcdefghijklmnop; i=$((i+1)); "
           "done"),
      NULL);
  T_EQ_INT(R.status, 0);
  T_EQ_INT(count_lines(R.out), 1000);
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 500; i += 37) {
      char want[96];
      snprintf(want, sizeof want, "[%d] line-%d-%d-abcdefghijklmnop", r, r, i);
      if (!has_line(R.out, want)) T_FAIL("stdout lacks '%s'", want);
    }
}

static void check_rank_lines(int n, const char* foo, const char* verbose, char* file_out) {
  for (int r = 0; r < n; r++) {
    char want[128];
    snprintf(want, sizeof want, "[%d] rank %d ok foo=%s verbose=%s file=", r, r, foo, verbose);
    const char* p = strstr(R.out, want);
    if (!p) T_FAIL("stdout lacks '%s':\n%s\nstderr:\n%s", want, R.out, R.err);
    if (file_out) {
      p += strlen(want);
      size_t len = strcspn(p, "\n");
      T_ASSERT(len < PATH_MAX);
      memcpy(file_out, p, len);
      file_out[len] = '\0';
    }
  }
}

static void test_ring_env(void) {
  char file[PATH_MAX];
  run(ARGV("-n", "3", "--connections", "2", "--env", "LAUNCH_TEST_FOO=a=b", "--", self_exe,
           "--rank-check", "3", "2"),
      NULL);
  if (R.status != 0) T_FAIL("status %d, stderr:\n%s", R.status, R.err);
  check_rank_lines(3, "a=b", "(unset)", file);
  /* the generated hostfile and its directory are gone after the run */
  T_ASSERT(access(file, F_OK) != 0);
  char* slash = strrchr(file, '/');
  T_ASSERT(slash != NULL);
  *slash = '\0';
  T_ASSERT(access(file, F_OK) != 0);

  run(ARGV("-n", "2", "--verbose", "--", self_exe, "--rank-check", "2", "1"), NULL);
  if (R.status != 0) T_FAIL("status %d, stderr:\n%s", R.status, R.err);
  check_rank_lines(2, "(unset)", "1", NULL);

  /* a single rank works too */
  run(ARGV("-n", "1", "--", self_exe, "--rank-check", "1", "1"), NULL);
  T_EQ_INT(R.status, 0);
  check_rank_lines(1, "(unset)", "(unset)", NULL);
}

static void test_given_hostfile(void) {
  char path[] = "/tmp/test_launch_hostfile_XXXXXX";
  int fd = mkstemp(path);
  T_ASSERT(fd >= 0);
  const char* text =
      "[[\"127.0.0.1:40001\", \"127.0.0.1:40002\"],\n"
      " [\"127.0.0.1:40003\", \"127.0.0.1:40004\"]]\n";
  T_ASSERT(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  close(fd);
  run(ARGV("--hostfile", path, "--", self_exe, "--rank-check", "2", "2"), NULL);
  if (R.status != 0) T_FAIL("status %d, stderr:\n%s", R.status, R.err);
  char file[PATH_MAX];
  check_rank_lines(2, "(unset)", "(unset)", file);
  T_ASSERT(strcmp(file, path) == 0);
  T_ASSERT(access(path, F_OK) == 0); /* a user's hostfile is not removed */

  /* -n must agree with the file */
  run(ARGV("-n", "3", "--hostfile", path, "--", "/bin/true"), NULL);
  T_EQ_INT(R.status, 2);
  T_ASSERT(strstr(R.err, "-n 3") && strstr(R.err, path));

  /* invalid JSON is named */
  FILE* f = fopen(path, "w");
  T_ASSERT(f != NULL);
  fputs("[[\"127.0.0.1:1\"", f);
  fclose(f);
  run(ARGV("--hostfile", path, "--", "/bin/true"), NULL);
  T_EQ_INT(R.status, 2);
  T_ASSERT(strstr(R.err, "JSON") && strstr(R.err, path));

  /* what the ranks' parser refuses is refused before any rank starts, for its reason */
  f = fopen(path, "w");
  T_ASSERT(f != NULL);
  fputs("[[\"127.0.0.1:40001\"], [\"127.0.0.1:port\"]]", f);
  fclose(f);
  run(ARGV("--hostfile", path, "--", "/bin/sh", "-c", "echo started"), NULL);
  T_EQ_INT(R.status, 2);
  T_ASSERT(strstr(R.err, "rank 1") && strstr(R.err, "invalid port") && strstr(R.err, path));
  T_ASSERT(strstr(R.out, "started") == NULL);

  /* --connections must agree with the file */
  f = fopen(path, "w");
  T_ASSERT(f != NULL);
  fputs("[[\"127.0.0.1:40001\"], [\"127.0.0.1:40002\"]]", f);
  fclose(f);
  run(ARGV("--connections", "2", "--hostfile", path, "--", "/bin/true"), NULL);
  T_EQ_INT(R.status, 2);
  T_ASSERT(strstr(R.err, "--connections is 2") && strstr(R.err, path));
  unlink(path);
}

static void test_exit_status(void) {
  /* rank 2 exits 3 while the others (rank 0 included) sleep: exit 3, promptly */
  run(ARGV("-n", "3", "--", "/bin/sh", "-c",
           "if [ \"$MLX_RANK\" = 2 ]; then sleep 0.2; exit 3; fi; sleep 30"),
      NULL);
  T_EQ_INT(R.status, 3);
  if (R.seconds > 5.0) T_FAIL("took %.1f s to stop the sleeping ranks", R.seconds);
  T_ASSERT(strstr(R.err, "rank 2") && strstr(R.err, "status 3"));

  /* a rank killed by a signal: 128 + signal */
  run(ARGV("-n", "2", "--", "/bin/sh", "-c",
           "if [ \"$MLX_RANK\" = 1 ]; then kill -KILL $$; fi; sleep 30"),
      NULL);
  T_EQ_INT(R.status, 128 + SIGKILL);
  if (R.seconds > 5.0) T_FAIL("took %.1f s", R.seconds);

  /* a rank that ignores SIGTERM is killed after the grace period */
  run(ARGV("-n", "2", "--", "/bin/sh", "-c",
           "trap '' TERM; if [ \"$MLX_RANK\" = 1 ]; then sleep 0.2; exit 4; fi; "
           "while :; do sleep 0.1; done"),
      NULL);
  T_EQ_INT(R.status, 4);
  if (R.seconds > 10.0) T_FAIL("took %.1f s", R.seconds);

  /* all ranks succeed: 0; a missing program: 127 */
  run(ARGV("-n", "4", "--", "/bin/true"), NULL);
  T_EQ_INT(R.status, 0);
  run(ARGV("-n", "2", "--", "/nonexistent/program"), NULL);
  T_EQ_INT(R.status, 127);
  T_ASSERT(strstr(R.err, "/nonexistent/program") != NULL);
  T_ASSERT(strstr(R.err, "rank 0: cannot run '/nonexistent/program'") != NULL);
  /* a program that is not executable: 126, said by the rank that tried */
  run(ARGV("-n", "2", "--", "/dev/null"), NULL);
  T_EQ_INT(R.status, 126);
  T_ASSERT(strstr(R.err, "cannot run '/dev/null'") != NULL);
}

/* Every rank is started before any begins its init's bootstrap (init waits for the launcher's
 * gate), each gets its own MLX_RANK over the caller's, and MLXDIST_DUMP_SIGNAL=1 unless the caller set it. */
static void test_gate(void) {
  enum { N = 16 };
  char dir[] = "/tmp/test_launch_gate.XXXXXX";
  T_ASSERT(mkdtemp(dir) != NULL);
  char n_arg[16];
  snprintf(n_arg, sizeof n_arg, "%d", N);
  run(ARGV("-n", n_arg, "--", self_exe, "--gate-check", n_arg, dir), "MLX_RANK=99");
  T_EQ_INT(R.status, 0);
  for (int r = 0; r < N; r++) {
    char line[64], path[PATH_MAX];
    snprintf(line, sizeof line, "[%d] rank %d saw %d dump=1", r, r, N);
    if (!has_line(R.out, line)) T_FAIL("no line '%s' in:\n%s%s", line, R.out, R.err);
    snprintf(path, sizeof path, "%s/%d", dir, r);
    unlink(path);
  }
  run(ARGV("-n", "2", "--", self_exe, "--gate-check", "2", dir), "MLXDIST_DUMP_SIGNAL=0");
  T_EQ_INT(R.status, 0);
  T_ASSERT(has_line(R.out, "[1] rank 1 saw 2 dump=0"));
  for (int r = 0; r < 2; r++) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%d", dir, r);
    unlink(path);
  }
  rmdir(dir);
}

/* A stand-in launcher, a real process: it starts 2 ranks of --gate-init with its gate (as
 * mlxdist-launch does), then dies without opening it (dies), or lives on without opening it
 * (the ranks' bound: 4 x MLXDIST_CONNECT_TIMEOUT 0.25 = 1 s). Both ranks' init must fail with
 * a message containing want, in a bounded time. */
static void gate_stand_in(bool dies, const char* want) {
  int pe[2];
  T_ASSERT(pipe(pe) == 0);
  double t0 = now_s();
  pid_t mid = fork();
  T_ASSERT(mid >= 0);
  if (mid == 0) {
    int g[2];
    struct stat sb;
    if (pipe2(g, 0) != 0 || fcntl(g[1], F_SETFD, FD_CLOEXEC) != 0 || fstat(g[0], &sb) != 0)
      _exit(90);
    static char kv[64];
    snprintf(kv, sizeof kv, "MLXDIST_LAUNCH_GATE=%d:%llu", g[0], (unsigned long long)sb.st_ino);
    for (int r = 0; r < 2; r++) {
      if (fork() == 0) {
        dup2(pe[1], 2);
        close(pe[0]);
        close(pe[1]);
        static char rk[32];
        snprintf(rk, sizeof rk, "MLX_RANK=%d", r);
        putenv(kv);
        putenv(rk);
        putenv("MLX_WORLD_SIZE=2");
        putenv("MLXDIST_CONNECT_TIMEOUT=0.25");
        execl(self_exe, self_exe, "--gate-init", (char*)NULL);
        _exit(99);
      }
    }
    close(pe[1]);
    if (dies) _exit(0); /* its end of the gate closes with it */
    sleep(30);
    _exit(0);
  }
  close(pe[1]);
  char err[8192];
  size_t n = 0;
  while (n < sizeof err - 1) { /* until both ranks are gone (EOF), bounded */
    struct pollfd p = {.fd = pe[0], .events = POLLIN};
    int left = (int)((t0 + 20.0 - now_s()) * 1000);
    if (left <= 0) break;
    if (poll(&p, 1, left) < 0 && errno == EINTR) continue;
    ssize_t got = read(pe[0], err + n, sizeof err - 1 - n);
    if (got <= 0) break;
    n += (size_t)got;
  }
  err[n] = '\0';
  double took = now_s() - t0;
  close(pe[0]);
  kill(mid, SIGKILL);
  waitpid(mid, NULL, 0);
  int seen = 0;
  for (const char* q = err; (q = strstr(q, want)) != NULL; q++) seen++;
  if (seen != 2) T_FAIL("expected '%s' from both ranks, got:\n%s", want, err);
  if (took > 10.0) T_FAIL("the ranks took %.1f s", took);
  if (!dies && took < 0.9) T_FAIL("the ranks gave up after %.2f s, before their bound", took);
}

/* The gate as hostile input, and what a gate that never opens does to the ranks' init. */
static void test_gate_fails(void) {
  gate_stand_in(true,
                "mlxdist-launch closed its gate (MLXDIST_LAUNCH_GATE) without opening it: "
                "the launcher died or could not start every rank");
  gate_stand_in(false,
                "mlxdist-launch did not open its gate (MLXDIST_LAUNCH_GATE: every rank "
                "started) within 1 s (4 x MLXDIST_CONNECT_TIMEOUT)");

  const char* const gate_init_argv[] = {self_exe, "--gate-init", NULL};
  const char* bad[] = {"MLXDIST_LAUNCH_GATE=abc", "MLXDIST_LAUNCH_GATE=2:5",
                       "MLXDIST_LAUNCH_GATE=5:", "MLXDIST_LAUNCH_GATE=99999999999:1",
                       "MLXDIST_LAUNCH_GATE=5:1:2"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    run(gate_init_argv, bad[i]);
    T_EQ_INT(R.status, 3);
    char want[128];
    snprintf(want, sizeof want,
             "MLXDIST_LAUNCH_GATE='%s' is not a launcher's gate (expected "
             "FD:INODE",
             strchr(bad[i], '=') + 1);
    if (!strstr(R.err, want)) T_FAIL("no '%s' in:\n%s", want, R.err);
  }
  /* an fd that is not this process's gate: a warning, and init goes on (to fail here for
   * want of a configuration, not for the gate) */
  int devnull = open("/dev/null", O_RDONLY); /* inherited by the rank */
  int other[2];
  T_ASSERT(devnull >= 3 && pipe(other) == 0);
  struct {
    char kv[64];
    const char* why;
  } odd[3] = {{"MLXDIST_LAUNCH_GATE=900:1", "fd 900 is not open"},
              {"", "is not a pipe"},
              {"", "is another pipe"}};
  snprintf(odd[1].kv, sizeof odd[1].kv, "MLXDIST_LAUNCH_GATE=%d:1", devnull);
  snprintf(odd[2].kv, sizeof odd[2].kv, "MLXDIST_LAUNCH_GATE=%d:1", other[0]);
  for (int i = 0; i < 3; i++) {
    run(gate_init_argv, odd[i].kv);
    T_EQ_INT(R.status, 3);
    if (!strstr(R.err, odd[i].why) || !strstr(R.err, "so it is not the launcher's gate") ||
        strstr(R.err, "its gate (MLXDIST_LAUNCH_GATE)"))
      T_FAIL("%s: no warning '%s' (or a gate failure) in:\n%s", odd[i].kv, odd[i].why, R.err);
  }
  close(devnull);
  close(other[0]);
  close(other[1]);
}

/* A rank that cannot be started (rank 2: its ssh command is missing) stops the ranks already
 * started (0 and 1, on this host, waiting at the gate in their init) before any runs its job. */
static void test_spawn_fails_at_rank(void) {
  char dir[] = "/tmp/test_launch_spawn.XXXXXX";
  T_ASSERT(mkdtemp(dir) != NULL);
  run(ARGV("--ssh", "/nonexistent/ssh", "--hosts", "localhost,127.0.0.2", "-n", "2", "--", self_exe,
           "--gate-init", dir),
      NULL);
  T_EQ_INT(R.status, 255);
  if (!strstr(R.err, "rank 2: cannot run the ssh command '/nonexistent/ssh': No such file"))
    T_FAIL("no spawn failure named in:\n%s", R.err);
  for (int r = 0; r < 4; r++) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%d", dir, r);
    if (access(path, F_OK) == 0) T_FAIL("rank %d ran its job:\n%s", r, R.err);
  }
  rmdir(dir);
}

static void test_timeout(void) {
  run(ARGV("-n", "2", "--timeout", "1", "--", "/bin/sh", "-c", "sleep 30"), NULL);
  T_EQ_INT(R.status, 124);
  T_ASSERT(R.seconds >= 0.9 && R.seconds < 6.0);
  T_ASSERT(strstr(R.err, "timeout") != NULL);

  run(ARGV("-n", "2", "--", "/bin/sh", "-c", "sleep 30"), "MLXDIST_LAUNCH_TIMEOUT=0.5");
  T_EQ_INT(R.status, 124);
  T_ASSERT(R.seconds < 6.0);
  T_ASSERT(strstr(R.err, "MLXDIST_LAUNCH_TIMEOUT") != NULL);

  /* a run that finishes in time is not affected */
  run(ARGV("-n", "2", "--timeout", "20", "--", "/bin/true"), NULL);
  T_EQ_INT(R.status, 0);
}

static void test_sigint_forwarded(void) {
  int pe[2];
  T_ASSERT(pipe(pe) == 0);
  double t0 = now_s();
  pid_t pid = fork();
  T_ASSERT(pid >= 0);
  if (pid == 0) {
    dup2(pe[1], 2);
    close(pe[0]);
    execl(launcher, launcher, "-n", "2", "--", "/bin/sh", "-c", "echo started >&2; sleep 30",
          (char*)NULL);
    _exit(99);
  }
  close(pe[1]);
  /* wait until both ranks have started */
  char buf[4096];
  size_t n = 0;
  while (n < sizeof buf - 1) {
    ssize_t got = read(pe[0], buf + n, sizeof buf - 1 - n);
    if (got <= 0) break;
    n += (size_t)got;
    buf[n] = '\0';
    if (strstr(buf, "[0] started") && strstr(buf, "[1] started")) break;
    if (now_s() - t0 > 30) break; /* a slow start (a loaded machine) is not what is tested */
  }
  double t_int = now_s();
  kill(pid, SIGINT);
  int st;
  T_ASSERT(waitpid(pid, &st, 0) == pid);
  close(pe[0]);
  T_ASSERT(WIFEXITED(st));
  T_EQ_INT(WEXITSTATUS(st), 128 + SIGINT);
  /* the ranks' sleep 30 was cut short: the launcher forwarded the signal */
  T_ASSERT(now_s() - t_int < 10.0);
}

static void expect_usage_error(const char* const* argv, const char* must_contain) {
  run(argv, NULL);
  if (R.status != 2) T_FAIL("'%s': status %d, expected 2", argv[1], R.status);
  if (strncmp(R.err, "[launch] ", 9) != 0) T_FAIL("message lacks the [launch] tag: %s", R.err);
  if (!strstr(R.err, must_contain)) T_FAIL("message does not name '%s': %s", must_contain, R.err);
}

static void test_bad_arguments(void) {
  expect_usage_error(ARGV("-n", "0", "--", "/bin/true"), "'0'");
  expect_usage_error(ARGV("-n", "abc", "--", "/bin/true"), "'abc'");
  expect_usage_error(ARGV("-n"), "-n");
  expect_usage_error(ARGV("-n", "2", "--bogus", "--", "/bin/true"), "--bogus");
  expect_usage_error(ARGV("-n", "2", "--env", "NOEQUALS", "--", "/bin/true"), "NOEQUALS");
  expect_usage_error(ARGV("-n", "2", "--env", "1X=2", "--", "/bin/true"), "1X=2");
  expect_usage_error(ARGV("-n", "2", "--backend", "carrier-pigeon", "--", "/bin/true"),
                     "carrier-pigeon");
  expect_usage_error(ARGV("-n", "2", "--connections", "0", "--", "/bin/true"), "--connections");
  expect_usage_error(ARGV("-n", "2", "--timeout", "-1", "--", "/bin/true"), "--timeout");
  expect_usage_error(ARGV("-n", "2", "--"), "program");
  expect_usage_error(ARGV("--", "/bin/true"), "-n");
  expect_usage_error(ARGV("--hostfile", "/nonexistent/hosts.json", "--", "/bin/true"),
                     "/nonexistent/hosts.json");
  expect_usage_error(ARGV("-n", "2", "--backend", "mpi", "--connections", "2", "--", "/bin/true"),
                     "--connections");
  run(ARGV("-n", "2", "--", "/bin/true"), "MLXDIST_LAUNCH_TIMEOUT=soon");
  T_EQ_INT(R.status, 2);
  T_ASSERT(strstr(R.err, "MLXDIST_LAUNCH_TIMEOUT") && strstr(R.err, "soon"));
  run(ARGV("--help"), NULL);
  T_EQ_INT(R.status, 0);
  T_ASSERT(strstr(R.out, "Usage: mlxdist-launch") != NULL);
}

int main(int argc, char** argv) {
  if (argc == 4 && strcmp(argv[1], "--gate-check") == 0) return gate_check(atoi(argv[2]), argv[3]);
  if ((argc == 2 || argc == 3) && strcmp(argv[1], "--gate-init") == 0)
    return gate_init(argc == 3 ? argv[2] : NULL);
  if (argc == 4 && strcmp(argv[1], "--rank-check") == 0)
    return rank_check(atoi(argv[2]), atoi(argv[3]));
  if (argc != 2) {
    fprintf(stderr, "usage: %s PATH_TO_MLXDIST_LAUNCH\n", argv[0]);
    return 2;
  }
  launcher = argv[1];
  ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
  T_ASSERT(n > 0);
  self_exe[n] = '\0';
  signal(SIGPIPE, SIG_IGN);

  test_prefixes();
  test_long_output();
  test_ring_env();
  test_given_hostfile();
  test_exit_status();
  test_gate();
  test_gate_fails();
  test_spawn_fails_at_rank();
  test_timeout();
  test_sigint_forwarded();
  test_bad_arguments();
  printf("test_launch: all passed\n");
  return 0;
}

/* MLXDIST_* names mlxdist does not know (issue 27, item 3): a typo such as
 * MLXDIST_TIMEUOT=5 is told, once per process, with the nearest known name;
 * under MLXDIST_STRICT_ENV=1 it fails init; mlxdist-launch tells it once for
 * the whole job.
 *
 *   test_env_names names SRC    the matching (pure), and every MLXDIST_* name
 *                               in a string literal of SRC/src, SRC/tools and
 *                               SRC/examples is known (so no variable the
 *                               project itself reads is ever warned about)
 *   test_env_names ranks tcp|shm  two forked ranks with two unknown names and
 *                               known ones, three inits and a split each: one
 *                               warning line per name per process, all_sum right
 *   test_env_names strict       two ranks under MLXDIST_STRICT_ENV=1: init fails
 *                               naming the name (strict and not); with known
 *                               names only, the pair runs
 *   test_env_names launch L     mlxdist-launch (L) -n 2: the launcher warns once,
 *                               the ranks not at all; strict: exit 2, no rank
 *   test_env_names launched     (a rank started by the launch case) */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mlx/c/array.h"
#include "mlx/c/distributed.h"
#include "mlx/c/distributed_group.h"
#include "mlx/c/stream.h"
#include "ranks.h"
#include "testutil.h"
#include "util/env_names.h"
#include "util/text.h"

static char g_dir[256];

#define TIMEUOT_LINE                                                                        \
  "MLXDIST_TIMEUOT is not a variable mlxdist knows (did you mean MLXDIST_TIMEOUT?); it is " \
  "ignored"
#define NOPE_LINE "MLXDIST_NOPE_NOPE_NOPE is not a variable mlxdist knows (no close name)"

/* How often needle occurs in hay. */
static int count(const char* hay, const char* needle) {
  int n = 0;
  for (const char* p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
  return n;
}

static char* read_all(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) return strdup("");
  char* buf = malloc(1 << 20);
  T_ASSERT(buf != NULL);
  size_t n = fread(buf, 1, (1 << 20) - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static void write_text(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  T_ASSERT(f != NULL);
  fputs(text, f);
  fclose(f);
}

/* ---- names: the matching, and the names the project's own code uses ---- */

static void expect_closest(const char* name, const char* want) {
  const char* got = mlxd_env_name_closest(name, strlen(name));
  if (want ? !got || strcmp(got, want) != 0 : got != NULL)
    T_FAIL("closest to %s: got %s, expected %s", name, got ? got : "none", want ? want : "none");
}

/* Every MLXDIST_X name inside a string literal of path (comments, character
 * constants and #error/#include lines skipped) must be known. Returns how
 * many names it checked. */
static int scan_file(const char* path, int* unknown) {
  char* t = read_all(path);
  int checked = 0;
  size_t n = strlen(t);
  bool line_start = true, skip_line = false;
  for (size_t i = 0; i < n; i++) {
    char c = t[i];
    if (c == '\n') {
      if (!(i > 0 && t[i - 1] == '\\')) skip_line = false;
      line_start = true;
      continue;
    }
    if (line_start && (c == ' ' || c == '\t')) continue;
    if (line_start && c == '#') {
      size_t j = i + 1;
      while (t[j] == ' ') j++;
      skip_line = strncmp(t + j, "error", 5) == 0 || strncmp(t + j, "include", 7) == 0 ||
                  strncmp(t + j, "warning", 7) == 0;
    }
    line_start = false;
    if (c == '/' && t[i + 1] == '/') {
      while (i < n && t[i] != '\n') i++;
      i--;
      continue;
    }
    if (c == '/' && t[i + 1] == '*') {
      char* end = strstr(t + i + 2, "*/");
      i = end ? (size_t)(end - t) + 1 : n;
      continue;
    }
    if (c == '\'') {
      for (i++; i < n && t[i] != '\''; i++)
        if (t[i] == '\\') i++;
      continue;
    }
    if (c != '"') continue;
    size_t start = ++i;
    for (; i < n && t[i] != '"' && t[i] != '\n'; i++)
      if (t[i] == '\\') i++;
    if (skip_line) continue;
    for (size_t k = start; k + 9 <= i; k++) {
      if (strncmp(t + k, "MLXDIST_", 8) != 0) continue;
      if (k > start && (t[k - 1] == '_' || (t[k - 1] >= 'A' && t[k - 1] <= 'Z'))) continue;
      size_t e = k + 8;
      while (e < i && ((t[e] >= 'A' && t[e] <= 'Z') || (t[e] >= '0' && t[e] <= '9') || t[e] == '_'))
        e++;
      if (e == k + 8 || t[e - 1] == '_') continue; /* "MLXDIST_", "MLXDIST_TEST_": a prefix */
      checked++;
      if (!mlxd_env_name_known(t + k, e - k)) {
        printf("  %s: \"%.*s\" is not a known MLXDIST_* name\n", path, (int)(e - k), t + k);
        (*unknown)++;
      }
      k = e;
    }
  }
  free(t);
  return checked;
}

static int scan_dir(const char* dir, int* unknown) {
  DIR* d = opendir(dir);
  if (!d) return 0;
  int checked = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (stat(p, &sb) != 0) continue;
    size_t l = strlen(e->d_name);
    if (S_ISDIR(sb.st_mode))
      checked += scan_dir(p, unknown);
    else if (l > 2 && e->d_name[l - 2] == '.' &&
             (e->d_name[l - 1] == 'c' || e->d_name[l - 1] == 'h'))
      checked += scan_file(p, unknown);
  }
  closedir(d);
  return checked;
}

static void names_tests(const char* src) {
  /* known: every tunable, the scripts', examples' and tests' own */
  T_ASSERT(mlxd_env_name_known("MLXDIST_TIMEOUT", 15));
  T_ASSERT(mlxd_env_name_known("MLXDIST_STRICT_ENV", 18));
  T_ASSERT(mlxd_env_name_known("MLXDIST_ENV_REPORTED", 20));
  T_ASSERT(mlxd_env_name_known("MLXDIST_FUZZ_SECONDS", 20));
  T_ASSERT(mlxd_env_name_known("MLXDIST_TEST_VERBOSE", 20));
  T_ASSERT(!mlxd_env_name_known("MLXDIST_TEST_", 13));
  T_ASSERT(!mlxd_env_name_known("MLXDIST_TIMEOUTX", 15 + 1));
  T_ASSERT(!mlxd_env_name_known("MLXDIST_TIMEOUT", 14)); /* a length is a length */
  /* the nearest tunable: swaps, missing, extra, wrong letters, case */
  expect_closest("MLXDIST_TIMEUOT", "MLXDIST_TIMEOUT");
  expect_closest("MLXDIST_TIMEOUTS", "MLXDIST_TIMEOUT");
  expect_closest("MLXDIST_timeout", "MLXDIST_TIMEOUT");
  expect_closest("MLXDIST_SPINUS", "MLXDIST_SPIN_US");
  expect_closest("MLXDIST_TRANSPROT", "MLXDIST_TRANSPORT");
  expect_closest("MLXDIST_OPTIMEOUT", "MLXDIST_OP_TIMEOUT");
  expect_closest("MLXDIST_CONECT_TIMEOUT", "MLXDIST_CONNECT_TIMEOUT");
  expect_closest("MLXDIST_SECRETFILE", "MLXDIST_SECRET_FILE");
  expect_closest("MLXDIST_STRICT", "MLXDIST_STRICT_ENV");
  expect_closest("MLXDIST_NOPE_NOPE_NOPE", NULL);
  expect_closest("MLXDIST_X", NULL);
  expect_closest("MLXDIST_", NULL);
  expect_closest("OTHER_TIMEOUT", NULL);
  char big[4096];
  memset(big, 'A', sizeof big - 1);
  memcpy(big, "MLXDIST_", 8);
  big[sizeof big - 1] = '\0';
  expect_closest(big, NULL); /* long: matched to nothing, quickly */
  /* the lines, the names, MLXDIST_ENV_REPORTED */
  char lines[1024], names[256];
  mlxd_text l = {lines, sizeof lines, 0}, nm = {names, sizeof names, 0};
  lines[0] = names[0] = '\0';
  const char* env[] = {"MLXDIST_TIMEUOT=5",  "PATH=/bin",
                       "MLXDIST_TIMEOUT=5",  "MLXDIST_NOPE_NOPE_NOPE=",
                       "MLXDIST_NOEQUALS",   "MLX_RANK=0",
                       "MLXDIST_TEST_ANY=1", NULL};
  unsetenv("MLXDIST_ENV_REPORTED");
  T_EQ_INT(mlxd_env_names_unknown(env, -1, true, &l, " | ", &nm), 2);
  T_ASSERT(strcmp(lines,
                  "MLXDIST_TIMEUOT is not a variable mlxdist knows (did you mean MLXDIST_TIMEOUT?) "
                  "| " NOPE_LINE) == 0);
  T_ASSERT(strcmp(names, "MLXDIST_TIMEUOT:MLXDIST_NOPE_NOPE_NOPE") == 0);
  T_EQ_INT(mlxd_env_names_unknown(env, 1, true, NULL, "", &nm), 0); /* in names already */
  setenv("MLXDIST_ENV_REPORTED", "MLXDIST_X:MLXDIST_TIMEUOT", 1);
  T_EQ_INT(mlxd_env_names_unknown(env, -1, true, NULL, "", NULL), 1);
  T_EQ_INT(mlxd_env_names_unknown(env, -1, false, NULL, "", NULL), 2);
  setenv("MLXDIST_ENV_REPORTED", "MLXDIST_TIMEUO", 1); /* a whole name, not a prefix */
  T_EQ_INT(mlxd_env_names_unknown(env, -1, true, NULL, "", NULL), 2);
  unsetenv("MLXDIST_ENV_REPORTED");
  /* a name's odd bytes are not printed as they are */
  const char* odd[] = {"MLXDIST_\x1b[2J=1", NULL};
  l = (mlxd_text){lines, sizeof lines, 0};
  lines[0] = '\0';
  T_EQ_INT(mlxd_env_names_unknown(odd, -1, false, &l, "", NULL), 1);
  T_ASSERT(strcmp(lines, "MLXDIST_\\x1b\\x5b2J is not a variable mlxdist knows (no close name)") ==
           0);
  /* the project's own names: every MLXDIST_* in a string literal is known */
  const char* const dirs[] = {"src", "tools", "examples"};
  int unknown = 0, checked = 0;
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", src, dirs[i]);
    checked += scan_dir(p, &unknown);
  }
  if (unknown) T_FAIL("%d MLXDIST_* names in src/, tools/ or examples/ are not known", unknown);
  T_ASSERT(checked > 100); /* the scan found them (about 400 today) */
  printf("names: OK (%d MLXDIST_* names in string literals checked)\n", checked);
}

/* ---- ranks: forked processes, each with its own stderr ---- */

typedef struct pair_arg {
  const char* hostfile;
  const char* transport;
  bool strict;
  bool typos;
} pair_arg;

static int all_sum_ok(mlx_distributed_group g) {
  int size = mlx_distributed_group_size(g), rank = mlx_distributed_group_rank(g);
  mlx_array x = mlx_array_new_int(rank + 1), y = mlx_array_new();
  int rc = mlx_distributed_all_sum(&y, x, g, mlx_stream_new());
  if (rc == 0) rc = mlx_array_eval(y);
  int got = 0;
  if (rc == 0) mlx_array_item_int32(&got, y);
  mlx_array_free(x);
  mlx_array_free(y);
  return rc == 0 && got == size * (size + 1) / 2 ? 0 : 1;
}

static int pair_rank(int rank, int size, const char* session, void* arg) {
  (void)session;
  const pair_arg* a = arg;
  char err[300];
  snprintf(err, sizeof err, "%s/rank%d.err", g_dir, rank);
  int fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  T_ASSERT(fd >= 0);
  dup2(fd, 2);
  close(fd);
  t_rank_env(rank, size, a->hostfile);
  setenv("MLXDIST_TRANSPORT", a->transport, 1);
  setenv("MLXDIST_TIMEOUT", "30", 1); /* known names: never warned about */
  setenv("MLXDIST_TEST_ANYTHING", "1", 1);
  setenv("MLXDIST_FUZZ_SECONDS", "1", 1);
  if (a->strict) setenv("MLXDIST_STRICT_ENV", "1", 1);
  if (a->typos) {
    setenv("MLXDIST_TIMEUOT", "5", 1);
    setenv("MLXDIST_NOPE_NOPE_NOPE", "", 1);
  }
  t_capture_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  if (a->strict && a->typos) {
    for (int strict = 1; strict >= 0; strict--) {
      T_ASSERT(mlx_distributed_init(&g, strict, "ring") != 0);
      const char* e = t_last_error();
      T_CHECKF(strstr(e, "[distributed] init: MLXDIST_") &&
                   strstr(e,
                          "MLXDIST_TIMEUOT is not a variable mlxdist knows (did you mean "
                          "MLXDIST_TIMEOUT?)") &&
                   strstr(e, NOPE_LINE) &&
                   strstr(e,
                          "MLXDIST_STRICT_ENV=1 makes an unknown MLXDIST_* name an error (fix or "
                          "unset the variables)"),
               "strict init: %s", e);
    }
    printf("rank %d: strict init refused: %s\n", rank, t_last_error());
    return 0;
  }
  if (mlx_distributed_init(&g, true, "ring") != 0) T_FAIL("init ring: %s", t_last_error());
  T_EQ_INT(mlx_distributed_group_size(g), size);
  T_EQ_INT(all_sum_ok(g), 0);
  /* more inits (a cached one, an unavailable backend, non-strict) and a split: no more lines */
  mlx_distributed_group g2 = mlx_distributed_group_new(), g3 = mlx_distributed_group_new(),
                        s = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init(&g2, true, "ring"), 0);
  T_EQ_INT(mlx_distributed_init(&g3, false, "jaccl"), 0);
  T_EQ_INT(mlx_distributed_group_size(g3), 1);
  T_EQ_INT(mlx_distributed_group_split(&s, g, 0, rank), 0);
  T_EQ_INT(all_sum_ok(s), 0);
  mlx_distributed_group_free(s);
  mlx_distributed_group_free(g3);
  mlx_distributed_group_free(g2);
  mlx_distributed_group_free(g);
  return 0;
}

static void write_pair_hostfile(char* path, size_t n) {
  snprintf(path, n, "%s/hostfile.json", g_dir);
  char text[200];
  snprintf(text, sizeof text, "[[\"127.0.0.1:%d\"], [\"127.0.0.1:%d\"]]\n", t_free_port(),
           t_free_port());
  write_text(path, text);
}

static void run_pair(pair_arg* a, const char* what) {
  char hf[300];
  write_pair_hostfile(hf, sizeof hf);
  a->hostfile = hf;
  t_ranks_opts opts = {.timeout_s = 90, .what = what};
  int bad = t_run_ranks(2, pair_rank, a, &opts, NULL);
  if (bad) {
    for (int r = 0; r < 2; r++) {
      char p[300];
      snprintf(p, sizeof p, "%s/rank%d.err", g_dir, r);
      char* e = read_all(p);
      printf("rank %d's stderr:\n%s\n", r, e);
      free(e);
    }
    T_FAIL("%s: %d rank(s) failed", what, bad);
  }
}

static void ranks_tests(const char* transport) {
  pair_arg a = {.transport = transport, .typos = true};
  run_pair(&a, "two unknown names");
  for (int r = 0; r < 2; r++) {
    char p[300];
    snprintf(p, sizeof p, "%s/rank%d.err", g_dir, r);
    char* e = read_all(p);
    T_CHECKF(count(e, "mlxdist: warning: " TIMEUOT_LINE "\n") == 1 &&
                 count(e, "mlxdist: warning: " NOPE_LINE "; it is ignored\n") == 1 &&
                 count(e, "is not a variable") == 2,
             "rank %d: expected one line per unknown name, got:\n%s", r, e);
    free(e);
  }
  a.typos = false;
  run_pair(&a, "known names only");
  for (int r = 0; r < 2; r++) {
    char p[300];
    snprintf(p, sizeof p, "%s/rank%d.err", g_dir, r);
    char* e = read_all(p);
    T_CHECKF(count(e, "is not a variable") == 0, "rank %d warned about a known name:\n%s", r, e);
    free(e);
  }
  printf("ranks (%s): OK (one warning line per unknown name and process; none for known names)\n",
         transport);
}

static void strict_tests(void) {
  pair_arg a = {.transport = "auto", .strict = true, .typos = true};
  run_pair(&a, "strict, unknown names");
  a.typos = false;
  run_pair(&a, "strict, known names only");
  printf("strict: OK\n");
}

/* ---- launch: mlxdist-launch tells the job's names once ---- */

static int g_launched_rank = -1;

static int launched(void) {
  t_capture_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) {
    printf("RANK INIT FAILED: %s\n", t_last_error());
    return 3;
  }
  g_launched_rank = mlx_distributed_group_rank(g);
  int rc = all_sum_ok(g);
  const char* rep = getenv("MLXDIST_ENV_REPORTED");
  printf("RANK OK %d rc=%d reported=%s\n", g_launched_rank, rc, rep ? rep : "(unset)");
  mlx_distributed_group_free(g);
  return rc;
}

/* Run cmd (stdout and stderr together) within its own bound; the output and the exit status. */
static char* run_cmd(const char* cmd, int* status) {
  char full[2048];
  snprintf(full, sizeof full, "timeout -k 5 120 %s 2>&1", cmd);
  FILE* p = popen(full, "r");
  T_ASSERT(p != NULL);
  char* out = malloc(1 << 20);
  T_ASSERT(out != NULL);
  size_t n = fread(out, 1, (1 << 20) - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

static void launch_tests(const char* launcher, const char* self) {
  char cmd[1500];
  int st;
  snprintf(cmd, sizeof cmd,
           "env MLXDIST_TIMEUOT=5 MLXDIST_TIMEOUT=30 %s -n 2 --env MLXDIST_NOPE_NOPE_NOPE=1 -- %s "
           "launched",
           launcher, self);
  char* out = run_cmd(cmd, &st);
  T_CHECKF(st == 0 && count(out, "RANK OK") == 2 && count(out, "rc=0") == 2 &&
               count(out, "is not a variable") == 2 &&
               count(out, "[launch] warning: " TIMEUOT_LINE
                          " (told here once, not by every rank)") == 1 &&
               count(out, "[launch] warning: " NOPE_LINE "; it is ignored") == 1 &&
               count(out, "reported=MLXDIST_TIMEUOT:MLXDIST_NOPE_NOPE_NOPE") == 2,
           "launch with two unknown names: exit %d, output:\n%s", st, out);
  free(out);
  /* a name the launcher did not see (set in a rank's own wrapper) is still told, by that rank */
  snprintf(cmd, sizeof cmd, "%s -n 2 -- env MLXDIST_TIMEUOT=5 %s launched", launcher, self);
  out = run_cmd(cmd, &st);
  T_CHECKF(st == 0 && count(out, "RANK OK") == 2 && count(out, TIMEUOT_LINE) == 2 &&
               count(out, "[launch] warning") == 0,
           "names set after the launcher: exit %d, output:\n%s", st, out);
  free(out);
  /* strict: the job does not start */
  for (int i = 0; i < 2; i++) {
    snprintf(cmd, sizeof cmd, "env MLXDIST_TIMEUOT=5 %s%s -n 2 %s-- %s launched",
             i == 0 ? "MLXDIST_STRICT_ENV=1 " : "", launcher,
             i == 1 ? "--env MLXDIST_STRICT_ENV=1 " : "", self);
    out = run_cmd(cmd, &st);
    T_CHECKF(
        st == 2 && count(out, "RANK") == 0 &&
            strstr(out,
                   "[launch] MLXDIST_TIMEUOT is not a variable mlxdist knows (did you mean "
                   "MLXDIST_TIMEOUT?); MLXDIST_STRICT_ENV=1 makes an unknown MLXDIST_* name an "
                   "error (fix or unset the variable)."),
        "strict launch (%s): exit %d, output:\n%s", i ? "--env" : "environment", st, out);
    free(out);
  }
  /* known names only: no warning anywhere */
  snprintf(cmd, sizeof cmd, "env MLXDIST_STRICT_ENV=1 MLXDIST_TIMEOUT=30 %s -n 2 -- %s launched",
           launcher, self);
  out = run_cmd(cmd, &st);
  T_CHECKF(st == 0 && count(out, "RANK OK") == 2 && count(out, "reported=(unset)") == 2 &&
               count(out, "warning") == 0,
           "launch with known names: exit %d, output:\n%s", st, out);
  free(out);
  printf("launch: OK (the launcher tells each name once; strict refuses to start)\n");
}

int main(int argc, char** argv) {
  T_ASSERT(argc >= 2);
  if (strcmp(argv[1], "launched") == 0) return launched();
  snprintf(g_dir, sizeof g_dir, "/tmp/mlxdist_env_names_XXXXXX");
  T_ASSERT(mkdtemp(g_dir) != NULL);
  if (strcmp(argv[1], "names") == 0 && argc == 3)
    names_tests(argv[2]);
  else if (strcmp(argv[1], "ranks") == 0 && argc == 3)
    ranks_tests(argv[2]);
  else if (strcmp(argv[1], "strict") == 0)
    strict_tests();
  else if (strcmp(argv[1], "launch") == 0 && argc == 3) {
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    T_ASSERT(n > 0);
    self[n] = '\0';
    launch_tests(argv[2], self);
  } else
    T_FAIL("unknown mode '%s'", argv[1]);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  T_ASSERT(system(cmd) == 0);
  return t_exit_status();
}

/* MLXDIST_* tunables: defaults, environment values, unparsable values
 * (default + one warning per variable), the generated documentation. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "util/tunables.h"

/* Run fn with stderr redirected to a file; return what it printed. */
static char g_captured[4096];
static void capture_stderr(void (*fn)(void)) {
  char path[] = "/tmp/mlxdist_tunables_XXXXXX";
  int fd = mkstemp(path);
  T_ASSERT(fd >= 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  fn();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  lseek(fd, 0, SEEK_SET);
  ssize_t n = read(fd, g_captured, sizeof g_captured - 1);
  g_captured[n > 0 ? n : 0] = '\0';
  close(fd);
  unlink(path);
}

static double g_d1, g_d2;
static long g_l1;
static void read_bad(void) {
  g_d1 = mlxd_tunable_double(MLXD_T_SPIN_US);
  g_d2 = mlxd_tunable_double(MLXD_T_SPIN_US);
  g_l1 = mlxd_tunable_long(MLXD_T_SMALL_BYTES);
}

int main(void) {
  for (int t = 0; t < MLXD_T_COUNT; t++) {
    const char* name = mlxd_tunable_env_name((mlxd_tunable)t);
    T_ASSERT(strncmp(name, "MLXDIST_", 8) == 0);
    T_ASSERT(strlen(mlxd_tunable_doc((mlxd_tunable)t)) > 10);
    unsetenv(name);
    T_ASSERT(strcmp(mlxd_tunable_str((mlxd_tunable)t), mlxd_tunable_default((mlxd_tunable)t)) == 0);
  }
  T_ASSERT(strcmp(mlxd_tunable_env_name(MLXD_T_TIMEOUT), "MLXDIST_TIMEOUT") == 0);
  double def_timeout = strtod(mlxd_tunable_default(MLXD_T_TIMEOUT), NULL);
  T_ASSERT(mlxd_tunable_double(MLXD_T_TIMEOUT) == def_timeout);
  T_EQ_INT(mlxd_tunable_long(MLXD_T_SMALL_BYTES), atol(mlxd_tunable_default(MLXD_T_SMALL_BYTES)));

  setenv("MLXDIST_TIMEOUT", "2.5", 1);
  T_ASSERT(mlxd_tunable_double(MLXD_T_TIMEOUT) == 2.5);
  setenv("MLXDIST_TIMEOUT", " 7 ", 1);
  T_ASSERT(mlxd_tunable_double(MLXD_T_TIMEOUT) == 7.0);
  setenv("MLXDIST_TIMEOUT", "", 1); /* empty: the default */
  T_ASSERT(mlxd_tunable_double(MLXD_T_TIMEOUT) == def_timeout);
  setenv("MLXDIST_SMALL_BYTES", "1024", 1);
  T_EQ_INT(mlxd_tunable_long(MLXD_T_SMALL_BYTES), 1024);
  setenv("MLXDIST_TRANSPORT", "tcp", 1);
  T_ASSERT(strcmp(mlxd_tunable_str(MLXD_T_TRANSPORT), "tcp") == 0);

  /* unparsable: default, and one warning per variable */
  setenv("MLXDIST_SPIN_US", "fast", 1);
  setenv("MLXDIST_SMALL_BYTES", "12k", 1);
  capture_stderr(read_bad);
  T_ASSERT(g_d1 == strtod(mlxd_tunable_default(MLXD_T_SPIN_US), NULL) && g_d2 == g_d1);
  T_EQ_INT(g_l1, atol(mlxd_tunable_default(MLXD_T_SMALL_BYTES)));
  const char* w1 = strstr(g_captured, "MLXDIST_SPIN_US='fast'");
  T_ASSERT(w1 && strstr(w1 + 1, "MLXDIST_SPIN_US") == NULL); /* once */
  T_ASSERT(strstr(g_captured, "MLXDIST_SMALL_BYTES='12k'"));
  capture_stderr(read_bad);
  T_ASSERT(g_captured[0] == '\0');                             /* not again */
  setenv("MLXDIST_SMALL_BYTES", "99999999999999999999999", 1); /* out of range */
  T_EQ_INT(mlxd_tunable_long(MLXD_T_SMALL_BYTES), atol(mlxd_tunable_default(MLXD_T_SMALL_BYTES)));
  T_ASSERT(strcmp(mlxd_tunable_env_name((mlxd_tunable)99), "") == 0);
  printf("test_tunables: OK\n");
  return 0;
}

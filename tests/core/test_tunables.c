/* MLXDIST_* tunables: defaults, environment values, the validation of every
 * variable against its declared kind and range (every bad value rejected with
 * the variable's name, the value and what was expected), init failing on a
 * bad value, the readers' fallback (default + one warning per variable). */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mlx/c/distributed_group.h"
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

/* ---- validation, one variable at a time ---- */

static int g_rejected;

static void expect_bad(mlxd_tunable t, const char* v) {
  char why[400], want[300], exp[256];
  double out = -12345;
  if (mlxd_tunable_parse(t, v, &out, why, sizeof why) == 0)
    T_FAIL("%s='%s' was accepted (as %g)", mlxd_tunable_env_name(t), v, out);
  T_ASSERT(out == -12345); /* nothing stored */
  snprintf(want, sizeof want, "%s='", mlxd_tunable_env_name(t));
  T_ASSERT(strncmp(why, want, strlen(want)) == 0);
  snprintf(want, sizeof want, "; expected %s", mlxd_tunable_expected(t, exp, sizeof exp));
  if (!strstr(why, want)) T_FAIL("'%s' lacks '%s'", why, want);
  /* the value is named (printable ones as they are) */
  bool printable = strlen(v) <= 64;
  for (const char* p = v; *p; p++)
    if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) printable = false;
  if (printable) {
    snprintf(want, sizeof want, "%s='%s' ", mlxd_tunable_env_name(t), v);
    if (strncmp(why, want, strlen(want)) != 0) T_FAIL("'%s' does not start with '%s'", why, want);
  }
  g_rejected++;
  if (t_env_int("MLXDIST_TEST_VERBOSE", 0)) printf("  %s\n", why);
}

static void expect_good(mlxd_tunable t, const char* v, double want) {
  char why[400];
  double out = -1;
  if (mlxd_tunable_parse(t, v, &out, why, sizeof why) != 0)
    T_FAIL("%s='%s' was rejected: %s", mlxd_tunable_env_name(t), v, why);
  if (!(out == want))
    T_FAIL("%s='%s' gave %g, expected %g", mlxd_tunable_env_name(t), v, out, want);
}

/* A bound shifted by a little, printed in full. */
static void fmt(char* buf, size_t n, double v) { snprintf(buf, n, "%.17g", v); }

static void validate_all(void) {
  static const char* const not_numbers[] = {"",    " ",     "abc",      "nan",  "NaN", "-nan",
                                            "inf", "-inf",  "infinity", "0x10", "1,5", "5s",
                                            "1 2", "--1",   "1e",       ".",    "+",   "e5",
                                            "1e+", "1.2.3", "\x01",     "12k"};
  static const char* const not_integers[] = {"1.5", "1e3", "0.0", "99999999999999999999999",
                                             "-99999999999999999999999"};
  for (int i = 0; i < MLXD_T_COUNT; i++) {
    mlxd_tunable t = (mlxd_tunable)i;
    const mlxd_tunable_spec* s = mlxd_tunable_spec_of(t);
    T_ASSERT(s != NULL);
    double def = -1;
    char why[400], buf[64];
    if (mlxd_tunable_parse(t, mlxd_tunable_default(t), &def, why, sizeof why) != 0)
      T_FAIL("the default of %s is invalid: %s", mlxd_tunable_env_name(t), why);
    switch (s->kind) {
      case MLXD_TK_NUMBER:
      case MLXD_TK_INTEGER:
        for (size_t k = 0; k < sizeof not_numbers / sizeof *not_numbers; k++)
          expect_bad(t, not_numbers[k]);
        if (s->kind == MLXD_TK_INTEGER)
          for (size_t k = 0; k < sizeof not_integers / sizeof *not_integers; k++)
            expect_bad(t, not_integers[k]);
        /* the range, both ends included */
        fmt(buf, sizeof buf, s->lo);
        expect_good(t, buf, s->lo);
        fmt(buf, sizeof buf, s->hi);
        expect_good(t, buf, s->hi);
        fmt(buf, sizeof buf, s->kind == MLXD_TK_INTEGER ? s->lo - 1 : s->lo - 0.0001);
        expect_bad(t, buf);
        fmt(buf, sizeof buf, s->kind == MLXD_TK_INTEGER ? s->hi + 1 : s->hi * 1.0001);
        expect_bad(t, buf);
        if (s->lo > -1) expect_bad(t, "-1"); /* MLXDIST_IB_GID_INDEX: -1 means "by content" */
        if (s->lo > 0) expect_bad(t, "0");
        expect_bad(t, "1e400");
        snprintf(buf, sizeof buf, " %.0f\t", s->hi); /* blanks around a number are fine */
        expect_good(t, buf, s->hi);
        break;
      case MLXD_TK_FLAG:
        expect_good(t, "0", 0);
        expect_good(t, " 1 ", 1);
        for (const char* const* v = (const char* const[]){"", "2", "-1", "01", "yes", "true", "on",
                                                          "1.0", "0x1", NULL};
             *v; v++)
          expect_bad(t, *v);
        break;
      case MLXD_TK_CHOICE:
        for (const char* const* v = (const char* const[]){"", "carrier-pigeon", " tcp", "tcp ",
                                                          "tc", "tcpx", "auto|tcp", NULL};
             *v; v++)
          expect_bad(t, *v);
        break;
      case MLXD_TK_HEX:
        expect_good(t, "", 0);
        expect_good(t, "0123456789abcdefABCDEF0123456789", 0);
        for (const char* const* v =
                 (const char* const[]){"0123456789abcdef0123456789abcde", /* 31 digits */
                                       "0123456789abcdef0123456789abcdef0", "xyz",
                                       "0123456789abcdef0123456789abcdeg",
                                       " 0123456789abcdef012345678"
                                       "9abcdef",
                                       NULL};
             *v; v++)
          expect_bad(t, *v);
        break;
      case MLXD_TK_HOST: {
        expect_good(t, "", 0);
        expect_good(t, "10.0.0.1", 0);
        expect_good(t, "fe80::1%eth0", 0);
        expect_good(t, "node-1.example", 0);
        char lng[5000]; /* one character over the limit (255; 4096 for a list of names) */
        T_ASSERT(s->hi + 1 < sizeof lng);
        memset(lng, 'a', (size_t)s->hi + 1);
        lng[(size_t)s->hi + 1] = '\0';
        for (const char* const* v = (const char* const[]){"not an address", "10.0.0.1;reboot",
                                                          "a/b", "\x01", lng, "10.0.0.1\n", NULL};
             *v; v++)
          expect_bad(t, *v);
        break;
      }
      case MLXD_TK_PATHS:
      case MLXD_TK_FILE: {
        expect_good(t, "/opt/a:/opt/b c", 0);
        char lng[5000];
        memset(lng, '/', 4097);
        lng[4097] = '\0';
        for (const char* const* v = (const char* const[]){"/a\n/b", "/a\x7f", "\t", lng, NULL}; *v;
             v++)
          expect_bad(t, *v);
        break;
      }
    }
  }
  /* per variable: what the issue found accepted or silently replaced */
  expect_bad(MLXD_T_TIMEOUT, "0");
  expect_bad(MLXD_T_CONNECT_TIMEOUT, "-1");
  expect_bad(MLXD_T_SPIN_US, "-1");
  expect_bad(MLXD_T_BUFFER_CACHE_MB, "-1");
  expect_bad(MLXD_T_SMALL_BYTES, "-1");
  expect_bad(MLXD_T_SHM_CMA_BYTES, "-1");
  expect_bad(MLXD_T_MPI_CHUNK_BYTES, "0");
  expect_bad(MLXD_T_RING_CONNECTIONS, "0");
  expect_good(MLXD_T_TRANSPORT, "TCP", 1); /* case-insensitive, as select.c reads it */
  expect_good(MLXD_T_TRANSPORT, "shm", 2);
  expect_good(MLXD_T_SPIN_US, "0", 0);
  expect_good(MLXD_T_BUFFER_CACHE_MB, "0", 0);
  expect_good(MLXD_T_TIMEOUT, "2.5e0", 2.5);
  /* exact messages */
  char why[400];
  mlxd_tunable_parse(MLXD_T_TIMEOUT, "0", NULL, why, sizeof why);
  T_ASSERT(strcmp(why,
                  "MLXDIST_TIMEOUT='0' is out of range; expected seconds, a number from 0.001 to "
                  "86400") == 0);
  mlxd_tunable_parse(MLXD_T_SMALL_BYTES, "12k", NULL, why, sizeof why);
  T_ASSERT(strcmp(why,
                  "MLXDIST_SMALL_BYTES='12k' is not a decimal integer; expected bytes, an "
                  "integer from 0 to 16777216") == 0);
  mlxd_tunable_parse(MLXD_T_SPIN_US, "nan", NULL, why, sizeof why);
  T_ASSERT(strstr(why, "MLXDIST_SPIN_US='nan' is not a decimal number; expected microseconds"));
  mlxd_tunable_parse(MLXD_T_WORKER_IDLE, "yes", NULL, why, sizeof why);
  T_ASSERT(strcmp(why, "MLXDIST_WORKER_IDLE='yes' is not 0 or 1; expected 0 or 1") == 0);
  mlxd_tunable_parse(MLXD_T_RING_ADDR, "not an address", NULL, why, sizeof why);
  T_ASSERT(strstr(why, "MLXDIST_RING_ADDR='not an address' has the byte 0x20 at position 4"));
  mlxd_tunable_parse(MLXD_T_PLUGIN_PATH, "/a\n", NULL, why, sizeof why);
  T_ASSERT(strstr(why, "MLXDIST_PLUGIN_PATH='/a\\x0a' has the byte 0x0a at position 3"));
  T_ASSERT(mlxd_tunable_parse((mlxd_tunable)99, "1", NULL, why, sizeof why) != 0);
  T_EQ_INT(mlxd_tunable_find("MLXDIST_SPIN_US=5", 15), MLXD_T_SPIN_US);
  T_EQ_INT(mlxd_tunable_find("MLXDIST_SPIN", 12), -1);
  T_EQ_INT(mlxd_tunable_find("MLXDIST_SPIN_USX", 16), -1);
  printf("validation: %d bad values rejected, each naming its variable\n", g_rejected);
}

/* ---- init refuses a bad value, strict or not ---- */

static void init_refuses(void) {
  t_capture_errors();
  setenv("MLXDIST_TIMEOUT", "0", 1);
  setenv("MLXDIST_SPIN_US", "-1", 1);
  mlxd_status st = {0};
  T_EQ_INT(mlxd_tunables_check(&st), MLXD_EINVAL);
  T_ASSERT(strstr(st.msg, "MLXDIST_TIMEOUT='0' is out of range") &&
           strstr(st.msg, "MLXDIST_SPIN_US='-1' is out of range") &&
           strstr(st.msg, "(fix or unset the variables)"));
  for (int strict = 0; strict < 2; strict++) {
    mlx_distributed_group g = mlx_distributed_group_new();
    t_clear_errors();
    T_ASSERT(mlx_distributed_init(&g, strict, "any") != 0);
    T_EXPECT_ERROR(
        "[distributed] init: MLXDIST_TIMEOUT='0' is out of range; expected seconds, a "
        "number from 0.001 to 86400. MLXDIST_SPIN_US='-1' is out of range");
  }
  /* the readers never hand out the bad value */
  capture_stderr(read_bad);
  T_ASSERT(g_d1 == 1000 && mlxd_tunable_double(MLXD_T_TIMEOUT) == 60);
  unsetenv("MLXDIST_TIMEOUT");
  unsetenv("MLXDIST_SPIN_US");
  st = (mlxd_status){0};
  T_EQ_INT(mlxd_tunables_check(&st), 0);
  setenv("MLXDIST_TIMEOUT", "", 1); /* empty: the default */
  T_EQ_INT(mlxd_tunables_check(&st), 0);
  mlx_distributed_group g = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init(&g, false, "any"), 0); /* nothing configured: a group of one */
  T_EQ_INT(mlx_distributed_group_size(g), 1);
  mlx_distributed_group_free(g);
  unsetenv("MLXDIST_TIMEOUT");
  printf("init: refuses bad values (strict and not)\n");
}

int main(void) {
  validate_all();
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
  unsetenv("MLXDIST_SMALL_BYTES");
  unsetenv("MLXDIST_TRANSPORT");
  init_refuses();
  printf("test_tunables: OK\n");
  return 0;
}

/* The single-copy threshold's calibration (transport/cma_calib.h) and the
 * rule around it (transport/spin.h mlxd_shm_cma_bytes_from):
 *  - the decision rule on given timing tables (a pure function);
 *  - the cache file's parser on crafted text: garbage, another boot's id,
 *    another version, a threshold out of range or not a measured size;
 *  - the cache file on disk, in a directory of this test's: crafted files
 *    (another mode, a link, a directory, a FIFO, too long) refused, writes
 *    that leave a whole file of mode 0600, the first writer winning, a
 *    broken file replaced;
 *  - MLXDIST_SHM_CMA_BYTES set (0 included) and a crowded host decide
 *    without calibrating; unset on a host that is not crowded, the
 *    calibration decides once per process;
 *  - a real measurement finishes within its bound (50x slack for the
 *    sanitizers) and answers 0 or one of the measured sizes, the one the
 *    rule picks from its own table. No other timing is asserted. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "transport/cma_calib.h"
#include "transport/spin.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1 << 20)

static const char* const BOOT = "cfbd0849-3ca2-4418-8df2-0510678d8871";
static const char* const OTHER = "0123abcd-0000-4000-8000-00000000beef";

static size_t decide4(double t0, double o0, double t1, double o1, double t2, double o2, double t3,
                      double o3) {
  const double two[4] = {t0, t1, t2, t3}, one[4] = {o0, o1, o2, o3};
  return mlxd_cma_decide(mlxd_cma_sizes, two, one, 4);
}

static void test_decide(void) {
  T_CHECK_EQ(mlxd_cma_sizes[0], 16 * KiB);
  T_CHECK_EQ(mlxd_cma_sizes[3], 1 * MiB);
  /* the single copy slower everywhere (the AMD EPYC VM's pattern) */
  T_CHECK_EQ(decide4(2.7e-6, 7.1e-6, 10.4e-6, 19.6e-6, 45.8e-6, 77.7e-6, 190.9e-6, 319.2e-6), 0);
  /* cheap page pinning (the Intel Xeon VM): one copy wins from the smallest size */
  T_CHECK_EQ(decide4(10e-6, 5e-6, 40e-6, 20e-6, 160e-6, 80e-6, 640e-6, 320e-6), 16 * KiB);
  /* wins from 256 KiB on */
  T_CHECK_EQ(decide4(10e-6, 12e-6, 40e-6, 41e-6, 160e-6, 100e-6, 640e-6, 400e-6), 256 * KiB);
  /* wins at 16 KiB, not at 64 KiB, then again: the run from 256 KiB */
  T_CHECK_EQ(decide4(10e-6, 5e-6, 40e-6, 50e-6, 160e-6, 100e-6, 640e-6, 400e-6), 256 * KiB);
  /* wins below but not at the largest: off */
  T_CHECK_EQ(decide4(10e-6, 5e-6, 40e-6, 20e-6, 160e-6, 80e-6, 640e-6, 700e-6), 0);
  /* only at the largest */
  T_CHECK_EQ(decide4(10e-6, 20e-6, 40e-6, 80e-6, 160e-6, 170e-6, 640e-6, 500e-6), 1 * MiB);
  /* the margin: 10 % faster wins, 9 % does not, equal does not */
  T_CHECK_EQ(decide4(1, 0.9, 1, 0.9, 1, 0.9, 1, 0.9), 16 * KiB);
  T_CHECK_EQ(decide4(1, 0.91, 1, 0.91, 1, 0.91, 1, 0.91), 0);
  T_CHECK_EQ(decide4(1, 1, 1, 1, 1, 1, 1, 1), 0);
  T_CHECK_EQ(decide4(1, 1, 1, 0.5, 1, 0.5, 1, 0.5), 64 * KiB);
  /* times that are not times, sizes that are not ascending, nothing measured: off */
  T_CHECK_EQ(decide4(1, 0.5, 1, 0.5, NAN, 0.5, 1, 0.5), 0);
  T_CHECK_EQ(decide4(1, 0.5, 1, 0.5, 1, 0, 1, 0.5), 0);
  T_CHECK_EQ(decide4(1, 0.5, 1, -1, 1, 0.5, 1, 0.5), 0);
  T_CHECK_EQ(decide4(1, 0.5, 1, 0.5, 1, 0.5, INFINITY, 0.5), 0);
  const size_t desc[3] = {1 * MiB, 256 * KiB, 16 * KiB};
  const double two[3] = {1, 1, 1}, one[3] = {0.5, 0.5, 0.5};
  T_CHECK_EQ(mlxd_cma_decide(desc, two, one, 3), 0);
  T_CHECK_EQ(mlxd_cma_decide(mlxd_cma_sizes, two, one, 0), 0);
  T_CHECK_EQ(mlxd_cma_decide(mlxd_cma_sizes, two, one, 2), 16 * KiB); /* a shorter table */
  T_CHECK_EQ(mlxd_cma_decide(NULL, two, one, 2), 0);
}

/* Whether text parses (against BOOT); *out its threshold. */
static int parse(const char* text, size_t* out) {
  char why[128];
  size_t v = 12345;
  int rc = mlxd_cma_cache_parse(text, strlen(text), BOOT, &v, why, sizeof why);
  if (rc == 0 && out) *out = v;
  if (rc == 0) T_CHECKF(v != 12345, "parsed \"%s\" without a value", text);
  return rc;
}

static void test_parse(void) {
  char line[MLXD_CMA_CACHE_MAX + 64];
  size_t v = 1;
  /* what the writer writes parses back, for every value it may write */
  for (int i = -1; i < MLXD_CMA_NSIZES; i++) {
    size_t want = i < 0 ? 0 : mlxd_cma_sizes[i];
    int n = mlxd_cma_cache_format(line, sizeof line, BOOT, want);
    T_CHECK(n > 0 && (size_t)n == strlen(line));
    T_CHECKF(parse(line, &v) == 0 && v == want, "\"%s\"", line);
  }
  T_CHECK(mlxd_cma_cache_format(line, 10, BOOT, 0) == -1); /* too small a buffer */
  snprintf(line, sizeof line, "mlxdist-cma 2 %s 65536\n", BOOT);
  T_CHECK(parse(line, &v) == 0 && v == 64 * KiB);
  const char* bad[] = {
      "",
      "garbage",
      "\n",
      "mlxdist-cma",
      "mlxdist-cma 2",
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871",
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 ",
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 65536",     /* no newline */
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 65536\n\n", /* more after it */
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 65536 \n",
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 65536\nx",
      "mlxdist-cma 1 cfbd0849-3ca2-4418-8df2-0510678d8871 65536\n", /* another version (1: before the exchange) */
      "mlxdist-cma 3 cfbd0849-3ca2-4418-8df2-0510678d8871 65536\n",
      "mlxdist-cma 0 cfbd0849-3ca2-4418-8df2-0510678d8871 65536\n",
      "mlxdist-cma 01 cfbd0849-3ca2-4418-8df2-0510678d8871 65536\n", /* a leading zero */
      "mlxdist-cma -1 cfbd0849-3ca2-4418-8df2-0510678d8871 65536\n",
      "mlxdist-cma 2 0123abcd-0000-4000-8000-00000000beef 65536\n", /* another boot's */
      "mlxdist-cma 2 CFBD0849-3CA2-4418-8DF2-0510678D8871 65536\n", /* not as the kernel writes it */
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d887 65536\n",  /* short */
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d88710 65536\n", /* long */
      "mlxdist-cma 2 cfbd0849x3ca2-4418-8df2-0510678d8871 65536\n",
      "mlxdist-cma  2 cfbd0849-3ca2-4418-8df2-0510678d8871 65536\n",
      "mlxdist-cma 2  cfbd0849-3ca2-4418-8df2-0510678d8871 65536\n",
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871  65536\n",
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 65535\n",    /* not a measured size */
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 33554432\n", /* nor is the crowded one */
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 4194304\n", /* measured before the exchange, not now */
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 -65536\n",
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 +65536\n",
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 065536\n",
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 0x10000\n",
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 18446744073709617152\n", /* 2^64+64K */
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 99999999999999999999999\n",
      "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 1e6\n",
      " mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 65536\n",
      "MLXDIST-CMA 2 cfbd0849-3ca2-4418-8df2-0510678d8871 65536\n",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    T_CHECKF(parse(bad[i], NULL) != 0, "accepted \"%s\"", bad[i]);
  /* a NUL inside, a file past the limit, no boot id to compare with */
  static const char nul[] = "mlxdist-cma 2 cfbd0849-3ca2-4418-8df2-0510678d8871 0\n\0";
  T_CHECK(mlxd_cma_cache_parse(nul, sizeof nul - 1, BOOT, &v, NULL, 0) != 0);
  char big[MLXD_CMA_CACHE_MAX + 2];
  memset(big, ' ', sizeof big);
  int n = snprintf(big, sizeof big, "mlxdist-cma 2 %s 0\n", BOOT);
  big[n] = ' ';
  T_CHECK(mlxd_cma_cache_parse(big, sizeof big, BOOT, &v, NULL, 0) != 0);
  snprintf(line, sizeof line, "mlxdist-cma 2 %s 0\n", BOOT);
  T_CHECK(mlxd_cma_cache_parse(line, strlen(line), NULL, &v, NULL, 0) != 0);
  T_CHECK(mlxd_cma_cache_parse(line, strlen(line), OTHER, &v, NULL, 0) != 0);
  T_CHECK(mlxd_cma_cache_parse(NULL, 0, BOOT, &v, NULL, 0) != 0);
}

static void put(const char* path, const char* text, mode_t mode) {
  unlink(path);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
  T_REQUIREF(fd >= 0, "create %s: %s", path, strerror(errno));
  T_REQUIRE(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  T_REQUIRE(fchmod(fd, mode) == 0);
  close(fd);
}

/* The answer of mlxd_cma_cache_read for path; why: its reason. */
static int rd(const char* path, size_t* v, char* why, size_t n) {
  why[0] = '\0';
  return mlxd_cma_cache_read(path, BOOT, v, why, n);
}

static void test_files(void) {
  char dir[] = "/tmp/mlxdist-cma-test-XXXXXX";
  T_REQUIREF(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
  char path[256], other[300], why[128], line[128];
  snprintf(path, sizeof path, "%s/cache", dir);
  size_t v = 0;

  T_CHECK(rd(path, &v, why, sizeof why) != 0 && strcmp(why, "none") == 0);
  mlxd_cma_cache_format(line, sizeof line, BOOT, 256 * KiB);
  put(path, line, 0600);
  T_CHECKF(rd(path, &v, why, sizeof why) == 0 && v == 256 * KiB, "%s", why);
  put(path, line, 0644); /* readable by others is fine: it is no secret */
  T_CHECKF(rd(path, &v, why, sizeof why) == 0, "%s", why);
  put(path, line, 0620); /* writable by others is not */
  T_CHECK(rd(path, &v, why, sizeof why) != 0 && strstr(why, "writable"));
  put(path, line, 0602);
  T_CHECK(rd(path, &v, why, sizeof why) != 0 && strstr(why, "writable"));
  /* a link to a valid file is not followed */
  snprintf(other, sizeof other, "%s/target", dir);
  put(other, line, 0600);
  unlink(path);
  T_REQUIRE(symlink(other, path) == 0);
  T_CHECK(rd(path, &v, why, sizeof why) != 0);
  unlink(path);
  unlink(other);
  /* a directory, a FIFO (never waited on) */
  T_REQUIRE(mkdir(path, 0700) == 0);
  T_CHECK(rd(path, &v, why, sizeof why) != 0 && strstr(why, "regular"));
  rmdir(path);
  T_REQUIRE(mkfifo(path, 0600) == 0);
  T_CHECK(rd(path, &v, why, sizeof why) != 0 && strstr(why, "regular"));
  unlink(path);
  /* too long: a valid line with padding after it */
  char big[MLXD_CMA_CACHE_MAX + 40];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  memcpy(big, line, strlen(line));
  put(path, big, 0600);
  T_CHECK(rd(path, &v, why, sizeof why) != 0 && strstr(why, "too long"));
  /* another boot's, garbage, out of range */
  mlxd_cma_cache_format(line, sizeof line, OTHER, 0);
  put(path, line, 0600);
  T_CHECK(rd(path, &v, why, sizeof why) != 0 && strstr(why, "boot"));
  put(path,
      "\x7f"
      "ELF\x02\x01\x01",
      0600);
  T_CHECK(rd(path, &v, why, sizeof why) != 0);
  snprintf(line, sizeof line, "mlxdist-cma 2 %s 1048577\n", BOOT);
  put(path, line, 0600);
  T_CHECK(rd(path, &v, why, sizeof why) != 0 && strstr(why, "threshold"));

  /* writing: a broken file is replaced; the result is whole, 0600, read back */
  size_t w = 1 * MiB;
  T_CHECK_EQ(mlxd_cma_cache_write(path, BOOT, &w), 0);
  T_CHECK_EQ(w, 1 * MiB);
  struct stat sb;
  T_REQUIRE(lstat(path, &sb) == 0);
  T_CHECKF(S_ISREG(sb.st_mode) && (sb.st_mode & 0777) == 0600, "mode %o", (unsigned)sb.st_mode);
  T_CHECKF(rd(path, &v, why, sizeof why) == 0 && v == 1 * MiB, "%s", why);
  /* a second writer finds a valid one: it agrees with the first */
  w = 0;
  T_CHECK_EQ(mlxd_cma_cache_write(path, BOOT, &w), 1);
  T_CHECK_EQ(w, 1 * MiB);
  T_CHECK(rd(path, &v, why, sizeof why) == 0 && v == 1 * MiB);
  /* one of another boot is stale: replaced */
  w = 0;
  T_CHECK_EQ(mlxd_cma_cache_write(path, OTHER, &w), 0);
  T_CHECK_EQ(w, 0);
  T_CHECK(mlxd_cma_cache_read(path, OTHER, &v, NULL, 0) == 0 && v == 0);
  T_CHECK(rd(path, &v, why, sizeof why) != 0);
  /* no temporary file left beside it */
  snprintf(other, sizeof other, "%s.%ld.tmp", path, (long)getpid());
  T_CHECK(access(other, F_OK) != 0);
  unlink(path);
  /* a directory it cannot write in: -1, the value untouched */
  snprintf(other, sizeof other, "%s/missing/cache", dir);
  w = 64 * KiB;
  T_CHECK_EQ(mlxd_cma_cache_write(other, BOOT, &w), -1);
  T_CHECK_EQ(w, 64 * KiB);
  T_CHECK(rmdir(dir) == 0);

  char boot[MLXD_CMA_BOOT_ID_LEN + 1];
  if (mlxd_cma_boot_id(boot)) T_CHECK_EQ(strlen(boot), MLXD_CMA_BOOT_ID_LEN);
  mlxd_cma_cache_path(path, sizeof path);
  snprintf(line, sizeof line, "/dev/shm/.mlxdist-cma-%lu", (unsigned long)getuid());
  T_CHECK(strcmp(path, line) == 0);
}

static bool allowed(size_t v) {
  for (int i = 0; i < MLXD_CMA_NSIZES; i++)
    if (v == mlxd_cma_sizes[i]) return true;
  return v == 0;
}

/* Precedence: the variable, then the crowded rule, neither calibrating;
 * only then the calibration, once. */
static void test_rule(void) {
  mlxd_shm_cma_from from = 0;
  T_REQUIRE(!mlxd_cma_calibration_ran());
  setenv("MLXDIST_SHM_CMA_BYTES", "0", 1);
  T_CHECK_EQ(mlxd_shm_cma_bytes_from(false, &from), 0);
  T_CHECK_EQ(from, MLXD_SHM_CMA_FROM_ENV);
  T_CHECK_EQ(mlxd_shm_cma_bytes_from(true, &from), 0);
  T_CHECK_EQ(from, MLXD_SHM_CMA_FROM_ENV);
  setenv("MLXDIST_SHM_CMA_BYTES", "65536", 1);
  T_CHECK_EQ(mlxd_shm_cma_bytes_for(false), 65536);
  T_CHECK_EQ(mlxd_shm_cma_bytes_for(true), 65536);
  setenv("MLXDIST_SHM_CMA_BYTES", "1000000", 1); /* any value, not only a measured size */
  T_CHECK_EQ(mlxd_shm_cma_bytes_for(false), 1000000);
  setenv("MLXDIST_SHM_CMA_BYTES", "", 1); /* empty is unset */
  T_CHECK_EQ(mlxd_shm_cma_bytes_from(true, &from), MLXD_SHM_CMA_CROWDED_BYTES);
  T_CHECK_EQ(from, MLXD_SHM_CMA_FROM_CROWDED);
  unsetenv("MLXDIST_SHM_CMA_BYTES");
  T_CHECK_EQ(mlxd_shm_cma_bytes_from(true, &from), MLXD_SHM_CMA_CROWDED_BYTES);
  T_CHECK_EQ(from, MLXD_SHM_CMA_FROM_CROWDED);
  T_CHECK(!mlxd_cma_calibration_ran()); /* none of those looked at it */

  size_t v = mlxd_shm_cma_bytes_from(false, &from);
  T_CHECK_EQ(from, MLXD_SHM_CMA_FROM_CALIBRATION);
  T_CHECK(mlxd_cma_calibration_ran());
  T_CHECKF(allowed(v), "the calibration chose %zu", v);
  const mlxd_cma_choice* c = mlxd_cma_calibrated();
  T_CHECK_EQ(c->bytes, v);
  T_CHECK(c->source == MLXD_CMA_FROM_CACHE || c->source == MLXD_CMA_FROM_MEASURED);
  T_CHECK(mlxd_cma_calibrated() == c && mlxd_shm_cma_bytes_for(false) == v); /* once */
  if (c->source == MLXD_CMA_FROM_MEASURED && !c->table.err && c->table.reps > 0)
    T_CHECK_EQ(v, mlxd_cma_decide(mlxd_cma_sizes, c->table.two_s, c->table.one_s, MLXD_CMA_NSIZES));
  printf("cma rule: %s chose %zu (%s)\n",
         c->source == MLXD_CMA_FROM_CACHE ? "the cache" : "a measurement", v, c->path);
}

static void test_measure(void) {
  const double bound = MLXD_CMA_BUDGET_S * 50; /* the budget, with slack for the sanitizers */
  mlxd_cma_table t;
  size_t v = mlxd_cma_measure(&t, MLXD_CMA_BUDGET_S);
  printf(
      "cma measure: %zu in %.2f ms (%d passes%s%s%s%s); us exchange over lanes/process_vm_readv:",
      v, t.took_s * 1e3, t.reps, t.over ? ", over budget" : "",
      t.one_cpu ? ", one CPU: not measured" : "", t.err ? ", refused: " : "",
      t.err ? strerror(t.err) : "");
  for (int i = 0; i < t.n; i++)
    printf(" %zu KiB %.1f/%.1f", mlxd_cma_sizes[i] / KiB, t.two_s[i] * 1e6, t.one_s[i] * 1e6);
  printf("\n");
  T_CHECKF(t.took_s >= 0 && t.took_s < bound, "took %.3f s (bound %.3f s)", t.took_s, bound);
  T_CHECKF(allowed(v), "chose %zu", v);
  T_CHECK(t.n >= 0 && t.n <= MLXD_CMA_NSIZES && t.reps >= 0 && t.reps <= MLXD_CMA_REPS);
  if (t.err || t.one_cpu) {
    T_CHECK(v == 0 && t.reps == 0 && t.n == 0);
  } else if (t.reps > 0) {
    T_CHECK(!t.over && t.n == MLXD_CMA_NSIZES);
    for (int i = 0; i < t.n; i++) T_CHECK(t.two_s[i] > 0 && t.one_s[i] > 0);
    T_CHECK_EQ(v, mlxd_cma_decide(mlxd_cma_sizes, t.two_s, t.one_s, t.n));
  } else {
    T_CHECK(t.over && v == 0);
  }
  /* a generous budget (the sanitizers slow the rounds past the real one):
   * the helper thread and every round run; a whole table is decided as
   * the rule says */
  v = mlxd_cma_measure(&t, 2.0);
  printf("cma measure (2 s budget): %zu in %.2f ms (%d passes%s)\n", v, t.took_s * 1e3, t.reps,
         t.over ? ", over budget" : "");
  T_CHECKF(t.took_s < 2.0 + bound, "took %.3f s", t.took_s);
  if (!t.err && !t.one_cpu && !t.over) {
    T_CHECK(t.reps == MLXD_CMA_REPS && t.n == MLXD_CMA_NSIZES);
    T_CHECK_EQ(v, mlxd_cma_decide(mlxd_cma_sizes, t.two_s, t.one_s, t.n));
  }
  /* no time at all: it stops before the first step, answers off */
  v = mlxd_cma_measure(&t, 0);
  T_CHECK(v == 0 && t.reps == 0 && (t.over || t.err));
  T_CHECKF(t.took_s < bound, "took %.3f s (bound %.3f s)", t.took_s, bound);
}

int main(void) {
  test_decide();
  test_parse();
  test_files();
  test_rule();
  test_measure();
  if (t_check_failures()) return t_exit_status();
  printf("cma calibration: ok\n");
  return 0;
}

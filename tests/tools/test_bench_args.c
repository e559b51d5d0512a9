/* mlxdist-bench: argument errors exit 2 naming the bad value (before any
 * backend starts), the shared benchmark helpers (sizes, dtype encodings,
 * expected results, busbw factors) behave as documented, and the
 * measurement rule (warm-up, calibration, batches) keeps its promises on one
 * rank (where the maximum over the ranks is the value itself). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"
#include "testutil.h"

static char out[1 << 16];

static int capture(const char* cmd) {
  FILE* p = popen(cmd, "r");
  T_ASSERT(p != NULL);
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void expect_bad(const char* tool, const char* args, const char* named) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", tool, args);
  int rc = capture(cmd);
  if (rc != 2) T_FAIL("'%s': exit %d, expected 2; output: %s", args, rc, out);
  if (strncmp(out, "[bench] ", 8) != 0 || !strstr(out, named))
    T_FAIL("'%s': message does not start with [bench] or does not name '%s': %s", args, named, out);
}

static void test_sizes(void) {
  size_t v = 0;
  T_ASSERT(mlxd_bench_parse_size("4", &v) && v == 4);
  T_ASSERT(mlxd_bench_parse_size("64M", &v) && v == 64ull * 1024 * 1024);
  T_ASSERT(mlxd_bench_parse_size("8K", &v) && v == 8192);
  T_ASSERT(mlxd_bench_parse_size("1G", &v) && v == 1ull << 30);
  T_ASSERT(mlxd_bench_parse_size("2kB", &v) && v == 2048);
  T_ASSERT(!mlxd_bench_parse_size("", &v));
  T_ASSERT(!mlxd_bench_parse_size("-4", &v));
  T_ASSERT(!mlxd_bench_parse_size("12Q", &v));
  T_ASSERT(!mlxd_bench_parse_size("M", &v));
  /* the sweep: times the factor, never stuck, ends instead of wrapping around */
  mlxd_bench_opts o;
  memset(&o, 0, sizeof o);
  o.factor = 16;
  T_EQ_INT(mlxd_bench_next_size(&o, 4), 64);
  o.factor = 1.1;
  T_EQ_INT(mlxd_bench_next_size(&o, 4), 5);
  T_EQ_INT(mlxd_bench_next_size(&o, SIZE_MAX - 1), 0);
}

static void test_shapes(void) {
  mlxd_bench_shape s;
  /* all_gather: the row is the gathered output, per-rank input is 1/n of it */
  T_ASSERT(mlxd_bench_shape_for(MLXD_OP_ALL_GATHER, 1024, 4, 4, &s));
  T_EQ_INT(s.in_count, 64);
  T_EQ_INT(s.out_count, 256);
  T_EQ_INT(s.row_bytes, 1024);
  /* sum_scatter: rounded down to a multiple of n */
  T_ASSERT(mlxd_bench_shape_for(MLXD_OP_SUM_SCATTER, 40, 4, 3, &s));
  T_EQ_INT(s.in_count, 9);
  T_EQ_INT(s.out_count, 3);
  T_EQ_INT(s.row_bytes, 36);
  T_ASSERT(!mlxd_bench_shape_for(MLXD_OP_SUM_SCATTER, 8, 4, 4, &s));
  T_ASSERT(!mlxd_bench_shape_for(MLXD_OP_ALL_SUM, 4, 8, 2, &s));
  T_ASSERT(mlxd_bench_shape_for(MLXD_OP_ALL_SUM, 4, 4, 2, &s) && s.in_count == 1);
  T_ASSERT(fabs(mlxd_bench_busbw_factor(MLXD_OP_ALL_SUM, 4) - 1.5) < 1e-12);
  T_ASSERT(fabs(mlxd_bench_busbw_factor(MLXD_OP_ALL_GATHER, 4) - 0.75) < 1e-12);
  T_ASSERT(fabs(mlxd_bench_busbw_factor(MLXD_OP_SUM_SCATTER, 2) - 0.5) < 1e-12);
  T_ASSERT(fabs(mlxd_bench_busbw_factor(MLXD_OP_SENDRECV, 8) - 1.0) < 1e-12);
  T_ASSERT(fabs(mlxd_bench_busbw_factor(MLXD_OP_SENDRECV_BW, 8) - 1.0) < 1e-12);
  T_ASSERT(strcmp(mlxd_bench_op_name(MLXD_OP_SENDRECV_BW), "sendrecv_bw") == 0);
  /* all_to_all: the row is a rank's whole input (= its output), rounded down to n parts */
  T_ASSERT(mlxd_bench_shape_for(MLXD_OP_ALL_TO_ALL, 40, 4, 3, &s));
  T_EQ_INT(s.in_count, 9);
  T_EQ_INT(s.out_count, 9);
  T_EQ_INT(s.row_bytes, 36);
  T_ASSERT(!mlxd_bench_shape_for(MLXD_OP_ALL_TO_ALL, 12, 4, 4, &s));
  T_ASSERT(fabs(mlxd_bench_busbw_factor(MLXD_OP_ALL_TO_ALL, 4) - 0.75) < 1e-12);
  T_ASSERT(strcmp(mlxd_bench_op_name(MLXD_OP_ALL_TO_ALL), "all_to_all") == 0);
  /* the bandwidth window: 64 messages, fewer where they would pass 64 MiB, at least one */
  T_EQ_INT(mlxd_bench_bw_window(1), 64);
  T_EQ_INT(mlxd_bench_bw_window(1u << 20), 64);
  T_EQ_INT(mlxd_bench_bw_window(2u << 20), 32);
  T_EQ_INT(mlxd_bench_bw_window(64u << 20), 1);
  T_EQ_INT(mlxd_bench_bw_window(1u << 30), 1);
  double m[] = {5, 1, 4, 2, 3};
  T_ASSERT(mlxd_bench_median(m, 5) == 3.0);
  double m2[] = {4, 1, 3, 2};
  T_ASSERT(mlxd_bench_median(m2, 4) == 2.5);
}

/* For every dtype: the encoding round-trips, the reductions computed here
 * element by element from the decoded inputs match the expectation, and a
 * corrupted element is detected. */
static void test_patterns(void) {
  static const char* const names[] = {"bool",    "uint8",   "uint16",  "uint32", "uint64",
                                      "int8",    "int16",   "int32",   "int64",  "float16",
                                      "float32", "float64", "bfloat16"};
  const int n = 4;
  const size_t count = 40;
  for (size_t d = 0; d < sizeof names / sizeof names[0]; d++) {
    const mlxd_bench_dtype* dt = mlxd_bench_find_dtype(names[d]);
    T_ASSERT(dt != NULL);
    unsigned char in[4][40 * 8], sum[40 * 8], mx[40 * 8], gath[4 * 40 * 8];
    for (int r = 0; r < n; r++) mlxd_bench_fill(dt, in[r], count, r);
    for (size_t i = 0; i < count; i++) {
      double s = 0, m = -1;
      for (int r = 0; r < n; r++) {
        double v = mlxd_bench_load(dt, in[r], i);
        T_ASSERT(v == mlxd_bench_value(dt, r, i));
        s = dt->kind == MLXD_K_BOOL ? (s != 0 || v != 0) : s + v;
        m = v > m ? v : m;
        mlxd_bench_store(dt, gath, (size_t)r * count + i, v);
      }
      mlxd_bench_store(dt, sum, i, s);
      mlxd_bench_store(dt, mx, i, m);
    }
    T_EQ_INT(mlxd_bench_verify(dt, MLXD_OP_ALL_SUM, sum, count, 0, n, 0), 0);
    T_EQ_INT(mlxd_bench_verify(dt, MLXD_OP_ALL_MAX, mx, count, 0, n, 0), 0);
    T_EQ_INT(mlxd_bench_verify(dt, MLXD_OP_ALL_GATHER, gath, count * n, 0, n, 0), 0);
    /* rank 2's block of the sum */
    size_t blk = count / n;
    T_EQ_INT(mlxd_bench_verify(dt, MLXD_OP_SUM_SCATTER, sum + 2 * blk * dt->size, blk, 2, n, 0), 0);
    T_EQ_INT(mlxd_bench_verify(dt, MLXD_OP_SENDRECV, in[0], count, 1, n, 0), 0);
    /* all_to_all, built here by hand: rank 1's part i is rank i's part 1 */
    unsigned char a2a[40 * 8];
    for (int i = 0; i < n; i++)
      memcpy(a2a + (size_t)i * blk * dt->size, in[i] + blk * dt->size, blk * dt->size);
    T_EQ_INT(mlxd_bench_verify(dt, MLXD_OP_ALL_TO_ALL, a2a, count, 1, n, 0), 0);
    /* a wrong element in part 1 (from rank 1 itself) is caught */
    double w = mlxd_bench_load(dt, a2a, blk + 3);
    mlxd_bench_store(dt, a2a, blk + 3, w == 0 ? 1 : 0);
    T_EQ_INT(mlxd_bench_verify(dt, MLXD_OP_ALL_TO_ALL, a2a, count, 1, n, 0), 1);
    /* a wrong element is caught */
    double v = mlxd_bench_load(dt, sum, 3);
    mlxd_bench_store(dt, sum, 3, v == 0 ? 1 : 0);
    T_EQ_INT(mlxd_bench_verify(dt, MLXD_OP_ALL_SUM, sum, count, 0, n, 0), 1);
    T_EQ_INT(mlxd_bench_verify(dt, MLXD_OP_ALL_GATHER, in[0], count, 0, 1, 0), 0);
    T_ASSERT(mlxd_bench_verify(dt, MLXD_OP_ALL_GATHER, gath, count * n, 0, n, 0) == 0);
    T_ASSERT(mlxd_bench_verify(dt, MLXD_OP_SENDRECV, in[1], count, 0, n, 0) > 0);
  }
  /* float16 / bfloat16 bit patterns, known independently */
  const mlxd_bench_dtype* h = mlxd_bench_find_dtype("float16");
  const mlxd_bench_dtype* b = mlxd_bench_find_dtype("bfloat16");
  uint16_t bits;
  mlxd_bench_store(h, &bits, 0, 1.0);
  T_EQ_INT(bits, 0x3c00);
  mlxd_bench_store(h, &bits, 0, 240.0);
  T_EQ_INT(bits, 0x5b80);
  mlxd_bench_store(b, &bits, 0, 1.0);
  T_EQ_INT(bits, 0x3f80);
  mlxd_bench_store(b, &bits, 0, -2.0);
  T_EQ_INT(bits, 0xc000);
}

static void test_rule(void) {
  mlxd_bench_opts o;
  char prog[] = "bench";
  char* argv[] = {prog, NULL};
  T_EQ_INT(mlxd_bench_parse(1, argv, &o, "bench"), 0);
  T_ASSERT(o.min_time_ms == 300 && o.batches == 5 && o.iters == 1 && o.warmup == 5);
  T_EQ_INT(mlxd_bench_batch_limit(&o), 15);
  /* iterations per batch: the batches together take min_time */
  T_EQ_INT(mlxd_bench_batch_iters(&o, 1e-3), 60);
  T_EQ_INT(mlxd_bench_batch_iters(&o, 0.7), 1);
  T_EQ_INT(mlxd_bench_batch_iters(&o, 1e-9), 100000);
  T_EQ_INT(mlxd_bench_batch_iters(&o, 0), 100000);
  o.iters = 100;
  T_EQ_INT(mlxd_bench_batch_iters(&o, 1e-3), 100);
  o.iters = 1;
  o.max_iters = 10;
  T_EQ_INT(mlxd_bench_batch_iters(&o, 1e-3), 10);
  o.min_time_ms = 0;
  o.iters = 7;
  T_EQ_INT(mlxd_bench_batch_iters(&o, 1e-3), 7);
  /* warm-up beyond the first op: at most half of min_time, at least one */
  o.min_time_ms = 300;
  T_EQ_INT(mlxd_bench_warm_rest(&o, 0.6), 1);
  T_EQ_INT(mlxd_bench_warm_rest(&o, 0.04), 3);
  T_EQ_INT(mlxd_bench_warm_rest(&o, 1e-3), 4);
  o.min_time_ms = 0;
  T_EQ_INT(mlxd_bench_warm_rest(&o, 0.6), 4);
  o.warmup = 1;
  T_EQ_INT(mlxd_bench_warm_rest(&o, 1e-3), 0);
  o.max_batches = 4;
  o.batches = 3;
  T_EQ_INT(mlxd_bench_batch_limit(&o), 4);
  /* settled: equal batches are; a wide spread is not; one batch never is */
  double same[5] = {10, 10, 10.1, 10, 9.9}, wide[5] = {10, 14, 7, 12, 9}, one[1] = {10};
  T_ASSERT(!mlxd_bench_unsettled(same, 5));
  T_ASSERT(mlxd_bench_unsettled(wide, 5));
  T_ASSERT(mlxd_bench_unsettled(one, 1));
  T_ASSERT(same[2] == 10.1); /* the caller's order is kept */
}

/* One rank: an op that busy-waits op_s, and the maximum over one rank. */
typedef struct fake_rank {
  double op_s;
  long ops, fail_at;
} fake_rank;

static int fake_op(void* p) {
  fake_rank* f = p;
  if (++f->ops == f->fail_at) return -1;
  double t0 = mlxd_bench_now();
  while (mlxd_bench_now() - t0 < f->op_s) {
  }
  return 0;
}

static int one_rank_max(void* p, double* v, int n) {
  (void)p;
  (void)v;
  return n > 0 ? 0 : -1;
}

static void test_measure(void) {
  mlxd_bench_opts o;
  char prog[] = "bench", mt[] = "--min-time=40";
  char* argv[] = {prog, mt, NULL};
  T_EQ_INT(mlxd_bench_parse(2, argv, &o, "bench"), 0);
  fake_rank f = {100e-6, 0, -1};
  mlxd_bench_hooks h = {&f, fake_op, one_rank_max};
  mlxd_bench_result r;
  T_EQ_INT(mlxd_bench_measure(&o, &h, &r), 0);
  T_ASSERT(r.batches >= 5 && r.batches <= 15);
  T_ASSERT(r.iters >= 1);
  T_ASSERT(r.time_s >= 100e-6 && r.min_s <= r.time_s && r.time_s <= r.max_s);
  T_ASSERT(r.cpu_s > 0);
  /* the timed batches took min_time together, unless the batch limit ended them */
  T_ASSERT(r.max_s * (double)(r.iters + 1) * r.batches >= 0.040 || r.batches == 15);
  /* ...and were calibrated: about 40 ms / 5 batches / 100 us = 80 per batch,
   * not one op per batch (the busy wait can only run longer, so fewer) */
  T_ASSERT(r.iters >= 8 && r.iters <= 80);
  T_ASSERT(f.ops > r.iters * r.batches);
  /* fixed counts: no calibration, exactly --iters per batch */
  o.min_time_ms = 0;
  o.iters = 3;
  o.warmup = 0;
  f.ops = 0;
  T_EQ_INT(mlxd_bench_measure(&o, &h, &r), 0);
  T_EQ_INT(r.iters, 3);
  T_EQ_INT(r.batches, 5);
  T_EQ_INT(f.ops, 15);
  /* a failing op fails the row */
  f.ops = 0;
  f.fail_at = 7;
  T_EQ_INT(mlxd_bench_measure(&o, &h, &r), -1);
}

/* --account: an op that touches one fresh page (a minor fault), asks for
 * its parent's pid and sleeps 200 us (two system calls, a voluntary context
 * switch). */
typedef struct acct_op {
  char* pages;
  size_t page, next, npages;
} acct_op;

static int acct_fake_op(void* p) {
  acct_op* a = p;
  if (a->next >= a->npages) return -1;
  a->pages[a->next++ * a->page] = 1;
  (void)syscall(SYS_getppid);
  usleep(200);
  return 0;
}

static void test_account(void) {
  mlxd_bench_opts o;
  char prog[] = "bench", acc[] = "--account", t0[] = "--min-time=0", n[] = "-n", n50[] = "50",
       b[] = "--batches=3", w[] = "-w", w0[] = "0";
  char* argv[] = {prog, acc, t0, n, n50, b, w, w0, NULL};
  T_EQ_INT(mlxd_bench_parse(8, argv, &o, "bench"), 0);
  T_ASSERT(o.account);
  char* argv1[] = {prog, NULL};
  T_EQ_INT(mlxd_bench_parse(1, argv1, &o, "bench"), 0);
  T_ASSERT(!o.account);
  T_EQ_INT(mlxd_bench_parse(8, argv, &o, "bench"), 0);

  /* the tracepoint id as tracefs writes it, and nothing else */
  unsigned long long id = 0;
  T_ASSERT(mlxd_bench_parse_tp_id("443\n", &id) && id == 443);
  T_ASSERT(mlxd_bench_parse_tp_id("7", &id) && id == 7);
  T_ASSERT(!mlxd_bench_parse_tp_id("0\n", &id));
  T_ASSERT(!mlxd_bench_parse_tp_id("-1", &id));
  T_ASSERT(!mlxd_bench_parse_tp_id(" 5", &id));
  T_ASSERT(!mlxd_bench_parse_tp_id("12x", &id));
  T_ASSERT(!mlxd_bench_parse_tp_id("5\n\n", &id));
  T_ASSERT(!mlxd_bench_parse_tp_id("", &id));
  T_ASSERT(!mlxd_bench_parse_tp_id("99999999999999999999999", &id));
  T_ASSERT(id == 7);

  mlxd_bench_acct_open();
  acct_op a = {NULL, (size_t)sysconf(_SC_PAGESIZE), 0, 400};
  a.pages =
      mmap(NULL, a.page * a.npages, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  T_ASSERT(a.pages != MAP_FAILED);
#ifdef MADV_NOHUGEPAGE
  (void)madvise(a.pages, a.page * a.npages, MADV_NOHUGEPAGE); /* one fault per page */
#endif
  mlxd_bench_hooks h = {&a, acct_fake_op, one_rank_max};
  mlxd_bench_result r;
  T_EQ_INT(mlxd_bench_measure(&o, &h, &r), 0);
  T_EQ_INT(r.iters * r.batches, 150);
  T_EQ_INT(a.next, 150);
  double flt = r.acct[MLXD_ACCT_MINFLT], csw = r.acct[MLXD_ACCT_CSW];
  double ins = r.acct[MLXD_ACCT_INSTR], sys = r.acct[MLXD_ACCT_SYSCALL];
  printf(
      "test_bench_args: --account per op: minflt %.3f majflt %.3f csw %.3f instr %.0f sysc %.3f\n",
      flt, r.acct[MLXD_ACCT_MAJFLT], csw, ins, sys);
  /* one fault per page (TSan's shadow: 3 in all) */
  T_ASSERT(flt >= 0.9 && flt <= (T_SANITIZED ? 6.0 : 1.5));
  T_ASSERT(r.acct[MLXD_ACCT_MAJFLT] >= 0 && r.acct[MLXD_ACCT_MAJFLT] < 0.5);
  T_ASSERT(csw >= 0.9);
  /* n/a where not available; else more than nothing, and exactly the op's
   * two system calls (the counter's own ioctl taken off) */
  T_ASSERT(ins == -1 || ins > 100);
  /* (a TSan build makes one system call of its own per batch, 3 in 150 ops) */
  T_ASSERT(sys == -1 || fabs(sys - 2.0) < (T_SANITIZED ? 0.05 : 0.005));
  for (int k = 0; k < MLXD_ACCT_N; k++) T_ASSERT(r.acct_max[k] == r.acct[k]); /* one rank */
  /* sendrecv_bw's counts are per message: scaled, n/a kept */
  mlxd_bench_acct_scale(&r, 0.5);
  T_ASSERT(r.acct[MLXD_ACCT_MINFLT] == 0.5 * flt && r.acct_max[MLXD_ACCT_CSW] == 0.5 * csw);
  T_ASSERT(ins == -1 ? r.acct[MLXD_ACCT_INSTR] == -1 : r.acct[MLXD_ACCT_INSTR] == 0.5 * ins);
  /* without --account nothing is counted */
  o.account = false;
  a.next = 0;
  T_EQ_INT(mlxd_bench_measure(&o, &h, &r), 0);
  for (int k = 0; k < MLXD_ACCT_N; k++) T_ASSERT(r.acct[k] == 0 && r.acct_max[k] == 0);
  munmap(a.pages, a.page * a.npages);
}

int main(int argc, char** argv) {
  T_ASSERT(argc == 2);
  test_account();
  test_rule();
  test_measure();
  const char* tool = argv[1];
  test_sizes();
  test_shapes();
  test_patterns();
  expect_bad(tool, "--op nope", "'nope'");
  expect_bad(tool, "--op all_sum,bogus", "'bogus'");
  expect_bad(tool, "-e 12Q", "'12Q'");
  expect_bad(tool, "-b 0", "-b");
  expect_bad(tool, "-b 1M -e 1K", "--min-bytes");
  expect_bad(tool, "-f 1", "-f");
  expect_bad(tool, "-n 0", "-n");
  expect_bad(tool, "-w -1", "-w");
  expect_bad(tool, "--dtype complex64", "'complex64'");
  expect_bad(tool, "--iters", "--iters");
  expect_bad(tool, "--min-time -1", "--min-time");
  expect_bad(tool, "-t 1x", "'1x'");
  expect_bad(tool, "--batches 0", "--batches");
  expect_bad(tool, "--batches 5 --max-batches 2", "--max-batches");
  expect_bad(tool, "--max-iters 0", "--max-iters");
  expect_bad(tool, "-n 10 --max-iters 5", "--max-iters");
  expect_bad(tool, "--frobnicate", "--frobnicate");
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' --help", tool);
  T_EQ_INT(capture(cmd), 0);
  T_ASSERT(strstr(out, "--min-bytes") && strstr(out, "busbw"));
  T_ASSERT(strstr(out, "untimed pass over every op and size"));
  T_ASSERT(strstr(out, "--min-time") && strstr(out, "--batches") && strstr(out, "--bind"));
  T_ASSERT(strstr(out, "--account") && strstr(out, "sysc (system calls)"));
  printf("test_bench_args: all passed\n");
  return 0;
}

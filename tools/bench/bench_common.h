/* Shared by mlxdist-bench and mpi_ref_bench: options, sizes, the data
 * pattern and its expected results, statistics and the output rows, so both
 * measure and print exactly the same way. Has no dependency on mlxdist or MPI. */
#ifndef MLXD_BENCH_COMMON_H
#define MLXD_BENCH_COMMON_H

#include <stdbool.h>
#include <stddef.h>

typedef enum mlxd_bench_op {
  MLXD_OP_ALL_SUM,
  MLXD_OP_ALL_MAX,
  MLXD_OP_ALL_GATHER,
  MLXD_OP_SUM_SCATTER,
  MLXD_OP_SENDRECV,    /* latency: ping-pong between ranks 0 and 1, half the round trip */
  MLXD_OP_SENDRECV_BW, /* bandwidth: a window of sends from rank 0 to 1, then one ack */
  MLXD_OP_ALL_TO_ALL,  /* a row's size is a rank's whole input (= its output), n parts */
  MLXD_OP_COUNT
} mlxd_bench_op;

/* Element kinds of the dtypes the benchmark knows. */
typedef enum mlxd_bench_kind {
  MLXD_K_BOOL,
  MLXD_K_UINT,
  MLXD_K_INT,
  MLXD_K_FLOAT,
  MLXD_K_F16,
  MLXD_K_BF16
} mlxd_bench_kind;

typedef struct mlxd_bench_dtype {
  const char* name; /* as mlx prints it: "float32", ... */
  size_t size;
  mlxd_bench_kind kind;
} mlxd_bench_dtype;

typedef struct mlxd_bench_opts {
  bool ops[MLXD_OP_COUNT];
  size_t min_bytes, max_bytes;
  double factor;
  int iters;          /* fewest timed iterations per batch (exactly this with min_time_ms 0) */
  int warmup;         /* untimed iterations per size (see mlxd_bench_measure) */
  double min_time_ms; /* timed work per size at least this; 0: no calibration */
  int batches;        /* timed batches per size, at least */
  int max_batches;    /* at most (more while the median is not settled) */
  int max_iters;      /* iterations per batch at most */
  const mlxd_bench_dtype* dtype;
  const char* backend;
  bool csv, check, bind;
  bool account; /* --account: per-op counts of the timed batches (mlxd_bench_acct_*) */
} mlxd_bench_opts;

/* Parse argv. Returns 0 to run, 1 when --help was printed (exit 0), 2 on a
 * bad argument (a "[bench] ..." message was printed; exit 2). */
int mlxd_bench_parse(int argc, char** argv, mlxd_bench_opts* o, const char* prog);

/* The size after bytes in the sweep: bytes * factor, at least bytes + 1 (0 when
 * that would overflow, which ends the sweep like a size above max_bytes). */
size_t mlxd_bench_next_size(const mlxd_bench_opts* o, size_t bytes);

/* sendrecv_bw (as OSU's osu_bw): rank 0 sends a window of messages of one
 * size back to back, rank 1 receives them all and answers with a one-element
 * ack; the row's time is the window's time over its messages. The window is
 * MLXD_BENCH_BW_WINDOW messages, fewer where they would hold more than
 * MLXD_BENCH_BW_WINDOW_BYTES together (each receive of a window is its own
 * result array in mlxdist), at least one. */
#define MLXD_BENCH_BW_WINDOW 64
#define MLXD_BENCH_BW_WINDOW_BYTES ((size_t)64 << 20)
int mlxd_bench_bw_window(size_t bytes);

/* "64M" -> 67108864; K/M/G are powers of 1024. false if not a size. */
bool mlxd_bench_parse_size(const char* s, size_t* out);

const char* mlxd_bench_op_name(mlxd_bench_op op);
const mlxd_bench_dtype* mlxd_bench_find_dtype(const char* name);
/* nccl-tests' bus bandwidth factor for op on n ranks. */
double mlxd_bench_busbw_factor(mlxd_bench_op op, int n);

/* Element counts for a row of `bytes`: per-rank input and output counts and
 * the count/size printed (the size of the full buffer, as nccl-tests does;
 * all_to_all: a rank's whole input, n parts of count/n elements, the count
 * rounded down to a multiple of n, as nccl-tests' alltoall).
 * false when the row is too small for this op on n ranks. */
typedef struct mlxd_bench_shape {
  size_t in_count, out_count, row_count, row_bytes;
} mlxd_bench_shape;
bool mlxd_bench_shape_for(mlxd_bench_op op, size_t bytes, size_t elt, int n, mlxd_bench_shape* s);

/* The pattern: rank r's element i, and the expected reductions. */
double mlxd_bench_value(const mlxd_bench_dtype* dt, int rank, size_t i);
double mlxd_bench_expected_sum(const mlxd_bench_dtype* dt, int n, size_t i);
double mlxd_bench_expected_max(const mlxd_bench_dtype* dt, int n, size_t i);
void mlxd_bench_store(const mlxd_bench_dtype* dt, void* buf, size_t i, double v);
double mlxd_bench_load(const mlxd_bench_dtype* dt, const void* buf, size_t i);
/* Fill count elements with rank's pattern starting at element offset first. */
void mlxd_bench_fill(const mlxd_bench_dtype* dt, void* buf, size_t count, int rank);
/* Number of elements of buf[0..count) that differ from the expectation of
 * op for this rank (outputs: all_sum/all_max full, all_gather concatenation,
 * sum_scatter this rank's block, sendrecv the peer's pattern of `peer`,
 * all_to_all part i from rank i: rank i's input part `rank`). */
size_t mlxd_bench_verify(const mlxd_bench_dtype* dt, mlxd_bench_op op, const void* buf,
                         size_t count, int rank, int n, int peer);

/* ---- the measurement rule (bench_measure.c), the same for both benchmarks ---- */

/* What a benchmark provides: one op of the row being measured (complete on
 * return, 0 on success), and the element-wise maximum over all ranks of
 * v[0..n), in place (every rank gets the same values, so every decision
 * taken from them is the same on every rank). */
typedef struct mlxd_bench_hooks {
  void* ctx;
  int (*run_op)(void* ctx);
  int (*all_max)(void* ctx, double* v, int n);
} mlxd_bench_hooks;

/* --account: what is counted per op over a row's timed batches (the ops
 * themselves: not the all_max after each batch), in this order. */
typedef enum mlxd_bench_acct_kind {
  MLXD_ACCT_MINFLT,  /* minor page faults (getrusage RUSAGE_SELF) */
  MLXD_ACCT_MAJFLT,  /* major page faults (getrusage) */
  MLXD_ACCT_CSW,     /* voluntary + involuntary context switches (getrusage) */
  MLXD_ACCT_INSTR,   /* user-space instructions (perf_event_open, every thread) */
  MLXD_ACCT_SYSCALL, /* system calls (the tracepoint raw_syscalls:sys_enter, every thread) */
  MLXD_ACCT_N
} mlxd_bench_acct_kind;

/* One row's figures. Times are seconds per op; a batch's time is its wall
 * time divided by its iterations, the slowest rank's. */
typedef struct mlxd_bench_result {
  double time_s;       /* median over the batches */
  double min_s, max_s; /* fastest and slowest batch */
  double cpu_s;        /* this process's CPU seconds per op in the timed batches */
  long iters;          /* iterations per batch (their mean) */
  int batches;         /* batches run */
  /* --account (else 0): counts per op in the timed batches, this rank's and
   * the maximum over the ranks; < 0: n/a (not counted here, or on some rank) */
  double acct[MLXD_ACCT_N], acct_max[MLXD_ACCT_N];
} mlxd_bench_result;

/* Measure one row: warm-up (o->warmup ops; beyond the first only as many as
 * fit in half of min_time_ms), calibration of the iterations per batch from
 * the warm-up (mlxd_bench_batch_iters), then o->batches timed batches, and
 * more (up to max_batches, while the timed total is under twice min_time_ms)
 * as long as mlxd_bench_unsettled says the median is not pinned down.
 * Returns 0, or -1 when an op or an all_max failed (nothing printed). */
int mlxd_bench_measure(const mlxd_bench_opts* o, const mlxd_bench_hooks* h, mlxd_bench_result* r);

/* --account. Open the counters of this process, disabled (every counter
 * that cannot be opened is n/a, with its reason kept; nothing fails). The
 * perf counters count the threads made after this call (inherit), so call it
 * before the library under test starts its threads; mlxd_bench_measure calls
 * it itself when it was not. Enabled only around the ops of a timed batch. */
void mlxd_bench_acct_open(void);
/* Print on stderr, once, each counter that is n/a and why (call on rank 0). */
void mlxd_bench_acct_report(void);
/* Scale a row's counts per op by f (sendrecv_bw: per message). */
void mlxd_bench_acct_scale(mlxd_bench_result* r, double f);
/* A tracepoint id as tracefs writes it: a positive decimal integer, one
 * trailing newline allowed. false otherwise. */
bool mlxd_bench_parse_tp_id(const char* s, unsigned long long* id);

/* Pure parts of the rule (tested on their own). */
/* Warm-up ops after the first one, which took first_s (max over ranks). */
int mlxd_bench_warm_rest(const mlxd_bench_opts* o, double first_s);
/* Iterations per batch for an op taking est_s: enough for the batches to
 * take min_time_ms together, within [iters, max_iters]; iters when
 * min_time_ms is 0. */
long mlxd_bench_batch_iters(const mlxd_bench_opts* o, double est_s);
/* The batch limit in effect: max_batches, or 3 x batches when it is 0. */
int mlxd_bench_batch_limit(const mlxd_bench_opts* o);
/* true when the median of the batch times t[0..n) is not yet settled: its
 * standard error, estimated from the median absolute deviation
 * (1.2533 x 1.4826 x MAD / sqrt(n)), exceeds MLXD_BENCH_SETTLED of it. */
#define MLXD_BENCH_SETTLED 0.02
bool mlxd_bench_unsettled(const double* t, int n);

/* --bind: pin every thread of this process to CPU (rank mod online CPUs).
 * 0, or -1 after printing why. */
int mlxd_bench_bind(int rank);

/* Seconds: monotonic wall clock, and this process's CPU time (all threads). */
double mlxd_bench_now(void);
double mlxd_bench_cpu(void);
/* Median of v[0..n) (sorts v). */
double mlxd_bench_median(double* v, int n);

/* Output. impl names the implementation ("mlxdist ring", "MPI"). */
void mlxd_bench_print_title(const mlxd_bench_opts* o, const char* impl, int n);
void mlxd_bench_print_header(const mlxd_bench_opts* o, mlxd_bench_op op);
/* r: the row's figures (times per op; sendrecv: already halved;
 * sendrecv_bw: already divided by the window); check:
 * "ok", "FAIL" or "-". */
void mlxd_bench_print_row(const mlxd_bench_opts* o, mlxd_bench_op op, int n,
                          const mlxd_bench_shape* s, const mlxd_bench_result* r, const char* check);

#endif

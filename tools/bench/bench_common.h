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
  MLXD_OP_SENDRECV,
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
  int iters, warmup;
  const mlxd_bench_dtype* dtype;
  const char* backend;
  bool csv, check;
} mlxd_bench_opts;

/* Parse argv. Returns 0 to run, 1 when --help was printed (exit 0), 2 on a
 * bad argument (a "[bench] ..." message was printed; exit 2). */
int mlxd_bench_parse(int argc, char** argv, mlxd_bench_opts* o, const char* prog);

/* The size after bytes in the sweep: bytes * factor, at least bytes + 1 (0 when
 * that would overflow, which ends the sweep like a size above max_bytes). */
size_t mlxd_bench_next_size(const mlxd_bench_opts* o, size_t bytes);

/* "64M" -> 67108864; K/M/G are powers of 1024. false if not a size. */
bool mlxd_bench_parse_size(const char* s, size_t* out);

const char* mlxd_bench_op_name(mlxd_bench_op op);
const mlxd_bench_dtype* mlxd_bench_find_dtype(const char* name);
/* nccl-tests' bus bandwidth factor for op on n ranks. */
double mlxd_bench_busbw_factor(mlxd_bench_op op, int n);

/* Element counts for a row of `bytes`: per-rank input and output counts and
 * the count/size printed (the size of the full buffer, as nccl-tests does).
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
 * sum_scatter this rank's block, sendrecv the peer's pattern of `peer`). */
size_t mlxd_bench_verify(const mlxd_bench_dtype* dt, mlxd_bench_op op, const void* buf,
                         size_t count, int rank, int n, int peer);

/* Seconds: monotonic wall clock, and this process's CPU time (all threads). */
double mlxd_bench_now(void);
double mlxd_bench_cpu(void);
/* Median of v[0..n) (sorts v). */
double mlxd_bench_median(double* v, int n);

/* Output. impl names the implementation ("mlxdist ring", "MPI"). */
void mlxd_bench_print_title(const mlxd_bench_opts* o, const char* impl, int n);
void mlxd_bench_print_header(const mlxd_bench_opts* o, mlxd_bench_op op);
/* time_us: the per-op time; cpu_us: process CPU per op; check: "ok", "FAIL" or "-". */
void mlxd_bench_print_row(const mlxd_bench_opts* o, mlxd_bench_op op, int n,
                          const mlxd_bench_shape* s, double time_us, double cpu_us,
                          const char* check);

#endif

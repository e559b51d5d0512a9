/* The mpi plugin's all_to_all in pieces (public API only), run under mpirun.
 *
 *   mpi_a2a pieces   parts around the chunk bound: the test sets
 *                    MLXDIST_MPI_CHUNK_BYTES=1000000, so parts of 1000000
 *                    bytes go whole, 1000001 in two pieces (the last of one
 *                    byte) and 2500000 in three (the last short); uint8,
 *                    int16, float32 and complex64 parts; a 2-d array; a
 *                    split group; then an all_sum to show the group is in
 *                    step. Every byte depends on (source, destination,
 *                    offset), so a piece placed at the wrong offset or
 *                    taken from the wrong rank is caught.
 *   mpi_a2a big      parts of 2 GiB + 8 bytes (above INT_MAX: pieces of the
 *                    default 1 GiB bound), 2 ranks: each rank holds 8 GiB
 *                    and more; skipped (exit 77) unless /proc/meminfo's
 *                    MemAvailable has room for every rank on this host and
 *                    half as much again (24 GiB for 2 ranks). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mlx/c/mlx.h"
#include "testutil.h"

static int g_rank, g_size;

/* The byte rank src sends rank dst at offset i of its part. */
static unsigned char byte_of(int src, int dst, size_t i) {
  return (unsigned char)((i * 131u + (size_t)src * 29u + (size_t)dst * 7u + (i >> 12)) & 0xFF);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* all_to_all of parts of part_bytes (a whole number of dtype d's elements)
 * on g (rank gr of gs), as rows of `cols` elements when cols > 0 (2-d). */
static void check(mlx_distributed_group g, int gr, int gs, mlx_dtype d, size_t part_bytes,
                  int cols) {
  size_t esz = mlx_dtype_size(d), total = part_bytes * (size_t)gs;
  unsigned char* buf = malloc(total ? total : 1);
  T_ASSERT(buf != NULL);
  for (int j = 0; j < gs; j++)
    for (size_t i = 0; i < part_bytes; i++) buf[(size_t)j * part_bytes + i] = byte_of(gr, j, i);
  size_t elems = total / esz;
  int shape[2] = {(int)elems, 1};
  int ndim = 1;
  if (cols > 0) {
    shape[0] = (int)(elems / (size_t)cols);
    shape[1] = cols;
    ndim = 2;
  }
  mlx_array x = mlx_array_new_data(buf, shape, ndim, d), r = mlx_array_new();
  mlx_stream s = mlx_stream_new();
  double t0 = now_s();
  T_EQ_INT(mlx_distributed_all_to_all(&r, x, g, s), 0);
  if (mlx_array_eval(r) != 0)
    T_FAIL("all_to_all of %zu-byte parts: %s", part_bytes, t_last_error());
  double dt = now_s() - t0;
  T_EQ_INT((int)mlx_array_ndim(r), ndim);
  T_ASSERT(mlx_array_nbytes(r) == total);
  const void* data = d == MLX_INT16       ? (const void*)mlx_array_data_int16(r)
                     : d == MLX_FLOAT32   ? (const void*)mlx_array_data_float32(r)
                     : d == MLX_COMPLEX64 ? (const void*)mlx_array_data_complex64(r)
                                          : (const void*)mlx_array_data_uint8(r);
  T_ASSERT(data != NULL || total == 0);
  const unsigned char* got = data;
  for (int src = 0; src < gs; src++)
    for (size_t i = 0; i < part_bytes; i++) {
      unsigned char want = byte_of(src, gr, i);
      if (got[(size_t)src * part_bytes + i] != want)
        T_FAIL(
            "rank %d of %d: all_to_all of %zu-byte parts (dtype %d): byte %zu of part %d is %u, "
            "expected %u",
            gr, gs, part_bytes, (int)d, i, src, got[(size_t)src * part_bytes + i], want);
    }
  if (g_rank == 0)
    printf("all_to_all: %d ranks, parts of %zu bytes, dtype %d%s: ok (%.3f s)\n", gs, part_bytes,
           (int)d, cols > 0 ? ", 2-d" : "", dt);
  mlx_array_free(x), mlx_array_free(r);
  mlx_stream_free(s);
  free(buf);
}

static void in_step(mlx_distributed_group g, int gs) {
  float one = 1.0f;
  int shape[1] = {1};
  mlx_array x = mlx_array_new_data(&one, shape, 1, MLX_FLOAT32), r = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_sum(&r, x, g, mlx_stream_new()), 0);
  T_EQ_INT(mlx_array_eval(r), 0);
  T_CHECK(mlx_array_data_float32(r)[0] == (float)gs);
  mlx_array_free(x), mlx_array_free(r);
}

static int run_pieces(mlx_distributed_group g) {
  check(g, g_rank, g_size, MLX_UINT8, 1000000, 0);         /* one piece, exactly the bound */
  check(g, g_rank, g_size, MLX_UINT8, 1000001, 0);         /* two, the last of one byte */
  check(g, g_rank, g_size, MLX_UINT8, 2500000, 0);         /* three, the last short */
  check(g, g_rank, g_size, MLX_INT16, 2000002, 0);         /* three */
  check(g, g_rank, g_size, MLX_FLOAT32, 2500000, 0);       /* three */
  check(g, g_rank, g_size, MLX_COMPLEX64, 1600000, 20000); /* two, rows of 20000 */
  check(g, g_rank, g_size, MLX_UINT8, 0, 0);               /* empty parts */
  in_step(g, g_size);
  /* A split group: ranks of one parity, parts in pieces. */
  mlx_distributed_group sub = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&sub, g, g_rank % 2, g_rank), 0);
  int ss = mlx_distributed_group_size(sub), sr = mlx_distributed_group_rank(sub);
  if (ss > 1) check(sub, sr, ss, MLX_UINT8, 2500000, 0);
  mlx_distributed_group_free(sub);
  in_step(g, g_size);
  return 0;
}

/* MemAvailable in bytes, or 0. */
static size_t mem_available(void) {
  FILE* f = fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  size_t kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
  fclose(f);
  return kb * 1024;
}

static int run_big(mlx_distributed_group g) {
  size_t part = ((size_t)2 << 30) + 8; /* above INT_MAX bytes */
  /* in and out of every rank, plus half again for MPI's copies, the other
   * processes of this host and the page cache: the test must not push a
   * shared machine into swapping or the OOM killer */
  size_t need = part * (size_t)g_size * 2 * (size_t)g_size;
  size_t have = mem_available();
  int skip = have < need + need / 2;
  /* Every rank decides alike: rank 0's answer, through the group. */
  int shape[1] = {1};
  mlx_array x = mlx_array_new_data(&skip, shape, 1, MLX_INT32), r = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_max(&r, x, g, mlx_stream_new()), 0);
  T_EQ_INT(mlx_array_eval(r), 0);
  skip = mlx_array_data_int32(r)[0];
  mlx_array_free(x), mlx_array_free(r);
  if (skip) {
    if (g_rank == 0)
      printf("mpi_a2a big: skipped: %d ranks need about %.1f GiB, MemAvailable is %.1f GiB\n",
             g_size, (double)(need + need / 2) / (1u << 30), (double)have / (1u << 30));
    return 77;
  }
  check(g, g_rank, g_size, MLX_UINT8, part, 8); /* 2-d: axis 0 fits in an int */
  return 0;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "pieces";
  t_capture_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "mpi") != 0) T_FAIL("init(mpi): %s", t_last_error());
  g_rank = mlx_distributed_group_rank(g);
  g_size = mlx_distributed_group_size(g);
  T_ASSERT(g_size >= 2);
  int rc = strcmp(mode, "big") == 0 ? run_big(g) : run_pieces(g);
  mlx_distributed_group_free(g);
  if (rc == 0) {
    T_EXPECT_NO_ERROR();
    printf("rank %d: mpi_a2a %s %s\n", g_rank, mode, t_check_failures() ? "FAILED" : "OK");
    return t_exit_status();
  }
  return rc;
}

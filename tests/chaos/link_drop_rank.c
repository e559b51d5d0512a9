/* Rank program of tests/chaos/link_drop.sh (public API only): two ranks over TCP run 64 KiB
 * all_sums back to back, so that bytes are always in flight between them, until rank 0's
 * deadline; the driver drops every packet between them for a while meanwhile. Every result is
 * checked.
 *
 *   link_drop_rank SECONDS
 *
 * Each all_sum carries rank 0's "go on" flag in element 0 (1 while its clock is before
 * SECONDS after the first sum, 0 after), so both ranks stop after the same sum. Output: "LINK
 * READY rank R" after the first sum, "LINK DONE rank R sums N longest S" at the end (S: the
 * longest sum in seconds), "LINK FAIL rank R sum N after S s: MESSAGE" on a failure (exit 3). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "mlx/c/mlx.h"
#include "ranks.h"
#include "testutil.h"

#define N 16384 /* int32 values: 64 KiB */

int main(int argc, char** argv) {
  t_capture_errors();
  setvbuf(stdout, NULL, _IOLBF, 0);
  double secs = argc == 2 ? atof(argv[1]) : 0;
  if (!(secs > 0)) {
    fprintf(stderr, "usage: link_drop_rank SECONDS\n");
    return 2;
  }
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) T_FAIL("init ring: %s", t_last_error());
  int rank = mlx_distributed_group_rank(g);
  T_EQ_INT(mlx_distributed_group_size(g), 2);
  int32_t* v = malloc(sizeof(int32_t) * N);
  T_ASSERT(v);
  int shape[1] = {N};
  double end = 0, longest = 0;
  long it = 0;
  for (;; it++) {
    double t0 = t_now();
    v[0] = rank == 0 ? (it == 0 || t0 < end) : 0;
    for (int j = 1; j < N; j++) v[j] = (int32_t)((it * 31 + j) % 1000 + rank * 1000);
    mlx_array x = mlx_array_new_data(v, shape, 1, MLX_INT32), y = mlx_array_new();
    if (mlx_distributed_all_sum(&y, x, g, mlx_stream_new()) != 0 || mlx_array_eval(y) != 0) {
      printf("LINK FAIL rank %d sum %ld after %.1f s: %s\n", rank, it, t_now() - t0,
             t_last_error());
      return 3;
    }
    const int32_t* d = mlx_array_data_int32(y);
    T_ASSERT(d);
    for (int j = 1; j < N; j++)
      T_REQUIREF(d[j] == (int32_t)(2 * ((it * 31 + j) % 1000) + 1000), "sum %ld element %d: %d", it,
                 j, d[j]);
    int go = d[0];
    mlx_array_free(x);
    mlx_array_free(y);
    double dt = t_now() - t0;
    if (dt > longest) longest = dt;
    if (it == 0) {
      end = t_now() + secs;
      printf("LINK READY rank %d\n", rank);
    }
    if (!go) break;
  }
  free(v);
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  printf("LINK DONE rank %d sums %ld longest %.1f\n", rank, it + 1, longest);
  return 0;
}

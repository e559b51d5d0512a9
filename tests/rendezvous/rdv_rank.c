/* A rank for the rendezvous tests (public API only): strict ring init, then
 * all_sum and all_gather checked against what every rank contributed.
 * Prints "rank R of N: rendezvous ok" and exits 0, or exits 1. */
#include <mlx/c/mlx.h>
#include <stdio.h>

int main(void) {
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) {
    fprintf(stderr, "rdv_rank: init failed\n");
    return 1;
  }
  int rank = -1, size = 0;
  mlx_distributed_group_get_rank(&rank, g);
  mlx_distributed_group_get_size(&size, g);
  mlx_stream s = mlx_stream_new();
  mlx_array x = mlx_array_new_float32((float)(rank + 1));
  mlx_array sum = mlx_array_new(), all = mlx_array_new();
  int bad = 0;
  float total = 0;
  if (mlx_distributed_all_sum(&sum, x, g, s) != 0 || mlx_array_item_float32(&total, sum) != 0 ||
      total != (float)(size * (size + 1) / 2)) {
    fprintf(stderr, "rank %d: all_sum gave %g, expected %d\n", rank, (double)total,
            size * (size + 1) / 2);
    bad = 1;
  }
  if (!bad && mlx_distributed_all_gather(&all, x, g, s) == 0 && mlx_array_eval(all) == 0) {
    const float* v = mlx_array_data_float32(all);
    for (int r = 0; r < size; r++)
      if (!v || v[r] != (float)(r + 1)) {
        fprintf(stderr, "rank %d: all_gather[%d] wrong\n", rank, r);
        bad = 1;
        break;
      }
  } else {
    bad = 1;
  }
  if (!bad) printf("rank %d of %d: rendezvous ok\n", rank, size);
  mlx_array_free(x);
  mlx_array_free(sum);
  mlx_array_free(all);
  mlx_stream_free(s);
  mlx_distributed_group_free(g);
  return bad;
}

/* The smallest mlxdist program: every rank contributes its rank number and
 * prints the sum. Run: mlxdist-launch -n 4 -- ./hello */
#include <mlx/c/mlx.h>
#include <stdio.h>

int main(void) {
  mlx_distributed_group group = mlx_distributed_group_new();
  if (mlx_distributed_init(&group, false, NULL) != 0) return 1; /* non-strict: size one if alone */
  int rank = 0, size = 0;
  mlx_distributed_group_get_rank(&rank, group);
  mlx_distributed_group_get_size(&size, group);

  mlx_array x = mlx_array_new_float32((float)rank);
  mlx_array sum = mlx_array_new();
  mlx_stream stream = mlx_stream_new(); /* null stream: the backend picks its own */
  mlx_distributed_all_sum(&sum, x, group, stream);
  float total = 0;
  mlx_array_item_float32(&total, sum); /* waits for the result */
  printf("rank %d of %d: sum of ranks = %g\n", rank, size, total);

  mlx_array_free(sum);
  mlx_array_free(x);
  mlx_stream_free(stream);
  mlx_distributed_group_free(group);
  return 0;
}

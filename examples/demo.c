/* The main demo: sum, gather, split and point-to-point on a real group.
 * Run on one host with: mlxdist-launch -n 4 -- ./demo
 * Each rank prints what it did; rank 0 checks the results and the process
 * exits non-zero if anything came out wrong. */
#include <mlx/c/mlx.h>
#include <stdio.h>
#include <stdlib.h>

static int failures;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      failures++;                                          \
      fprintf(stderr, "demo: check failed: " __VA_ARGS__); \
    }                                                      \
  } while (0)

int main(void) {
  mlx_distributed_group world = mlx_distributed_group_new();
  if (mlx_distributed_init(&world, true, NULL) != 0) return 1;
  int rank = mlx_distributed_group_rank(world), size = mlx_distributed_group_size(world);
  mlx_stream comm = mlx_stream_new(); /* null stream: the group's communication stream */

  /* all_sum of [rank, rank*10, 1]: every rank gets [sum r, 10 sum r, size] */
  float mine[3] = {(float)rank, (float)rank * 10.0f, 1.0f};
  int shape[1] = {3};
  mlx_array x = mlx_array_new_data(mine, shape, 1, MLX_FLOAT32);
  mlx_array sum = mlx_array_new();
  mlx_distributed_all_sum(&sum, x, world, comm);
  const float* s = mlx_array_data_float32(sum);
  float expect = (float)(size * (size - 1) / 2);
  CHECK(s && s[0] == expect && s[1] == 10 * expect && s[2] == (float)size, "all_sum\n");
  printf("rank %d/%d all_sum    -> [%g, %g, %g]\n", rank, size, s ? s[0] : -1, s ? s[1] : -1,
         s ? s[2] : -1);

  /* all_gather of each rank's id: [0, 1, ..., size-1] */
  mlx_array id = mlx_array_new_int(rank);
  mlx_array ids = mlx_array_new();
  mlx_distributed_all_gather(&ids, id, world, comm);
  const int32_t* g = mlx_array_data_int32(ids);
  printf("rank %d/%d all_gather -> [", rank, size);
  for (int i = 0; g && i < size; i++) {
    printf(i ? ", %d" : "%d", g[i]);
    CHECK(g[i] == i, "all_gather[%d]\n", i);
  }
  printf("]\n");

  /* split into even and odd ranks, then sum within each half */
  mlx_distributed_group half = mlx_distributed_group_new();
  mlx_distributed_group_split(&half, world, rank % 2, -1);
  int hrank = 0, hsize = 0;
  mlx_distributed_group_get_rank(&hrank, half);
  mlx_distributed_group_get_size(&hsize, half);
  mlx_array one = mlx_array_new_int(rank);
  mlx_array hsum = mlx_array_new();
  mlx_distributed_all_sum(&hsum, one, half, comm);
  int32_t hs = -1;
  mlx_array_item_int32(&hs, hsum);
  int hexpect = 0;
  for (int r = rank % 2; r < size; r += 2) hexpect += r;
  CHECK(hs == hexpect, "split sum %d != %d\n", hs, hexpect);
  printf("rank %d/%d split(%s) -> rank %d/%d, sum of its ranks = %d\n", rank, size,
         rank % 2 ? "odd" : "even", hrank, hsize, hs);

  /* pass a token around the ring with send / recv_like */
  if (size > 1) {
    mlx_array token = mlx_array_new_int(rank * 100);
    mlx_array sent = mlx_array_new(), got = mlx_array_new();
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    mlx_distributed_send(&sent, token, next, world, comm);
    mlx_distributed_recv_like(&got, token, prev, world, comm);
    int32_t v = -1;
    mlx_array_eval(sent);
    mlx_array_item_int32(&v, got);
    CHECK(v == prev * 100, "recv %d\n", v);
    printf("rank %d/%d recv from %d -> %d\n", rank, size, prev, v);
    mlx_array_free(token), mlx_array_free(sent), mlx_array_free(got);
  }

  mlx_array_free(x), mlx_array_free(sum), mlx_array_free(id), mlx_array_free(ids);
  mlx_array_free(one), mlx_array_free(hsum);
  mlx_distributed_group_free(half);
  mlx_distributed_group_free(world);
  mlx_stream_free(comm);
  if (rank == 0) printf(failures ? "demo: FAILED\n" : "demo: all results correct\n");
  return failures ? 1 : 0;
}

/* Where no GPU can be used (every CI machine): the GPU provider, GPU streams,
 * the nccl kind and plugin all say why, and nothing hangs or crashes.
 *   test_nccl_none cudart-missing   run with MLXDIST_CUDART naming a file that does not exist
 *   test_nccl_none cudart-bad       MLXDIST_CUDART set (here) to a value its check refuses
 *   test_nccl_none here             this machine's own answer (CUDA installed or not) */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/gpu.h"
#include "mlx/c/mlx.h"
#include "testutil.h"

static void check_gpu_refused(const char* why) {
  mlx_stream s = mlx_default_gpu_stream_new();
  T_ASSERT(s.ctx == NULL);
  T_EXPECT_ERROR("[stream] no GPU is available: ", why);
  mlx_device gpu = mlx_device_new_type(MLX_GPU, 0);
  s = mlx_stream_new_device(gpu);
  T_ASSERT(s.ctx == NULL);
  T_EXPECT_ERROR("[stream] no GPU is available: ", why);
  mlx_device_free(gpu);
  int n = -1;
  T_EQ_INT(mlx_device_count(&n, MLX_GPU), 0);
  T_EQ_INT(n, 0);
  /* the provider's own calls fail too, naming the reason */
  mlxd_status st;
  mlxd_status_clear(&st);
  void* native = NULL;
  T_ASSERT(mlxd_gpu_stream_create(0, &native, &st) == MLXD_EUNAVAIL);
  T_ASSERT(strstr(st.msg, why) != NULL);
  T_ASSERT(mlxd_gpu_alloc_managed(64, &st) == NULL);
  T_ASSERT(mlxd_gpu_stream_sync(NULL, &st) == MLXD_EUNAVAIL);
  char buf[8];
  T_ASSERT(mlxd_gpu_copy(buf, buf, sizeof buf, NULL, &st) == MLXD_EUNAVAIL);
  /* CPU streams are untouched */
  mlx_stream cpu = mlx_default_cpu_stream_new();
  T_ASSERT(cpu.ctx != NULL);
  T_EQ_INT(mlx_synchronize(cpu), 0);
  mlx_stream_free(cpu);
}

/* nccl: unavailable, and a strict init by name fails with the reason, within a bound. */
static void check_nccl(const char* want) {
  T_ASSERT(!mlx_distributed_is_available("nccl"));
  setenv("MLX_RANK", "0", 1);
  setenv("MLX_WORLD_SIZE", "2", 1);
  setenv("NCCL_HOST_IP", "127.0.0.1", 1);
  setenv("NCCL_PORT", "1", 1);
  mlx_distributed_group g = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_init(&g, true, "nccl") != 0);
  const char* e = t_last_error();
  T_REQUIREF(strstr(e, "[nccl] ") != NULL && strstr(e, want) != NULL, "want '%s' in '%s'", want, e);
  t_clear_errors();
  T_ASSERT(g.ctx == NULL);
}

int main(int argc, char** argv) {
  t_capture_errors();
  /* cudart-bad: a value the tunable's check refuses (a control character) */
  bool bad = argc > 1 && strcmp(argv[1], "cudart-bad") == 0;
  if (bad) setenv("MLXDIST_CUDART", "libcudart.so.13\n", 1);
  const mlxd_gpu_info* g = mlxd_gpu_probe();
  if (g->count > 0) {
    printf("SKIP: this machine has %d GPU(s); scripts/gpu-check.sh tests them\n", g->count);
    return 77;
  }
  if (argc > 1 && strcmp(argv[1], "cudart-missing") == 0) {
    const char* path = getenv("MLXDIST_CUDART");
    T_REQUIRE(path && *path);
    char want[300];
    snprintf(want, sizeof want, "no CUDA runtime (could not load %s)", path);
    T_REQUIREF(strcmp(g->why, want) == 0, "'%s'", g->why);
    T_ASSERT(!g->loaded);
    check_gpu_refused(want);
    /* The plugin, where it was built, uses the runtime the core opened, so
     * it must not find one now either, even with the variable gone (a
     * second reading of it would open libcudart.so.13 here). */
    unsetenv("MLXDIST_CUDART");
    check_nccl(getenv("MLXDIST_TEST_NCCL_BUILT") ? "[nccl] no CUDA runtime"
                                                 : "built without NCCL support");
  } else if (bad) {
    /* refused by the tunable's check, named, and nothing else opened */
    T_REQUIREF(strstr(g->why, "no CUDA runtime (") == g->why &&
                   strstr(g->why, "MLXDIST_CUDART") != NULL,
               "'%s'", g->why);
    T_ASSERT(!g->loaded);
    check_gpu_refused("MLXDIST_CUDART");
    /* nccl: unavailable (the plugin opens nothing the core did not), and
     * init refuses the variable itself, as every bad tunable */
    T_ASSERT(!mlx_distributed_is_available("nccl"));
    mlx_distributed_group grp = mlx_distributed_group_new();
    T_ASSERT(mlx_distributed_init(&grp, true, "nccl") != 0);
    T_EXPECT_ERROR("MLXDIST_CUDART=", "control characters");
    T_ASSERT(grp.ctx == NULL);
  } else {
    T_ASSERT(strstr(g->why, "no CUDA runtime (could not load libcudart.so.13, libcudart.so.12)") ==
                 g->why ||
             strstr(g->why, "loaded but cudaGetDeviceCount: ") != NULL);
    printf("this machine: %s\n", g->why);
    check_gpu_refused(g->why);
    check_nccl(getenv("MLXDIST_TEST_NCCL_BUILT") ? (g->loaded ? "no GPU" : "no CUDA runtime")
                                                 : "built without NCCL support");
  }
  return t_exit_status();
}

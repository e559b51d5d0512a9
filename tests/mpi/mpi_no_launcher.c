/* Not under mpirun: init("any") must not start MPI (no singleton MPI_Init),
 * init("mpi") strict must explain what is missing, non-strict gives size one.
 * This program links the MPI library itself only to ask MPI_Initialized()
 * (the plugin loads the same libmpi, so the answer covers its calls too). */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "mlx/c/mlx.h"
#include "testutil.h"

static const char* const k_env[] = {"OMPI_COMM_WORLD_SIZE",
                                    "OMPI_COMM_WORLD_RANK",
                                    "PMI_RANK",
                                    "PMI_SIZE",
                                    "PMI_FD",
                                    "PMI_PORT",
                                    "PMIX_RANK",
                                    "PMIX_NAMESPACE",
                                    "HYDRA_CONTROL_FD",
                                    "MPI_LOCALRANKID",
                                    "MV2_COMM_WORLD_RANK",
                                    "MLX_RANK",
                                    "MLX_HOSTFILE",
                                    "MLX_WORLD_SIZE"};

static void expect_mpi_untouched(void) {
  int init = 1, fin = 1;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  T_EQ_INT(init, 0);
  T_EQ_INT(fin, 0);
}

int main(void) {
  t_capture_errors();
  for (size_t i = 0; i < sizeof k_env / sizeof k_env[0]; i++) unsetenv(k_env[i]);

  /* The plugin is next to libmlxdist in the build tree: available. */
  T_ASSERT(mlx_distributed_is_available("mpi"));
  expect_mpi_untouched();

  mlx_distributed_group g = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init(&g, false, "any"), 0);
  T_EQ_INT(mlx_distributed_group_size(g), 1);
  T_EQ_INT(mlx_distributed_group_rank(g), 0);
  T_EXPECT_NO_ERROR();
  expect_mpi_untouched();

  mlx_distributed_group h = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_init(&h, true, "mpi") != 0);
  T_EXPECT_ERROR("[mpi]", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "mpirun");
  t_clear_errors();
  expect_mpi_untouched();

  T_EQ_INT(mlx_distributed_init(&h, false, "mpi"), 0);
  T_EQ_INT(mlx_distributed_group_size(h), 1);
  T_EXPECT_NO_ERROR();
  expect_mpi_untouched();

  /* mpi cannot take a caller's all-gather */
  mlx_distributed_group k = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_init_with_all_gather(&k, true, "mpi", NULL, NULL, NULL) != 0);
  T_ASSERT(t_error_count() == 1);
  t_clear_errors();
  expect_mpi_untouched();

  mlx_distributed_group_free(g), mlx_distributed_group_free(h), mlx_distributed_group_free(k);
  return 0;
}

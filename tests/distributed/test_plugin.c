/* The plugin loader, in a fresh process per mode (its outcome is cached):
 *   libname    MLX_MPI_LIBNAME names a library that does not exist
 *   emptypath  MLXDIST_PLUGIN_PATH is an empty directory
 *   badabi     MLXDIST_PLUGIN_PATH holds a libmlxdist-mpi.so of another ABI version
 *   smalltable ... one whose plugin table's struct_size is too small
 *   smallops   ... a valid one whose instances' ops table is too small: it
 *              loads, and init fails when it wraps the instance
 *   norun      ... a valid v4 one whose instances set run_kinds without run:
 *              it loads, and init fails when it wraps the instance
 * (bad_plugin.c builds those four.) When a real mpi plugin sits next to
 * libmlxdist or in the install directory, the loader goes on to it after a
 * refused file, so emptypath, badabi and smalltable then expect "available". */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mlx/c/mlx.h"
#include "testutil.h"

static bool exists(const char* dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/libmlxdist-mpi.so", dir);
  struct stat sb;
  return stat(path, &sb) == 0;
}

static void expect_unavailable(const char* a, const char* b, const char* c) {
  T_ASSERT(!mlx_distributed_is_available("mpi"));
  T_EXPECT_NO_ERROR();
  mlx_distributed_group g = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_init(&g, true, "mpi") != 0);
  T_EXPECT_ERROR("[distributed] init: could not start the mpi backend", "[mpi]", a, b, c);
  T_ASSERT(g.ctx == NULL);
  /* "any" says why mpi was skipped */
  T_ASSERT(mlx_distributed_init(&g, true, "any") != 0);
  T_EXPECT_ERROR("mpi: [mpi]", a);
  /* non-strict: a group of one */
  T_EQ_INT(mlx_distributed_init(&g, false, "mpi"), 0);
  T_EXPECT_NO_ERROR();
  T_EQ_INT(mlx_distributed_group_size(g), 1);
  mlx_distributed_group_free(g);
  /* the outcome is cached and stays the same */
  T_ASSERT(!mlx_distributed_is_available("mpi"));
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  unsetenv("MLX_RANK");
  unsetenv("MLX_HOSTFILE");
  unsetenv("MLX_MPI_LIBNAME");
  unsetenv("MLXDIST_PLUGIN_PATH");
  t_capture_errors();
  bool elsewhere = exists(MLXDIST_TEST_LIB_DIR) || exists(MLXDIST_TEST_INSTALL_DIR);

  if (strcmp(mode, "libname") == 0) {
    const char* lib = "/nonexistent/mlxdist-test/libmpi-missing.so.40";
    setenv("MLX_MPI_LIBNAME", lib, 1);
    expect_unavailable("MLX_MPI_LIBNAME", lib, "could not load");
  } else if (strcmp(mode, "emptypath") == 0) {
    char dir[] = "/tmp/mlxdist-plugin-XXXXXX";
    T_ASSERT(mkdtemp(dir) != NULL);
    setenv("MLXDIST_PLUGIN_PATH", dir, 1);
    char want[256];
    snprintf(want, sizeof want, "%s/libmlxdist-mpi.so (no such file)", dir);
    if (elsewhere)
      T_ASSERT(mlx_distributed_is_available("mpi"));
    else
      expect_unavailable("libmlxdist-mpi.so", want, "MLXDIST_PLUGIN_PATH");
    rmdir(dir);
  } else if (strcmp(mode, "badabi") == 0) {
    setenv("MLXDIST_PLUGIN_PATH", MLXDIST_TEST_BAD_PLUGIN_DIR "1:/nonexistent-dir", 1);
    if (elsewhere)
      T_ASSERT(mlx_distributed_is_available("mpi"));
    else
      expect_unavailable(MLXDIST_TEST_BAD_PLUGIN_DIR
                         "1/libmlxdist-mpi.so (mlxdist_plugin_v1 returned a table of ABI "
                         "version 99",
                         "/nonexistent-dir/libmlxdist-mpi.so (no such file)", "expected version 1");
  } else if (strcmp(mode, "smalltable") == 0) {
    setenv("MLXDIST_PLUGIN_PATH", MLXDIST_TEST_BAD_PLUGIN_DIR "2", 1);
    if (elsewhere)
      T_ASSERT(mlx_distributed_is_available("mpi"));
    else
      expect_unavailable(MLXDIST_TEST_BAD_PLUGIN_DIR
                         "2/libmlxdist-mpi.so (its ABI v2 plugin "
                         "table is too small: struct_size 8,",
                         "expected at least", "MLXDIST_PLUGIN_PATH");
  } else if (strcmp(mode, "smallops") == 0) {
    setenv("MLXDIST_PLUGIN_PATH", MLXDIST_TEST_BAD_PLUGIN_DIR "3", 1);
    /* the table is fine: the plugin loads and says it is available */
    T_ASSERT(mlx_distributed_is_available("mpi"));
    mlx_distributed_group g = mlx_distributed_group_new();
    T_ASSERT(mlx_distributed_init(&g, true, "mpi") != 0);
    T_EXPECT_ERROR(
        "[distributed] init: could not start the mpi backend: [mpi] the "
        "plugin " MLXDIST_TEST_BAD_PLUGIN_DIR
        "3/libmlxdist-mpi.so gave an instance whose ops "
        "table is too small (struct_size",
        "ABI v1 needs at least");
    T_ASSERT(g.ctx == NULL);
    T_EQ_INT(mlx_distributed_init(&g, false, "mpi"), 0); /* non-strict: a group of one */
    T_EXPECT_NO_ERROR();
    T_EQ_INT(mlx_distributed_group_size(g), 1);
    mlx_distributed_group_free(g);
  } else if (strcmp(mode, "norun") == 0) {
    /* ABI v4: an instance whose run_kinds names kinds but that has no run */
    setenv("MLXDIST_PLUGIN_PATH", MLXDIST_TEST_BAD_PLUGIN_DIR "4", 1);
    T_ASSERT(mlx_distributed_is_available("mpi"));
    mlx_distributed_group g = mlx_distributed_group_new();
    T_ASSERT(mlx_distributed_init(&g, true, "mpi") != 0);
    T_EXPECT_ERROR("[mpi] the plugin " MLXDIST_TEST_BAD_PLUGIN_DIR
                   "4/libmlxdist-mpi.so gave an instance whose ops table sets run_kinds but no "
                   "run op");
    T_ASSERT(g.ctx == NULL);
  } else {
    T_FAIL("unknown mode '%s' (expected libname, emptypath, badabi, smalltable, smallops or norun)",
           mode);
  }
  T_EXPECT_NO_ERROR();
  printf("test_dist_plugin %s: ok (plugin elsewhere: %s)\n", mode, elsewhere ? "yes" : "no");
  return 0;
}

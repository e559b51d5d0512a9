/* Without the plugin: is_available("mpi") is false and a strict init says why.
 *
 *   mpi_no_plugin <path of libmlxdist's real file> <its soname> <work dir>
 *
 * The parent copies libmlxdist (only it) into <work dir>/lib, makes an empty
 * <work dir>/plugins, and re-executes itself with LD_LIBRARY_PATH=<work dir>/lib
 * and MLXDIST_PLUGIN_PATH=<work dir>/plugins (this program is built without
 * an RPATH). The child checks that it really runs on the copy, so the loader
 * looks only where no plugin exists. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mlx/c/mlx.h"
#include "testutil.h"

static void copy_file(const char* from, const char* to) {
  FILE* in = fopen(from, "rb");
  if (!in) T_FAIL("cannot open %s: %s", from, strerror(errno));
  FILE* out = fopen(to, "wb");
  if (!out) T_FAIL("cannot create %s: %s", to, strerror(errno));
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) T_ASSERT(fwrite(buf, 1, n, out) == n);
  fclose(in);
  T_ASSERT(fclose(out) == 0);
}

static int child(const char* libdir) {
  t_capture_errors();
  /* The libmlxdist in use must be the copy. */
  FILE* maps = fopen("/proc/self/maps", "r");
  T_ASSERT(maps);
  char line[4096];
  bool found = false;
  while (fgets(line, sizeof line, maps))
    if (strstr(line, "libmlxdist") && strstr(line, libdir)) found = true;
  fclose(maps);
  if (!found) T_FAIL("libmlxdist was not loaded from %s (an RPATH wins?)", libdir);

  T_ASSERT(!mlx_distributed_is_available("mpi"));
  T_EXPECT_NO_ERROR();
  mlx_distributed_group g = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_init(&g, true, "mpi") != 0);
  T_EXPECT_ERROR("mpi", "libmlxdist-mpi.so", "MLXDIST_PLUGIN_PATH");
  t_clear_errors();
  T_EQ_INT(mlx_distributed_init(&g, false, "mpi"), 0);
  T_EQ_INT(mlx_distributed_group_size(g), 1);
  T_EXPECT_NO_ERROR();
  mlx_distributed_group_free(g);
  printf("mpi_no_plugin: child OK\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "--child") == 0) return child(argv[2]);
  if (argc != 4) T_FAIL("usage: mpi_no_plugin <libmlxdist file> <soname> <work dir>");
  char lib[4096], plug[4096], dst[8192];
  snprintf(lib, sizeof lib, "%s/lib", argv[3]);
  snprintf(plug, sizeof plug, "%s/plugins", argv[3]);
  mkdir(argv[3], 0755);
  mkdir(lib, 0755);
  mkdir(plug, 0755);
  snprintf(dst, sizeof dst, "%s/%s", lib, argv[2]);
  copy_file(argv[1], dst);
  /* Make sure no plugin lies in either directory. */
  snprintf(dst, sizeof dst, "%s/libmlxdist-mpi.so", lib);
  unlink(dst);
  snprintf(dst, sizeof dst, "%s/libmlxdist-mpi.so", plug);
  unlink(dst);
  /* A plugin in the install directory would be found too: then this check cannot run. */
  struct stat sb;
  snprintf(dst, sizeof dst, "%s/libmlxdist-mpi.so", MLXDIST_INSTALL_LIBDIR);
  if (stat(dst, &sb) == 0) {
    printf("SKIP: %s is installed; the loader would find it\n", dst);
    return 77;
  }
  setenv("LD_LIBRARY_PATH", lib, 1);
  setenv("MLXDIST_PLUGIN_PATH", plug, 1);
  unsetenv("MLX_MPI_LIBNAME");
  pid_t pid = fork();
  T_ASSERT(pid >= 0);
  if (pid == 0) {
    execl("/proc/self/exe", argv[0], "--child", lib, (char*)NULL);
    _exit(127);
  }
  int status = 0;
  T_ASSERT(waitpid(pid, &status, 0) == pid);
  T_ASSERT(WIFEXITED(status));
  T_EQ_INT(WEXITSTATUS(status), 0);
  return 0;
}

/* Bootstrapping a ring group through a shared directory.
 *
 *   MLX_RANK=r MLX_WORLD_SIZE=n ./bootstrap_shared_dir DIR [TAG]
 *
 * Every rank runs this with the same DIR (a local or network file system).
 * No hostfile is needed: the ring backend listens on ephemeral ports and
 * exchanges its addresses through the callback below. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap_examples.h"
#include "mlx/c/mlx.h"

void shared_dir_init(shared_dir* sd, const char* dir, const char* tag, double timeout_s) {
  memset(sd, 0, sizeof *sd);
  snprintf(sd->dir, sizeof sd->dir, "%s", dir);
  snprintf(sd->tag, sizeof sd->tag, "%s", tag);
  sd->timeout_s = timeout_s;
}

void shared_dir_abort(const shared_dir* sd) {
  char path[300];
  snprintf(path, sizeof path, "%s/%s.abort", sd->dir, sd->tag);
  int fd = open(path, O_WRONLY | O_CREAT, 0644);
  if (fd >= 0) close(fd);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Read exactly n bytes of path into buf: 1 done, 0 not there (yet), -1 error. */
static int read_exact(const char* path, void* buf, size_t n) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return errno == ENOENT ? 0 : -1;
  size_t got = 0;
  while (got < n) {
    ssize_t k = read(fd, (char*)buf + got, n - got);
    if (k <= 0) break;
    got += (size_t)k;
  }
  close(fd);
  return got == n ? 1 : -1;
}

int shared_dir_all_gather(void* dst, const void* src, size_t n, int rank, int size, void* payload) {
  shared_dir* sd = payload;
  int round = sd->round++;
  char path[300], tmp[320], abort_path[300];
  snprintf(abort_path, sizeof abort_path, "%s/%s.abort", sd->dir, sd->tag);

  /* publish this rank's bytes atomically: nobody sees a half-written file */
  snprintf(path, sizeof path, "%s/%s.%d.%d", sd->dir, sd->tag, round, rank);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE* f = fopen(tmp, "wb");
  if (!f) return 4;
  size_t w = fwrite(src, 1, n, f);
  if (fclose(f) != 0 || w != n || rename(tmp, path) != 0) return 4;

  /* wait (bounded) for everyone's file, watching for the abort marker */
  double deadline = now_s() + sd->timeout_s;
  for (int r = 0; r < size; r++) {
    snprintf(path, sizeof path, "%s/%s.%d.%d", sd->dir, sd->tag, round, r);
    for (;;) {
      int rc = read_exact(path, (char*)dst + (size_t)r * n, n);
      if (rc == 1) break;
      if (rc < 0) return 4;
      if (access(abort_path, F_OK) == 0) return 2;
      if (now_s() > deadline) {
        shared_dir_abort(sd); /* do not leave the others waiting for us */
        return 3;
      }
      usleep(2000);
    }
  }
  return 0;
}

#ifndef MLXDIST_EXAMPLE_NO_MAIN
int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: MLX_RANK=r MLX_WORLD_SIZE=n %s DIR [TAG]\n", argv[0]);
    return 2;
  }
  /* Every rank of one job uses the same DIR; use a fresh one per job (stale files
   * from an earlier job with the same tag would be read as this job's). */
  if (mkdir(argv[1], 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "cannot create %s: %s\n", argv[1], strerror(errno));
    return 1;
  }
  shared_dir sd;
  shared_dir_init(&sd, argv[1], argc > 2 ? argv[2] : "mlxdist", 60.0);
  mlx_distributed_group g = mlx_distributed_group_new();
  /* strict: fail loudly (the default error handler prints and exits) */
  mlx_distributed_init_with_all_gather(&g, true, "ring", shared_dir_all_gather, &sd, NULL);
  int rank = 0, size = 0;
  mlx_distributed_group_get_rank(&rank, g);
  mlx_distributed_group_get_size(&size, g);

  mlx_array x = mlx_array_new_float32((float)rank), y = mlx_array_new();
  mlx_distributed_all_sum(&y, x, g, mlx_stream_new());
  float total = 0;
  mlx_array_item_float32(&total, y);
  printf("rank %d of %d: all_sum of ranks = %g\n", rank, size, total);
  mlx_array_free(x);
  mlx_array_free(y);
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  return 0;
}
#endif

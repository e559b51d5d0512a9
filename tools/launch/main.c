/* mlxdist-launch: start N ranks of a program on this host.
 *
 * ring (default): take the user's hostfile or reserve N*K free TCP ports on
 * 127.0.0.1 and write MLX's hostfile (JSON, one list of "ip:port" strings per
 * rank) into a private temp dir, and fork/exec the ranks with MLX_RANK,
 * MLX_HOSTFILE and MLX_WORLD_SIZE set. Each output line of rank r is prefixed
 * with "[r] ". The first rank to fail stops the others (SIGTERM, SIGKILL after
 * a grace period) and gives the exit status.
 *
 * mpi: run `mpirun -np N ...` (OpenMPI or MPICH flags) under the same
 * supervision (timeout, signal forwarding, exit status).
 *
 * The parts are listed in launch.h. The launcher links the static library for
 * the ring's hostfile parser and clock only: it needs no libmlxdist.so. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"

static int run_mpi(const launch_opts* o, int sfd) {
  int status = 1;
  char** av = launch_mpi_argv(o, &status);
  if (!av) return status;
  if (o->verbose) {
    fputs("[launch] running:", stderr);
    for (int i = 0; av[i]; i++) fprintf(stderr, " %s", av[i]);
    fputc('\n', stderr);
  }
  launch_spawn sp = {.argv = av};
  int rc = launch_one(&sp, sfd, o->timeout);
  launch_mpi_argv_free(av);
  return rc;
}

static int run_ring(const launch_opts* o, int sfd) {
  launch_hostfile hf;
  if (launch_hostfile_prepare(o, &hf) != 0) return 1;
  if (o->verbose) {
    launch_msg("starting %d rank%s of '%s' with MLX_HOSTFILE=%s", hf.n, hf.n == 1 ? "" : "s",
               o->program[0], hf.path);
    fprintf(stderr, "%s\n", hf.json);
  }
  /* Every rank's environment besides MLX_RANK: the ring's variables first,
   * then --env (which may override them). */
  char* hostfile_kv = malloc(strlen(hf.path) + sizeof "MLX_HOSTFILE=");
  const char** env = calloc((size_t)(3 + o->n_envs), sizeof *env);
  char world_kv[32];
  int rc = 1;
  if (!hostfile_kv || !env) {
    launch_msg("out of memory");
  } else {
    sprintf(hostfile_kv, "MLX_HOSTFILE=%s", hf.path);
    snprintf(world_kv, sizeof world_kv, "MLX_WORLD_SIZE=%d", hf.n);
    int e = 0;
    env[e++] = hostfile_kv;
    env[e++] = world_kv;
    if (o->verbose) env[e++] = "MLX_RING_VERBOSE=1";
    for (int i = 0; i < o->n_envs; i++) env[e++] = o->envs[i];
    launch_spawn sp = {.argv = o->program, .set_env = env, .n_env = e};
    launch_hostfile_release_ports(&hf); /* just before the ranks start, so they can bind them */
    rc = launch_ranks(&sp, hf.n, sfd, o->timeout);
  }
  free(env);
  free(hostfile_kv);
  launch_hostfile_free(&hf);
  return rc;
}

int main(int argc, char** argv) {
  launch_opts o;
  launch_parse_args(argc, argv, &o); /* exits 2 on bad arguments */
  int sfd = launch_block_signals();
  if (sfd < 0) {
    launch_msg("cannot set up signal handling: %s.", strerror(errno));
    return 1;
  }
  int rc = o.mpi ? run_mpi(&o, sfd) : run_ring(&o, sfd);
  close(sfd);
  launch_free_args(&o);
  return rc;
}

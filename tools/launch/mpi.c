/* mlxdist-launch --backend mpi: the mpirun command line, with the flags of the
 * MPI found on PATH (Open MPI or MPICH/Hydra, told apart by `mpirun --version`). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch.h"

typedef enum { MPI_NONE, MPI_OPENMPI, MPI_MPICH, MPI_OTHER } mpi_kind;

static mpi_kind detect_mpi(void) {
  FILE* p = popen("mpirun --version 2>&1", "r");
  if (!p) return MPI_NONE;
  char line[512];
  bool ompi = false, mpich = false, any = false;
  while (fgets(line, sizeof line, p)) {
    any = true;
    if (strstr(line, "Open MPI") || strstr(line, "OpenRTE") || strstr(line, "Open RTE"))
      ompi = true;
    if (strstr(line, "HYDRA") || strstr(line, "MPICH") || strstr(line, "Intel(R) MPI"))
      mpich = true;
  }
  int st = pclose(p);
  if (!any || (WIFEXITED(st) && WEXITSTATUS(st) == 127)) return MPI_NONE;
  if (ompi) return MPI_OPENMPI;
  if (mpich) return MPI_MPICH;
  return MPI_OTHER;
}

/* Append a copy of s (or of its first n bytes, n >= 0); false when out of memory. */
static bool add(char** av, int* k, const char* s, long n) {
  av[*k] = n >= 0 ? strndup(s, (size_t)n) : strdup(s);
  return av[(*k)++] != NULL;
}

/* -x K=V (Open MPI) or -genv K V (MPICH and others) for every --env. */
static bool add_envs(char** av, int* k, const launch_opts* o, mpi_kind kind) {
  bool ok = true;
  for (int i = 0; i < o->n_envs && ok; i++) {
    const char* kv = o->envs[i];
    const char* eq = strchr(kv, '=');
    if (kind == MPI_OPENMPI)
      ok = add(av, k, "-x", -1) && add(av, k, kv, -1);
    else
      ok = add(av, k, "-genv", -1) && add(av, k, kv, eq - kv) && add(av, k, eq + 1, -1);
  }
  return ok;
}

char** launch_mpi_argv(const launch_opts* o, int* status) {
  mpi_kind kind = detect_mpi();
  if (kind == MPI_NONE) {
    launch_msg("--backend mpi needs 'mpirun' on PATH, but 'mpirun --version' could not run.");
    *status = 127;
    return NULL;
  }
  int nprog = 0;
  while (o->program[nprog]) nprog++;
  char** av = calloc((size_t)(16 + 3 * o->n_envs + nprog), sizeof *av);
  char np[16];
  snprintf(np, sizeof np, "%d", o->n);
  int k = 0;
  bool ok = av && add(av, &k, "mpirun", -1) && add(av, &k, "-np", -1) && add(av, &k, np, -1);
  if (ok && kind == MPI_OPENMPI) {
    ok = add(av, &k, "--oversubscribe", -1) &&
         (geteuid() != 0 || add(av, &k, "--allow-run-as-root", -1)) &&
         add(av, &k, "--tag-output", -1);
  } else if (ok && kind == MPI_MPICH) {
    ok = add(av, &k, "-prepend-rank", -1);
  }
  ok = ok && add_envs(av, &k, o, kind);
  for (int i = 0; i < nprog && ok; i++) ok = add(av, &k, o->program[i], -1);
  if (!ok) {
    launch_mpi_argv_free(av);
    launch_msg("out of memory");
    *status = 1;
    return NULL;
  }
  return av;
}

void launch_mpi_argv_free(char** av) {
  if (!av) return;
  for (int i = 0; av[i]; i++) free(av[i]);
  free(av);
}

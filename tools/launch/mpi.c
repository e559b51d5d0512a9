/* mlxdist-launch --backend mpi: the mpirun command line, with the flags of the
 * MPI found on PATH (Open MPI or MPICH/Hydra, told apart by `mpirun --version`).
 * Across hosts: Open MPI's -H h1:K,h2:K with the --ssh command (and the
 * launcher's BatchMode/ConnectTimeout options) as plm_rsh_agent; MPICH's
 * -hosts h1:K,h2:K -launcher ssh [-launcher-exec SSH]. The hostfile's
 * "envs" and --env go with -x (Open MPI) or -genv (MPICH). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch.h"

static launch_mpi_kind detect_mpi(void) {
  FILE* p = popen("mpirun --version 2>&1", "r");
  if (!p) return LAUNCH_MPI_NONE;
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
  if (!any || (WIFEXITED(st) && WEXITSTATUS(st) == 127)) return LAUNCH_MPI_NONE;
  if (ompi) return LAUNCH_MPI_OPENMPI;
  if (mpich) return LAUNCH_MPI_MPICH;
  return LAUNCH_MPI_OTHER;
}

/* Append a copy of s (or of its first n bytes, n >= 0); false when out of memory. */
static bool add(char** av, int* k, const char* s, long n) {
  av[*k] = n >= 0 ? strndup(s, (size_t)n) : strdup(s);
  return av[(*k)++] != NULL;
}

/* -x K=V (Open MPI) or -genv K V (MPICH and others) for one variable. */
static bool add_env(char** av, int* k, const char* kv, launch_mpi_kind kind) {
  const char* eq = strchr(kv, '=');
  if (kind == LAUNCH_MPI_OPENMPI) return add(av, k, "-x", -1) && add(av, k, kv, -1);
  return add(av, k, "-genv", -1) && add(av, k, kv, eq - kv) && add(av, k, eq + 1, -1);
}

/* "h1:K,h2:K" (mpirun's -H / -hosts), the host part of "user@host". */
static char* host_list(const launch_hosts* hs) {
  size_t cap = 1;
  for (int i = 0; i < hs->n; i++) cap += strlen(hs->h[i].name) + 8;
  char* s = malloc(cap);
  if (!s) return NULL;
  size_t len = 0;
  s[0] = '\0';
  for (int i = 0; i < hs->n; i++) {
    const char* at = strrchr(hs->h[i].name, '@');
    len += (size_t)snprintf(s + len, cap - len, "%s%s:%d", i ? "," : "",
                            at ? at + 1 : hs->h[i].name, hs->h[i].slots);
  }
  return s;
}

/* The --ssh command with the launcher's options, as Open MPI's plm_rsh_agent. */
static char* rsh_agent(const launch_opts* o) {
  char* s = malloc(strlen(o->ssh ? o->ssh : "ssh") + 128);
  if (!s) return NULL;
  sprintf(s, "%s -o BatchMode=yes -o ConnectTimeout=%d", o->ssh ? o->ssh : "ssh",
          o->connect_timeout >= 1 ? (int)(o->connect_timeout + 0.5) : 1);
  return s;
}

/* Across hosts: -H/--mca plm_rsh_agent (Open MPI) or -hosts/-launcher (MPICH). */
static bool add_hosts(char** av, int* k, const launch_opts* o, const launch_hosts* hs,
                      launch_mpi_kind kind, char* why, size_t why_len) {
  char* list = host_list(hs);
  bool ok = list != NULL;
  if (ok && kind == LAUNCH_MPI_OPENMPI) {
    char* agent = rsh_agent(o);
    ok = agent && add(av, k, "-H", -1) && add(av, k, list, -1) && add(av, k, "--mca", -1) &&
         add(av, k, "plm_rsh_agent", -1) && add(av, k, agent, -1);
    free(agent);
  } else if (ok) {
    ok = add(av, k, "-hosts", -1) && add(av, k, list, -1) && add(av, k, "-launcher", -1) &&
         add(av, k, "ssh", -1);
    if (ok && o->ssh) {
      char** w = launch_split_words(o->ssh, why, why_len);
      if (!w || w[1]) {
        if (w)
          snprintf(why, why_len,
                   "MPICH's mpirun takes an ssh program without options (-launcher-exec); "
                   "put the options of --ssh '%.200s' into ~/.ssh/config",
                   o->ssh);
        launch_argv_free(w);
        free(list);
        return false;
      }
      ok = add(av, k, "-launcher-exec", -1) && add(av, k, w[0], -1);
      launch_argv_free(w);
    }
  }
  if (!ok) snprintf(why, why_len, "out of memory");
  free(list);
  return ok;
}

char** launch_mpi_build(const launch_opts* o, const launch_hosts* hs, launch_mpi_kind kind,
                        bool as_root, char* why, size_t why_len) {
  int nprog = 0;
  while (o->program[nprog]) nprog++;
  int n_henv = hs ? hs->n_envs : 0;
  char** av = calloc((size_t)(24 + 3 * (o->n_envs + n_henv) + nprog), sizeof *av);
  char np[16];
  snprintf(np, sizeof np, "%d", hs ? hs->ranks : o->n);
  int k = 0;
  bool ok = av && add(av, &k, "mpirun", -1) && add(av, &k, "-np", -1) && add(av, &k, np, -1);
  snprintf(why, why_len, "out of memory");
  if (ok && hs) ok = add_hosts(av, &k, o, hs, kind, why, why_len);
  if (ok && kind == LAUNCH_MPI_OPENMPI) {
    ok = (hs || add(av, &k, "--oversubscribe", -1)) &&
         (!as_root || add(av, &k, "--allow-run-as-root", -1)) && add(av, &k, "--tag-output", -1);
  } else if (ok && kind == LAUNCH_MPI_MPICH) {
    ok = add(av, &k, "-prepend-rank", -1);
  }
  for (int i = 0; i < n_henv && ok; i++) ok = add_env(av, &k, hs->envs[i], kind);
  for (int i = 0; i < o->n_envs && ok; i++) ok = add_env(av, &k, o->envs[i], kind);
  for (int i = 0; i < nprog && ok; i++) ok = add(av, &k, o->program[i], -1);
  if (!ok) {
    launch_mpi_argv_free(av);
    return NULL;
  }
  return av;
}

char** launch_mpi_argv(const launch_opts* o, const launch_hosts* hs, int* status) {
  launch_mpi_kind kind = detect_mpi();
  if (kind == LAUNCH_MPI_NONE) {
    launch_msg("--backend mpi needs 'mpirun' on PATH, but 'mpirun --version' could not run.");
    *status = 127;
    return NULL;
  }
  char why[512];
  char** av = launch_mpi_build(o, hs, kind, geteuid() == 0, why, sizeof why);
  if (!av) {
    launch_msg("%s.", why);
    *status = strcmp(why, "out of memory") == 0 ? 1 : 2;
  }
  return av;
}

void launch_mpi_argv_free(char** av) {
  if (!av) return;
  for (int i = 0; av[i]; i++) free(av[i]);
  free(av);
}

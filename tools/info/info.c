/* mlxdist-info: the library version, the backends of the registry (whether
 * each is available and configured here), one started group described by
 * its backend (--group), the GPUs (the core's GPU provider, and NCCL's version when
 * libnccl.so.2 loads), the RDMA devices jaccl would use, the shared-memory transport's
 * single-copy threshold and what chose it, and every MLXDIST_* tunable (name, default,
 * expected values, description) from src/util/tunables.h. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/gpu.h"
#include "distributed/group_impl.h"
#include "mlx/c/distributed_group.h"
#include "mlx/c/error.h"
#include "mlx/c/string.h"
#include "mlx/c/version.h"
#include "rdma/probe.h"
#include "transport/cma_calib.h"
#include "transport/spin.h"
#include "util/env_names.h"
#include "util/text.h"
#include "util/tunables.h"

#define MLXD_INFO_N ((size_t)MLXD_T_COUNT)

static void mlxd_info_usage(FILE* f) {
  fputs(
      "Usage: mlxdist-info [--env [--markdown] | --group [BACKEND]]\n"
      "\n"
      "  (no option)        print the library version and, for each backend, whether it\n"
      "                     is available and configured in this process; the GPUs (CUDA\n"
      "                     runtime version and device count, or why none; NCCL's\n"
      "                     version); and the RDMA devices (jaccl): ports, state, MTU,\n"
      "                     link layer, GID; the shared-memory transport's single-copy\n"
      "                     threshold and what chose it (MLXDIST_SHM_CMA_BYTES, the\n"
      "                     crowded rule, this boot's calibration cache, or a fresh\n"
      "                     calibration)\n"
      "  --group [BACKEND]  start BACKEND (default: any; strict) and print one line about\n"
      "                     the group: rank, size and the backend's own description\n"
      "                     (e.g. the MPI library and thread level); run it under the\n"
      "                     launcher, e.g. mpirun -n 2 mlxdist-info --group mpi\n"
      "  --env              print every MLXDIST_* environment variable: name, default,\n"
      "                     the values it accepts, description, and the current value\n"
      "                     when it is set (with what is wrong with it, if anything)\n"
      "  --env --markdown   the same as a markdown table (docs/environment.md)\n"
      "  -h, --help         print this help\n",
      f);
}

/* Print s for a markdown table cell: '|' escaped. */
static void mlxd_md_cell(const char* s) {
  for (; *s; s++) {
    if (*s == '|') fputc('\\', stdout);
    fputc(*s, stdout);
  }
}

static void mlxd_print_env(bool markdown) {
  char exp[256], why[400];
  if (markdown) {
    puts("| Variable | Default | Expected | Description |");
    puts("|---|---|---|---|");
    for (size_t i = 0; i < MLXD_INFO_N; i++) {
      mlxd_tunable t = (mlxd_tunable)i;
      const char* def = mlxd_tunable_default(t);
      printf("| `%s` | ", mlxd_tunable_env_name(t));
      if (def[0]) {
        fputc('`', stdout);
        mlxd_md_cell(def);
        fputc('`', stdout);
      } else {
        fputs("*(empty)*", stdout);
      }
      fputs(" | ", stdout);
      mlxd_md_cell(mlxd_tunable_expected(t, exp, sizeof exp));
      fputs(" | ", stdout);
      mlxd_md_cell(mlxd_tunable_doc(t));
      puts(" |");
    }
    return;
  }
  for (size_t i = 0; i < MLXD_INFO_N; i++) {
    mlxd_tunable t = (mlxd_tunable)i;
    const char* def = mlxd_tunable_default(t);
    printf("%s (default: %s)\n    expected: %s\n    %s\n", mlxd_tunable_env_name(t),
           def[0] ? def : "(empty)", mlxd_tunable_expected(t, exp, sizeof exp),
           mlxd_tunable_doc(t));
    const char* cur = getenv(mlxd_tunable_env_name(t));
    if (cur && *cur) {
      printf("    currently set to: %s\n", cur);
      if (mlxd_tunable_parse(t, cur, NULL, why, sizeof why) != 0)
        printf("    INVALID: %s (init fails until it is fixed or unset)\n", why);
    }
  }
  /* names mlxdist does not know (typos): what init warns about, or refuses when strict */
  char lines[4096];
  mlxd_text l = {lines, sizeof lines, 0};
  lines[0] = '\0';
  if (mlxd_env_names_unknown((const char* const*)environ, -1, false, &l, "\n    ", NULL) > 0)
    printf("UNKNOWN (ignored; an init error under MLXDIST_STRICT_ENV=1):\n    %s\n", lines);
}

/* jaccl's view of this machine (rdma/probe.h): every device and
 * port, its state, MTU, link layer and the GID (or LID) it would use; or why
 * there is none. */
static void mlxd_print_rdma(void) {
  mlxd_verbs_probe* p = malloc(sizeof *p);
  if (!p) {
    puts("rdma devices (jaccl): out of memory");
    return;
  }
  mlxd_verbs_probe_run(p);
  char why[1024], line[512];
  bool usable = mlxd_verbs_usable(p, why, sizeof why);
  if (p->lib != MLXD_VERBS_OK || p->ndev == 0) {
    printf("rdma devices (jaccl): none: %s\n", why);
  } else {
    printf("rdma devices (jaccl, through %s):\n", p->lib_name);
    for (int i = 0; i < p->ndev; i++) {
      const mlxd_verbs_dev* d = &p->devs[i];
      if (d->nports == 0) printf("  %s: %s\n", d->name, d->err[0] ? d->err : "no port");
      for (int k = 0; k < d->nports; k++) {
        mlxd_verbs_port_line(d, &d->ports[k], line, sizeof line);
        printf("  %s\n", line);
      }
      if (d->nports && d->err[0]) printf("  %s: %s\n", d->name, d->err);
    }
    if (!usable) printf("  (%s)\n", why);
  }
  free(p);
}

/* The shared-memory transport's single-copy threshold here (spin.h
 * mlxd_shm_cma_bytes_from) and what chose it: MLXDIST_SHM_CMA_BYTES, or,
 * unset, the calibration (cma_calib.h: this boot's cache file, or measured
 * now, with its table) for a host that is not crowded, and the crowded
 * host's constant. One line, "shm single copy: ..." (scripts/bench-vs-
 * openmpi.sh copies it into conditions.txt). */
static void mlxd_print_shm_cma(void) {
  mlxd_shm_cma_from from;
  size_t n = mlxd_shm_cma_bytes_from(false, &from);
  char v[64];
  if (n)
    snprintf(v, sizeof v, "from %zu bytes", n);
  else
    snprintf(v, sizeof v, "off");
  if (from == MLXD_SHM_CMA_FROM_ENV) {
    printf("shm single copy: %s on every host (environment: MLXDIST_SHM_CMA_BYTES=%s)\n", v,
           getenv("MLXDIST_SHM_CMA_BYTES"));
    return;
  }
  const mlxd_cma_choice* c = mlxd_cma_calibrated();
  const mlxd_cma_table* t = &c->table;
  printf("shm single copy: collectives %s where the host is not crowded (", v);
  if (c->source == MLXD_CMA_FROM_CACHE && t->reps == 0) {
    printf("calibration cached for this boot in %s", c->path);
  } else if (c->source == MLXD_CMA_FROM_CACHE) {
    printf("calibration cached for this boot in %s by another process while this one measured",
           c->path);
  } else if (t->err) {
    printf("calibration: process_vm_readv refused here: %s", strerror(t->err));
  } else if (t->one_cpu) {
    printf("calibration: this process may run on one CPU only, not measured, not cached");
  } else if (t->over) {
    printf("calibration: stopped by its %.0f ms bound after %.1f ms, not cached",
           MLXD_CMA_BUDGET_S * 1e3, t->took_s * 1e3);
  } else {
    printf("fresh calibration in %.1f ms, %s %s; us exchange over lanes/process_vm_readv:",
           t->took_s * 1e3, c->cached ? "cached in" : "not cached in", c->path);
    for (int i = 0; i < t->n; i++)
      printf(" %zu KiB %.1f/%.1f", mlxd_cma_sizes[i] >> 10, t->two_s[i] * 1e6, t->one_s[i] * 1e6);
  }
  printf(
      "); point to point off (the lanes) where not crowded; %zu bytes on a crowded host "
      "(crowded rule)\n",
      (size_t)MLXD_SHM_CMA_CROWDED_BYTES);
}

/* The GPU provider's answer (core/gpu.h) and NCCL's version, for nccl. */
static void mlxd_print_gpu(void) {
  const mlxd_gpu_info* g = mlxd_gpu_probe();
  char drv[32] = "none";
  if (g->driver_version > 0)
    snprintf(drv, sizeof drv, "%d.%d", g->driver_version / 1000, g->driver_version % 1000 / 10);
  if (g->count > 0)
    printf("gpus: %d device%s (CUDA runtime %s %d.%d, driver %s)\n", g->count,
           g->count == 1 ? "" : "s", g->lib, g->runtime_version / 1000,
           g->runtime_version % 1000 / 10, drv);
  else if (g->loaded)
    printf("gpus: none: %s (driver %s)\n", g->why, drv);
  else
    printf("gpus: none: %s\n", g->why);
  /* NCCL's version: its own library, opened and closed again (the plugin
   * opens it for real); int ncclGetVersion(int*) as nccl.h declares it. */
  void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    printf("nccl library: libnccl.so.2 not loadable (%s)\n", e ? e : "not found");
    return;
  }
  int (*get_version)(int*) = NULL;
  void* f = dlsym(h, "ncclGetVersion");
  memcpy(&get_version, &f, sizeof f);
  int v = 0;
  if (get_version && get_version(&v) == 0)
    printf("nccl library: libnccl.so.2, NCCL %d.%d.%d\n", v / 10000, v / 100 % 100, v % 100);
  else
    printf("nccl library: libnccl.so.2 loaded but ncclGetVersion failed\n");
  dlclose(h);
}

static int mlxd_print_summary(void) {
  mlx_string v = mlx_string_new();
  const char* ver = NULL;
  if (mlx_version(&v) == 0) ver = mlx_string_data(v);
  printf("mlxdist %s (mlx-c compatible distributed API)\n",
         ver && *ver ? ver : MLXDIST_VERSION_STRING);
  mlx_string_free(v);
  puts("backends:");
  char why[1024];
  for (int i = 0; i < mlxd_registry_size; i++) {
    const char* name = mlxd_registry[i].name;
    why[0] = '\0';
    const mlxd_backend_kind* k = mlxd_registry_kind(i, why, sizeof why);
    if (k && k->is_available(why, sizeof why))
      printf("  %-6s available, %s\n", name,
             k->is_configured(false) ? "configured" : "not configured in this process");
    else
      printf("  %-6s not available: %s\n", name, why[0] ? why : "(no reason given)");
  }
  printf("  %-6s %s\n", "any", mlx_distributed_is_available("any") ? "available" : "not available");
  mlxd_print_gpu();
  mlxd_print_rdma();
  mlxd_print_shm_cma();
  printf("environment: %zu MLXDIST_* variables (mlxdist-info --env)\n", MLXD_INFO_N);
  return 0;
}

static void mlxd_info_error(const char* msg, void* data) {
  (void)data;
  fprintf(stderr, "%s\n", msg);
}

/* Start a group (strict) and describe it. */
static int mlxd_print_group(const char* backend) {
  mlx_set_error_handler(mlxd_info_error, NULL, NULL);
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, backend) != 0) {
    fprintf(stderr, "[info] could not start the %s backend (message above)\n", backend);
    return 1;
  }
  char line[2048];
  mlxd_group_describe(mlxd_group_of(g), line, sizeof line);
  printf("%s\n", line);
  fflush(stdout);
  mlx_distributed_group_free(g);
  return 0;
}

int main(int argc, char** argv) {
  bool env = false, markdown = false;
  const char* group = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--group") == 0) {
      group = "any";
      if (i + 1 < argc && argv[i + 1][0] != '-') group = argv[++i];
    } else if (strcmp(argv[i], "--env") == 0) {
      env = true;
    } else if (strcmp(argv[i], "--markdown") == 0) {
      markdown = true;
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      mlxd_info_usage(stdout);
      return 0;
    } else {
      fprintf(stderr,
              "[info] unknown argument '%s'; expected --env, --markdown, --group or --help.\n",
              argv[i]);
      mlxd_info_usage(stderr);
      return 2;
    }
  }
  if (markdown && !env) {
    fputs("[info] --markdown only applies to --env; run 'mlxdist-info --env --markdown'.\n",
          stderr);
    return 2;
  }
  if (group && (env || markdown)) {
    fputs("[info] --group does not combine with --env or --markdown.\n", stderr);
    return 2;
  }
  if (group) return mlxd_print_group(group);
  if (env) {
    mlxd_print_env(markdown);
    return 0;
  }
  return mlxd_print_summary();
}

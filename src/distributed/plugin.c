/* The plugin loader: finds libmlxdist-<name>.so and hands it to the adapter
 * (plugin_adapter.c), which checks its ABI and returns its backend kind.
 * Search order:
 *   1. every directory of MLXDIST_PLUGIN_PATH (colon-separated),
 *   2. the directory holding libmlxdist itself (or the program, when linked
 *      statically),
 *   3. MLXDIST_PLUGIN_INSTALL_DIR (the install libdir, set by CMake).
 * A file that exists but does not load (or has the wrong ABI) is skipped
 * and the next directory is tried. For "mpi", MLX_MPI_LIBNAME (if set) is
 * loaded first with RTLD_GLOBAL so the plugin's MPI symbols resolve to it.
 * The outcome (kind or failure text) is cached per name for the process. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "distributed/plugin.h"
#include "util/env.h"
#include "util/text.h"
#include "util/tunables.h"

#ifndef MLXDIST_PLUGIN_INSTALL_DIR
#define MLXDIST_PLUGIN_INSTALL_DIR ""
#endif

#define WHY_MAX 2048
#define MAX_CACHED 8

typedef struct plugin_entry {
  char name[32];
  const mlxd_backend_kind* kind; /* NULL: failed */
  char why[WHY_MAX];
} plugin_entry;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static plugin_entry g_cache[MAX_CACHED];
static int g_cached;

static bool file_exists(const char* path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

/* Directory of the object holding this file's data (libmlxdist.so, or the program). */
static void self_dir(char* dir, size_t len) {
  Dl_info info;
  dir[0] = '\0';
  if (dladdr((const void*)&g_mu, &info) == 0 || info.dli_fname == NULL) return;
  const char* slash = strrchr(info.dli_fname, '/');
  if (!slash) return; /* found through the search path with no directory: skip */
  size_t n = (size_t)(slash - info.dli_fname);
  if (n == 0) n = 1; /* "/" */
  if (n >= len) return;
  memcpy(dir, info.dli_fname, n);
  dir[n] = '\0';
}

/* Try one candidate file. Returns the kind, or NULL with the reason appended to t. */
static const mlxd_backend_kind* try_file(const char* path, const char* name, mlxd_text* t,
                                         int* tried) {
  if (*tried) mlxd_text_add(t, "; ");
  (*tried)++;
  if (!file_exists(path)) {
    mlxd_text_add(t, "%s (no such file)", path);
    return NULL;
  }
  dlerror();
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    mlxd_text_add(t, "%s (dlopen failed: %s)", path, e ? e : "unknown error");
    return NULL;
  }
  const mlxd_backend_kind* k = mlxd_plugin_adapt(h, path, name, t);
  if (!k) {
    dlclose(h);
    return NULL;
  }
  /* Loaded for good: the kind's functions are used until exit. */
  return k;
}

static const mlxd_backend_kind* load(const char* name, char* why, size_t why_len) {
  mlxd_text t = {why, why_len, 0};
  why[0] = '\0';

  if (strcmp(name, "mpi") == 0) {
    const char* lib = mlxd_env_get("MLX_MPI_LIBNAME");
    if (lib && *lib) {
      dlerror();
      if (!dlopen(lib, RTLD_NOW | RTLD_GLOBAL)) {
        const char* e = dlerror();
        mlxd_text_add(&t, "[mpi] could not load the MPI library MLX_MPI_LIBNAME=%s (%s)", lib,
                      e ? e : "unknown error");
        return NULL;
      }
    }
  }

  char file[64];
  snprintf(file, sizeof file, "libmlxdist-%s.so", name);
  mlxd_text_add(&t, "[%s] the %s backend plugin %s could not be loaded; tried: ", name, name, file);

  int tried = 0;
  char path[PATH_MAX + 80];

  /* 1. MLXDIST_PLUGIN_PATH */
  const char* pp = mlxd_tunable_str(MLXD_T_PLUGIN_PATH);
  while (pp && *pp) {
    const char* end = strchr(pp, ':');
    size_t n = end ? (size_t)(end - pp) : strlen(pp);
    if (n > 0 && n < PATH_MAX) {
      snprintf(path, sizeof path, "%.*s/%s", (int)n, pp, file);
      const mlxd_backend_kind* k = try_file(path, name, &t, &tried);
      if (k) return k;
    }
    pp = end ? end + 1 : NULL;
  }

  /* 2. next to libmlxdist */
  char dir[PATH_MAX];
  self_dir(dir, sizeof dir);
  if (dir[0]) {
    snprintf(path, sizeof path, "%s/%s", dir, file);
    const mlxd_backend_kind* k = try_file(path, name, &t, &tried);
    if (k) return k;
  }

  /* 3. the install directory (unless it is the one just tried) */
  const char* inst = MLXDIST_PLUGIN_INSTALL_DIR;
  if (inst[0] && strcmp(inst, dir) != 0) {
    snprintf(path, sizeof path, "%s/%s", inst, file);
    const mlxd_backend_kind* k = try_file(path, name, &t, &tried);
    if (k) return k;
  }
  if (!tried) mlxd_text_add(&t, "nothing (no directory to search)");
  mlxd_text_add(&t, " (set MLXDIST_PLUGIN_PATH to the directory holding %s)", file);
  return NULL;
}

const mlxd_backend_kind* mlxd_plugin_load(const char* name, char* why, size_t why_len) {
  char dummy[1];
  if (!why || why_len == 0) {
    why = dummy;
    why_len = sizeof dummy;
  }
  why[0] = '\0';
  if (!name || !*name || strlen(name) >= sizeof g_cache[0].name || strchr(name, '/')) {
    snprintf(why, why_len, "[distributed] invalid plugin name '%s'", name ? name : "(null)");
    return NULL;
  }
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < g_cached; i++) {
    if (strcmp(g_cache[i].name, name) == 0) {
      const mlxd_backend_kind* k = g_cache[i].kind;
      if (!k) snprintf(why, why_len, "%s", g_cache[i].why);
      pthread_mutex_unlock(&g_mu);
      return k;
    }
  }
  char buf[WHY_MAX];
  const mlxd_backend_kind* k = load(name, buf, sizeof buf);
  if (g_cached < MAX_CACHED) {
    plugin_entry* e = &g_cache[g_cached++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->kind = k;
    snprintf(e->why, sizeof e->why, "%s", k ? "" : buf);
  }
  pthread_mutex_unlock(&g_mu);
  if (!k) snprintf(why, why_len, "%s", buf);
  return k;
}

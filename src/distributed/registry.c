/* The backend registry: the one table of backends the front-end knows, and
 * the plugins of other names added to it at run time (out-of-tree backends,
 * docs/plugin-abi.md). group.c starts, caches and lists backends only
 * through it. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "distributed/group_impl.h"
#include "distributed/plugin.h"

const mlxd_registry_entry mlxd_registry[] = {
    /* name     built-in kind     "any" order, with a caller's all-gather */
    {"nccl", &mlxd_nccl_kind, 1, 0},
    {"ring", &mlxd_ring_kind, 2, 2},
    {"mpi", NULL, 3, 0}, /* plugin libmlxdist-mpi.so */
    {"jaccl", &mlxd_jaccl_kind, 4, 1},
};
_Static_assert(sizeof mlxd_registry / sizeof mlxd_registry[0] < MLXD_REGISTRY_MAX,
               "raise MLXD_REGISTRY_MAX");
const int mlxd_registry_size = (int)(sizeof mlxd_registry / sizeof mlxd_registry[0]);

/* Plugins of other names, in the order they were first loaded: index
 * mlxd_registry_size + i. Appended under g_add_mu, never removed; g_nadded
 * is published after the entry is complete, so readers take no lock. */
#define MAX_ADDED (MLXD_REGISTRY_MAX - (int)(sizeof mlxd_registry / sizeof mlxd_registry[0]))
#define ADDED_NAME_MAX 24
static pthread_mutex_t g_add_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_added_name[MAX_ADDED][ADDED_NAME_MAX];
static const mlxd_backend_kind* g_added_kind[MAX_ADDED];
static atomic_int g_nadded;

int mlxd_registry_find(const char* name) {
  if (!name) return -1;
  for (int i = 0; i < mlxd_registry_size; i++)
    if (strcmp(name, mlxd_registry[i].name) == 0) return i;
  int n = atomic_load(&g_nadded);
  for (int i = 0; i < n; i++)
    if (strcmp(name, g_added_name[i]) == 0) return mlxd_registry_size + i;
  return -1;
}

const char* mlxd_registry_name(int idx) {
  if (idx >= 0 && idx < mlxd_registry_size) return mlxd_registry[idx].name;
  int i = idx - mlxd_registry_size;
  if (i >= 0 && i < atomic_load(&g_nadded)) return g_added_name[i];
  return "?";
}

/* A name that can be a file name's part: no '/', no '.', nothing to quote. */
static bool plugin_name_ok(const char* name) {
  size_t n = strlen(name);
  if (n == 0 || n >= ADDED_NAME_MAX || name[0] == '-' || name[0] == '_') return false;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
  }
  return true;
}

int mlxd_registry_add_plugin(const char* name, char* why, size_t why_len) {
  char dummy[1];
  if (!why || why_len == 0) {
    why = dummy;
    why_len = sizeof dummy;
  }
  why[0] = '\0';
  if (!name || !plugin_name_ok(name) || strcmp(name, "any") == 0) {
    snprintf(why, why_len,
             "\"%.40s\" cannot name a plugin (a plugin's name is 1-%d characters of a-z, 0-9, "
             "'_' and '-')",
             name ? name : "(null)", ADDED_NAME_MAX - 1);
    return -1;
  }
  int idx = mlxd_registry_find(name);
  if (idx >= 0) return idx;
  pthread_mutex_lock(&g_add_mu);
  idx = mlxd_registry_find(name); /* another thread may have added it meanwhile */
  if (idx < 0) {
    int n = atomic_load(&g_nadded);
    const mlxd_backend_kind* k = mlxd_plugin_load(name, why, why_len);
    if (k && n >= MAX_ADDED) {
      snprintf(why, why_len, "[%s] too many backend plugins of other names (at most %d)", name,
               MAX_ADDED);
    } else if (k) {
      snprintf(g_added_name[n], sizeof g_added_name[n], "%s", name);
      g_added_kind[n] = k;
      atomic_store(&g_nadded, n + 1);
      idx = mlxd_registry_size + n;
    }
  }
  pthread_mutex_unlock(&g_add_mu);
  return idx;
}

const mlxd_backend_kind* mlxd_registry_kind(int idx, char* why, size_t why_len) {
  int added = idx - mlxd_registry_size;
  if (idx < 0 || (added >= 0 && added >= atomic_load(&g_nadded))) {
    if (why && why_len) snprintf(why, why_len, "[distributed] no backend number %d", idx);
    return NULL;
  }
  if (added >= 0) return g_added_kind[added];
  const mlxd_registry_entry* e = &mlxd_registry[idx];
  if (e->builtin) return e->builtin;
  return mlxd_plugin_load(e->name, why, why_len);
}

int mlxd_registry_any_order(bool with_gather, int* idx) {
  int n = 0;
  for (int pos = 1; pos <= mlxd_registry_size; pos++)
    for (int i = 0; i < mlxd_registry_size; i++) {
      const mlxd_registry_entry* e = &mlxd_registry[i];
      if ((with_gather ? e->any_order_gather : e->any_order) == pos) idx[n++] = i;
    }
  return n;
}

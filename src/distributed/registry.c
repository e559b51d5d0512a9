/* The backend registry: the one table of backends the front-end knows.
 * group.c starts, caches and lists backends only through it. */
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
_Static_assert(sizeof mlxd_registry / sizeof mlxd_registry[0] <= MLXD_REGISTRY_MAX,
               "raise MLXD_REGISTRY_MAX");
const int mlxd_registry_size = (int)(sizeof mlxd_registry / sizeof mlxd_registry[0]);

int mlxd_registry_find(const char* name) {
  if (!name) return -1;
  for (int i = 0; i < mlxd_registry_size; i++)
    if (strcmp(name, mlxd_registry[i].name) == 0) return i;
  return -1;
}

const mlxd_backend_kind* mlxd_registry_kind(int idx, char* why, size_t why_len) {
  if (idx < 0 || idx >= mlxd_registry_size) {
    if (why && why_len) snprintf(why, why_len, "[distributed] no backend number %d", idx);
    return NULL;
  }
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

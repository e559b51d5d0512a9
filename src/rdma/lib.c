/* libibverbs loaded at run time (lib.h). */
#include "rdma/lib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/tunables.h"

#define DEFAULT_LIB "libibverbs.so.1"
#define MAX_LIBS 8 /* different MLXDIST_IBVERBS_LIB values loaded in one process */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static mlxd_verbs_lib* g_libs[MAX_LIBS];
static int g_nlibs;

/* name at `version`, else unversioned (a library without symbol versions). */
static void* sym(void* h, const char* name, const char* version) {
  void* p = dlvsym(h, name, version);
  return p ? p : dlsym(h, name);
}

static mlxd_verbs_lib* load(const char* name, mlxd_verbs_lib_err* e) {
  void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* d = dlerror();
    snprintf(e->err, sizeof e->err, "%s", d ? d : "dlopen failed");
    return NULL;
  }
  e->loaded = true;
  mlxd_verbs_lib* L = calloc(1, sizeof *L);
  if (!L) {
    snprintf(e->err, sizeof e->err, "out of memory");
    return NULL; /* h stays loaded: dlclose of a library that may be in use elsewhere is unsafe */
  }
  snprintf(L->name, sizeof L->name, "%s", name);
  L->handle = h;
  static const char v11[] = "IBVERBS_1.1", v10[] = "IBVERBS_1.0";
  struct {
    const char* name;
    const char* version;
    void** slot;
  } want[] = {
      {"ibv_get_device_list", v11, (void**)&L->get_device_list},
      {"ibv_free_device_list", v11, (void**)&L->free_device_list},
      {"ibv_get_device_name", v11, (void**)&L->get_device_name},
      {"ibv_open_device", v11, (void**)&L->open_device},
      {"ibv_close_device", v11, (void**)&L->close_device},
      {"ibv_query_device", v11, (void**)&L->query_device},
      {"ibv_query_port", v11, (void**)&L->query_port},
      {"ibv_query_gid", v11, (void**)&L->query_gid},
      {"ibv_alloc_pd", v11, (void**)&L->alloc_pd},
      {"ibv_dealloc_pd", v11, (void**)&L->dealloc_pd},
      {"ibv_reg_mr", v11, (void**)&L->reg_mr},
      {"ibv_dereg_mr", v11, (void**)&L->dereg_mr},
      /* only ever at 1.0: the completion channel came with 1.0's last changes */
      {"ibv_create_comp_channel", v10, (void**)&L->create_comp_channel},
      {"ibv_destroy_comp_channel", v10, (void**)&L->destroy_comp_channel},
      {"ibv_create_cq", v11, (void**)&L->create_cq},
      {"ibv_destroy_cq", v11, (void**)&L->destroy_cq},
      {"ibv_get_cq_event", v11, (void**)&L->get_cq_event},
      {"ibv_ack_cq_events", v11, (void**)&L->ack_cq_events},
      {"ibv_create_qp", v11, (void**)&L->create_qp},
      {"ibv_modify_qp", v11, (void**)&L->modify_qp},
      {"ibv_destroy_qp", v11, (void**)&L->destroy_qp},
      {"ibv_wc_status_str", v11, (void**)&L->wc_status_str},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    *want[i].slot = sym(h, want[i].name, want[i].version);
    if (!*want[i].slot) {
      snprintf(e->err, sizeof e->err, "it has no %s", want[i].name);
      free(L);
      return NULL; /* h stays loaded, as above */
    }
  }
  return L;
}

const mlxd_verbs_lib* mlxd_verbs_lib_get(mlxd_verbs_lib_err* e) {
  mlxd_verbs_lib_err local;
  if (!e) e = &local;
  memset(e, 0, sizeof *e);
  const char* name = mlxd_tunable_str(MLXD_T_IBVERBS_LIB);
  if (!name || !name[0]) name = DEFAULT_LIB;
  snprintf(e->name, sizeof e->name, "%s", name);
  pthread_mutex_lock(&g_mu);
  mlxd_verbs_lib* L = NULL;
  for (int i = 0; i < g_nlibs && !L; i++)
    if (strcmp(g_libs[i]->name, e->name) == 0) L = g_libs[i];
  if (!L) {
    if (g_nlibs == MAX_LIBS) {
      snprintf(e->err, sizeof e->err,
               "this process already loaded %d different libibverbs (MLXDIST_IBVERBS_LIB)",
               MAX_LIBS);
    } else {
      L = load(e->name, e);
      if (L) g_libs[g_nlibs++] = L;
    }
  }
  pthread_mutex_unlock(&g_mu);
  return L;
}

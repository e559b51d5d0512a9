/* cJSON loaded at run time (cjson_rt.h). */
#define MLXD_CJSON_NO_MACROS
#include "util/cjson_rt.h"

#include <pthread.h>
#include <stdbool.h>

#include "util/dl.h"

/* The run-time name of the library cJSON's development files link (Debian: libcjson1). */
#ifndef MLXDIST_LIBCJSON
#define MLXDIST_LIBCJSON "libcjson.so.1"
#endif

mlxd_cjson_table mlxd_cjson;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static bool load_ok;
static char load_err[300];

static void load(void) {
  /* Never closed: the documents parsed hold pointers into it for as long as
   * their callers keep them, and a second load would cost the same again.
   * util/dl.c closes it if a function is missing. */
  static const char* const names[] = {MLXDIST_LIBCJSON};
  mlxd_cjson_table t;
  mlxd_dl_sym syms[] = {
#define MLXD_CJSON_SYM(f) {#f, &t.f},
      MLXD_CJSON_FNS(MLXD_CJSON_SYM)
#undef MLXD_CJSON_SYM
  };
  if (!mlxd_dl_open(names, 1, syms, sizeof syms / sizeof syms[0], NULL, load_err, sizeof load_err))
    return;
  mlxd_cjson = t;
  load_ok = true;
}

int mlxd_cjson_load(const char* what, mlxd_status* st) {
  pthread_once(&load_once, load);
  if (load_ok) return 0;
  return mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP,
                      "cannot load cJSON (%s), which reading %s needs: %s (install the "
                      "distribution's libcjson1)",
                      MLXDIST_LIBCJSON, what, load_err);
}

/* Private: one way to load a library at run time (dlopen) and resolve a table
 * of its functions, for the loaders that keep a process-wide table filled once
 * (util/cjson_rt.c: libcjson; security/ossl.c: libssl and libcrypto under it).
 *
 * The caller lists the names to try and, for each function it needs, the name
 * and the address of its function-pointer slot; mlxd_dl_open fills every slot
 * or says why it could not: which names dlopen could not load and dlerror's
 * text for each, or which function the opened library lacks and dlerror's text.
 * A library opened but lacking a function is closed again (dlclose): a
 * failed load drops the reference it took (the loader may still keep a
 * library marked NODELETE mapped, as libssl is).
 *
 * net/pmix.c opens libpmix with it (no functions asked) and
 * resolves its own, leaving the library loaded when one is missing (an MPI
 * library may use it). Loaders that do more than this (rdma/lib.c: versioned
 * symbols, a library per MLXDIST_IBVERBS_LIB value under a mutex; core/gpu.c:
 * optional entry points, its messages checked word for word) keep their own. */
#ifndef MLXD_UTIL_DL_H
#define MLXD_UTIL_DL_H

#include <stddef.h>

typedef struct mlxd_dl_sym {
  const char* name; /* the function's name in the library */
  void* slot;       /* the address of a function pointer: dlsym's result is stored in it */
} mlxd_dl_sym;

/* Open the first of names[0..nnames) that dlopen(RTLD_NOW | RTLD_LOCAL)
 * loads, then resolve syms[0..nsyms) in it. Returns the handle (never closed
 * here: the caller keeps it for the process's life or closes it) with *used
 * (if used) set to the name opened; NULL on failure, with err (err_n bytes,
 * terminated when err_n > 0) saying why, and some slots possibly written (resolve into
 * a local table and publish it only on success).
 *
 * May block only on the dynamic loader (its own lock, and the constructors of
 * the library loaded); takes no lock of mlxdist's. Not a once-guard: the
 * caller runs it under pthread_once or its own mutex. */
void* mlxd_dl_open(const char* const* names, size_t nnames, const mlxd_dl_sym* syms, size_t nsyms,
                   const char** used, char* err, size_t err_n);

#endif

/* OpenSSL loaded at run time (ossl.h): the table and mlxd_crypto_init (secret.h). */
#define MLXD_OSSL_NO_MACROS /* here the names are the table's members */
#include "security/ossl.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#include "security/secret.h"
#include "util/dl.h"

#ifndef MLXDIST_LIBSSL
#define MLXDIST_LIBSSL "libssl.so.3" /* CMakeLists.txt passes the found OpenSSL's */
#endif

mlxd_ossl_table mlxd_ossl;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static bool load_ok;
static char load_err[300];

static void load(void) {
  /* libssl brings libcrypto; a handle's dlsym searches both. Never closed: OpenSSL stays
   * for the process's life (it marks itself NODELETE too). util/dl.c closes it if a
   * function is missing. */
  static const char* const names[] = {MLXDIST_LIBSSL};
  mlxd_ossl_table t;
  mlxd_dl_sym syms[] = {
#define MLXD_OSSL_SYM(f) {#f, &t.f},
      MLXD_OSSL_FNS(MLXD_OSSL_SYM)
#undef MLXD_OSSL_SYM
  };
  if (!mlxd_dl_open(names, 1, syms, sizeof syms / sizeof syms[0], NULL, load_err, sizeof load_err))
    return;
  mlxd_ossl = t;
  /* Without OpenSSL's at-exit clean-up (secret.h says why). */
  if (mlxd_ossl.OPENSSL_init_ssl(OPENSSL_INIT_NO_ATEXIT, NULL) != 1) {
    snprintf(load_err, sizeof load_err, "OPENSSL_init_ssl failed");
    return;
  }
  load_ok = true;
}

int mlxd_crypto_init(mlxd_status* st) {
  pthread_once(&load_once, load);
  if (load_ok) return 0;
  if (!st) return -1;
  return mlxd_fail(st, MLXD_ESYS,
                   "cannot load OpenSSL (%s), which MLXDIST_SECRET_FILE, MLXDIST_TLS and a job "
                   "token derived without MLXDIST_JOB_TOKEN need: %s (install the distribution's "
                   "libssl3)",
                   MLXDIST_LIBSSL, load_err);
}

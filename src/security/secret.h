/* Private: the job's shared secret (MLXDIST_SECRET_FILE) and the few
 * cryptographic primitives mlxdist uses. docs/security.md says what each
 * protects against.
 *
 * Nothing here is hand-rolled crypto: HMAC-SHA256 and SHA-256 are OpenSSL's
 * libcrypto, the random source is the kernel's (getrandom), and the
 * constant-time compare and the wipe need no library. Every function is
 * thread-safe and never blocks beyond reading the secret file once (and
 * getrandom before the kernel's pool is first initialised after boot). */
#ifndef MLXD_SECRET_H
#define MLXD_SECRET_H

#include <stdbool.h>
#include <stddef.h>

#include "util/status.h"

#define MLXD_KEY_BYTES 32
/* Secret files hold at least this many bytes (e.g. `openssl rand -hex 32`) and at most the max. */
#define MLXD_SECRET_MIN_BYTES 16
#define MLXD_SECRET_MAX_BYTES 4096

typedef struct mlxd_secret {
  bool have;                         /* false: MLXDIST_SECRET_FILE is unset */
  unsigned char key[MLXD_KEY_BYTES]; /* SHA-256 of a label and the file's bytes */
} mlxd_secret;

/* Load OpenSSL (security/ossl.h: libssl by dlopen, on first use) and initialise it
 * once, without its at-exit clean-up: the library's stream workers may still be
 * inside OpenSSL calls until mlxdist's own teardown joins them, and a worker's
 * per-thread OpenSSL state is freed at its exit only while OpenSSL's thread key
 * exists. Every function here that needs OpenSSL calls it first; so must any other
 * user of OpenSSL in mlxdist (tls.c). Idempotent, thread-safe. 0, or (OpenSSL
 * cannot be loaded) an MLXD_ESYS error naming the library, st may be NULL. */
int mlxd_crypto_init(mlxd_status* st);

/* Read MLXDIST_SECRET_FILE (if set). The file must be a regular file owned by
 * this user and not readable or writable by group or others; it is read with
 * a bound. Unset: out->have = false, returns 0. Any problem: an MLXD_EINVAL or
 * MLXD_ESYS error naming the file and what to fix. */
int mlxd_secret_load(mlxd_secret* out, mlxd_status* st);
/* Load from an explicit path (the same checks; used by the loader and tests). */
int mlxd_secret_load_path(const char* path, mlxd_secret* out, mlxd_status* st);

/* A key for one purpose: HMAC-SHA256(secret key, label). Distinct labels give
 * independent keys (e.g. "handshake", "tls psk"). 0 or -1 (libcrypto failed). */
int mlxd_secret_derive(const mlxd_secret* s, const char* label, unsigned char out[MLXD_KEY_BYTES]);

/* HMAC-SHA256 of the concatenation of n parts. 0 or -1 (libcrypto failed). */
int mlxd_hmac_sha256(const unsigned char* key, size_t key_len, const void* const* parts,
                     const size_t* lens, int n, unsigned char out[MLXD_KEY_BYTES]);
/* SHA-256 of buf. */
void mlxd_sha256(const void* buf, size_t len, unsigned char out[MLXD_KEY_BYTES]);
/* Constant-time equality of two n-byte buffers (every byte read, whatever differs). */
bool mlxd_ct_equal(const void* a, const void* b, size_t n);
/* Clear memory that held key material (explicit_bzero: not optimised away). */
void mlxd_wipe(void* p, size_t n);
/* n bytes from the kernel's CSPRNG (getrandom). 0, or an MLXD_ESYS error naming it. */
int mlxd_random_bytes(void* buf, size_t n, mlxd_status* st);

#endif

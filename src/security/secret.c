/* The shared secret and libcrypto wrappers (secret.h). */
#include "security/secret.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "security/ossl.h" /* OpenSSL by dlopen: mlxd_crypto_init first */
#include "util/tunables.h"

static const char KEY_LABEL[] = "mlxdist secret v1";

static int bad_file(mlxd_status* st, const char* path, const char* what) {
  return mlxd_fail(st, MLXD_EINVAL, "MLXDIST_SECRET_FILE '%s' %s", path, what);
}

int mlxd_secret_load_path(const char* path, mlxd_secret* out, mlxd_status* st) {
  memset(out, 0, sizeof *out);
  if (mlxd_crypto_init(st)) return st->code;
  /* O_NONBLOCK: a FIFO must not block the open; it is refused below. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    int e = errno;
    mlxd_fail(st, MLXD_ESYS, "cannot open MLXDIST_SECRET_FILE '%s': %s", path, strerror(e));
    mlxd_status_set_sys(st, "open", e);
    return MLXD_ESYS;
  }
  struct stat sb;
  int rc = 0;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    rc = mlxd_fail(st, MLXD_ESYS, "cannot stat MLXDIST_SECRET_FILE '%s': %s", path, strerror(e));
  } else if (!S_ISREG(sb.st_mode)) {
    rc = bad_file(st, path, "is not a regular file");
  } else if (sb.st_uid != geteuid()) {
    rc = bad_file(st, path, "is not owned by this user; a secret must be the user's own file");
  } else if (sb.st_mode & (S_IRWXG | S_IRWXO)) {
    char why[160];
    snprintf(why, sizeof why,
             "is accessible by group or others (mode %04o); make it private: chmod 600",
             (unsigned)(sb.st_mode & 07777));
    rc = bad_file(st, path, why);
  } else if (sb.st_size < MLXD_SECRET_MIN_BYTES || sb.st_size > MLXD_SECRET_MAX_BYTES) {
    char why[160];
    snprintf(why, sizeof why, "holds %lld bytes; a secret has %d to %d (e.g. openssl rand -hex 32)",
             (long long)sb.st_size, MLXD_SECRET_MIN_BYTES, MLXD_SECRET_MAX_BYTES);
    rc = bad_file(st, path, why);
  }
  if (rc) {
    close(fd);
    return rc;
  }
  unsigned char buf[MLXD_SECRET_MAX_BYTES + 1];
  size_t got = 0;
  while (got < sizeof buf) { /* bounded: one byte past the limit tells a file that grew */
    ssize_t k = read(fd, buf + got, sizeof buf - got);
    if (k == 0) break;
    if (k < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      close(fd);
      mlxd_wipe(buf, sizeof buf);
      mlxd_fail(st, MLXD_ESYS, "cannot read MLXDIST_SECRET_FILE '%s': %s", path, strerror(e));
      mlxd_status_set_sys(st, "read", e);
      return MLXD_ESYS;
    }
    got += (size_t)k;
  }
  close(fd);
  if (got < MLXD_SECRET_MIN_BYTES || got > MLXD_SECRET_MAX_BYTES) {
    mlxd_wipe(buf, sizeof buf);
    return bad_file(st, path, "changed size while it was read");
  }
  const void* parts[2] = {KEY_LABEL, buf};
  const size_t lens[2] = {sizeof KEY_LABEL, got};
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  unsigned int n = 0;
  bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 &&
            EVP_DigestUpdate(ctx, parts[0], lens[0]) == 1 &&
            EVP_DigestUpdate(ctx, parts[1], lens[1]) == 1 &&
            EVP_DigestFinal_ex(ctx, out->key, &n) == 1 && n == MLXD_KEY_BYTES;
  EVP_MD_CTX_free(ctx);
  mlxd_wipe(buf, sizeof buf);
  if (!ok) return mlxd_fail(st, MLXD_ESYS, "libcrypto could not hash MLXDIST_SECRET_FILE");
  out->have = true;
  return 0;
}

int mlxd_secret_load(mlxd_secret* out, mlxd_status* st) {
  memset(out, 0, sizeof *out);
  const char* path = mlxd_tunable_str(MLXD_T_SECRET_FILE);
  if (!path || !*path) return 0;
  return mlxd_secret_load_path(path, out, st);
}

int mlxd_hmac_sha256(const unsigned char* key, size_t key_len, const void* const* parts,
                     const size_t* lens, int n, unsigned char out[MLXD_KEY_BYTES]) {
  if (mlxd_crypto_init(NULL)) return -1;
  /* EVP_MAC: OpenSSL 3's interface (HMAC_CTX is deprecated there). */
  EVP_MAC* mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
  EVP_MAC_CTX* ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
  OSSL_PARAM params[2];
  params[0] = OSSL_PARAM_construct_utf8_string("digest", (char*)"SHA256", 0);
  params[1] = OSSL_PARAM_construct_end();
  bool ok = ctx && EVP_MAC_init(ctx, key, key_len, params) == 1;
  for (int i = 0; ok && i < n; i++) ok = EVP_MAC_update(ctx, parts[i], lens[i]) == 1;
  size_t outl = 0;
  ok = ok && EVP_MAC_final(ctx, out, &outl, MLXD_KEY_BYTES) == 1 && outl == MLXD_KEY_BYTES;
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  return ok ? 0 : -1;
}

int mlxd_secret_derive(const mlxd_secret* s, const char* label, unsigned char out[MLXD_KEY_BYTES]) {
  const void* parts[1] = {label};
  const size_t lens[1] = {strlen(label)};
  return mlxd_hmac_sha256(s->key, sizeof s->key, parts, lens, 1, out);
}

void mlxd_sha256(const void* buf, size_t len, unsigned char out[MLXD_KEY_BYTES]) {
  mlxd_status st;
  memset(&st, 0, sizeof st);
  if (mlxd_crypto_init(&st) == 0) {
    SHA256(buf, len, out);
    return;
  }
  /* Unreachable where it matters: every caller deriving a token (ring.c,
   * bootstrap.c, jaccl, the nccl exchange) runs mlxd_crypto_init first and
   * fails naming the library; a caller that did not gets zeros, said once. */
  static int said;
  if (__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED) == 0)
    fprintf(stderr, "[mlxdist] %s\n", st.msg);
  memset(out, 0, MLXD_KEY_BYTES);
}

/* explicit_bzero: a clear the compiler may not drop (as OPENSSL_cleanse). These three need
 * no libcrypto, so a job without a secret never initialises OpenSSL (docs/scale.md). */
void mlxd_wipe(void* p, size_t n) { explicit_bzero(p, n); }

bool mlxd_ct_equal(const void* a, const void* b, size_t n) {
  /* every byte compared whatever differs first; volatile so the loop is not cut short */
  const volatile unsigned char* x = a;
  const volatile unsigned char* y = b;
  unsigned char d = 0;
  for (size_t i = 0; i < n; i++) d |= (unsigned char)(x[i] ^ y[i]);
  return d == 0;
}

/* The kernel's CSPRNG (getrandom(2), which also seeds OpenSSL's): OpenSSL's own
 * generator cost ~8 million instructions to set up in every process, more than the rest
 * of a rank's init (docs/scale.md). Blocks only until the kernel's pool is first
 * initialised after boot; never returns fewer bytes than asked. */
int mlxd_random_bytes(void* buf, size_t n, mlxd_status* st) {
  unsigned char* p = buf;
  size_t got = 0;
  while (got < n) {
    ssize_t k = getrandom(p + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      int e = k < 0 ? errno : EIO;
      mlxd_fail(st, MLXD_ESYS, "the random number generator (getrandom) failed: %s", strerror(e));
      mlxd_status_set_sys(st, "getrandom", e);
      return MLXD_ESYS;
    }
    got += (size_t)k;
  }
  return 0;
}

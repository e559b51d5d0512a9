/* TLS 1.3 with an external PSK for the TCP transport (tls.h). */
#include "transport/tls.h"

#include <errno.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "security/ossl.h" /* OpenSSL by dlopen, after mlxd_crypto_init */
#include "security/secret.h"
#include "util/clock.h"
#include "util/tunables.h"

#define TLS_PSK_ID "mlxdist-psk-v1"
#define TLS_SUITE "TLS_AES_128_GCM_SHA256"
#define TLS_READ_BUF (64u << 10) /* read-ahead buffer: several records per recv */
#define TLS_POLL_MS 200          /* longest single poll of the handshake loop */

struct mlxd_tls {
  SSL_CTX* ctx;
  SSL_SESSION* psk; /* the PSK as a TLS 1.3 session: key, cipher, version */
  const SSL_CIPHER* cipher;
  BIO_METHOD* bio;
};

int mlxd_tls_wanted(bool* on, mlxd_status* st) {
  /* The flag's rule is the tunable's (tunables.h), as init checked it; a transport
   * made without init (tests) still gets this error for a bad value. */
  const char* v = mlxd_tunable_str(MLXD_T_TLS);
  double d = 0;
  *on = false;
  if (mlxd_tunable_parse(MLXD_T_TLS, v, &d, NULL, 0) == 0) {
    *on = d != 0;
    return 0;
  }
  return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_TCP,
                      "MLXDIST_TLS=%s is not valid: expected 0 (plain TCP) or 1 (TLS 1.3)", v);
}

/* OpenSSL's reason for the last failure on this thread ("" if none). */
static void ssl_reason(char* why, size_t n) {
  unsigned long e = ERR_peek_last_error();
  if (e)
    ERR_error_string_n(e, why, n);
  else
    snprintf(why, n, "no reason given by OpenSSL");
  ERR_clear_error();
}

/* ---- a socket BIO that never raises SIGPIPE and never blocks ---- */

static int bio_write(BIO* b, const char* buf, int n) {
  int fd = (int)(intptr_t)BIO_get_data(b);
  BIO_clear_retry_flags(b);
  for (;;) {
    ssize_t w = send(fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w >= 0) return (int)w;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(b);
    return -1;
  }
}

static int bio_read(BIO* b, char* buf, int n) {
  int fd = (int)(intptr_t)BIO_get_data(b);
  BIO_clear_retry_flags(b);
  for (;;) {
    ssize_t k = recv(fd, buf, (size_t)n, MSG_DONTWAIT);
    if (k >= 0) return (int)k;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(b);
    return -1;
  }
}

static long bio_ctrl(BIO* b, int cmd, long num, void* ptr) {
  (void)b;
  (void)num;
  (void)ptr;
  return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

/* ---- PSK callbacks: both ends use the one session holding the key ---- */

static int psk_use(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* idlen,
                   SSL_SESSION** sess) {
  mlxd_tls* x = SSL_get_app_data(ssl);
  *id = NULL;
  *idlen = 0;
  *sess = NULL;
  if (md && md != SSL_CIPHER_get_handshake_digest(x->cipher)) return 1; /* no PSK for this hash */
  if (!SSL_SESSION_up_ref(x->psk)) return 0;
  *sess = x->psk;
  *id = (const unsigned char*)TLS_PSK_ID;
  *idlen = strlen(TLS_PSK_ID);
  return 1;
}

static int psk_find(SSL* ssl, const unsigned char* id, size_t idlen, SSL_SESSION** sess) {
  mlxd_tls* x = SSL_get_app_data(ssl);
  *sess = NULL;
  if (idlen != strlen(TLS_PSK_ID) || memcmp(id, TLS_PSK_ID, idlen) != 0) return 1; /* unknown */
  if (!SSL_SESSION_up_ref(x->psk)) return 0;
  *sess = x->psk;
  return 1;
}

void mlxd_tls_free(mlxd_tls* x) {
  if (!x) return;
  SSL_SESSION_free(x->psk);
  SSL_CTX_free(x->ctx);
  BIO_meth_free(x->bio);
  free(x);
}

mlxd_tls* mlxd_tls_new(mlxd_status* st) {
  if (mlxd_crypto_init(st)) return NULL;
  mlxd_secret sec;
  if (mlxd_secret_load(&sec, st) != 0) return NULL;
  if (!sec.have) {
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_TCP,
                 "MLXDIST_TLS=1 needs the job's shared secret to key TLS, but "
                 "MLXDIST_SECRET_FILE is not set (give every rank the same private secret file, "
                 "or unset MLXDIST_TLS)");
    return NULL;
  }
  unsigned char key[MLXD_KEY_BYTES];
  int drc = mlxd_secret_derive(&sec, "tls psk", key);
  OPENSSL_cleanse(&sec, sizeof sec);
  mlxd_tls* x = calloc(1, sizeof *x);
  char why[256] = "";
  SSL* probe = NULL;
  bool ok = drc == 0 && x;
  if (ok) {
    x->bio = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "mlxdist socket");
    x->ctx = SSL_CTX_new(TLS_method());
    x->psk = SSL_SESSION_new();
    ok = x->bio && x->ctx && x->psk;
  }
  ok = ok && BIO_meth_set_write(x->bio, bio_write) && BIO_meth_set_read(x->bio, bio_read) &&
       BIO_meth_set_ctrl(x->bio, bio_ctrl);
  ok = ok && SSL_CTX_set_min_proto_version(x->ctx, TLS1_3_VERSION) &&
       SSL_CTX_set_max_proto_version(x->ctx, TLS1_3_VERSION) &&
       SSL_CTX_set_ciphersuites(x->ctx, TLS_SUITE) && SSL_CTX_set_num_tickets(x->ctx, 0);
  if (ok) {
    SSL_CTX_set_options(x->ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_TICKET);
    SSL_CTX_set_mode(x->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_read_ahead(x->ctx, 1);
    SSL_CTX_set_default_read_buffer_len(x->ctx, TLS_READ_BUF);
    SSL_CTX_set_psk_use_session_callback(x->ctx, psk_use);
    SSL_CTX_set_psk_find_session_callback(x->ctx, psk_find);
    probe = SSL_new(x->ctx);
    static const unsigned char aes128gcm[2] = {0x13, 0x01};
    x->cipher = probe ? SSL_CIPHER_find(probe, aes128gcm) : NULL;
    ok = x->cipher && SSL_SESSION_set1_master_key(x->psk, key, sizeof key) &&
         SSL_SESSION_set_cipher(x->psk, x->cipher) &&
         SSL_SESSION_set_protocol_version(x->psk, TLS1_3_VERSION);
  }
  OPENSSL_cleanse(key, sizeof key);
  SSL_free(probe);
  if (!ok) {
    ssl_reason(why, sizeof why);
    mlxd_fail_at(st, x ? MLXD_ESYS : MLXD_ENOMEM, MLXD_LAYER_TCP,
                 "cannot set up TLS for MLXDIST_TLS=1: %s", why);
    mlxd_tls_free(x);
    return NULL;
  }
  return x;
}

mlxd_tls_conn* mlxd_tls_conn_new(mlxd_tls* x, int fd, bool client, mlxd_status* st) {
  SSL* s = SSL_new(x->ctx);
  BIO* b = BIO_new(x->bio);
  if (!s || !b) {
    SSL_free(s);
    BIO_free(b);
    ERR_clear_error();
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP, "out of memory setting up a TLS connection");
    return NULL;
  }
  BIO_set_data(b, (void*)(intptr_t)fd);
  BIO_set_init(b, 1);
  SSL_set_bio(s, b, b);
  SSL_set_app_data(s, x);
  if (client)
    SSL_set_connect_state(s);
  else
    SSL_set_accept_state(s);
  return s;
}

void mlxd_tls_conn_free(mlxd_tls_conn* c) {
  if (!c) return;
  if (SSL_is_init_finished(c)) (void)SSL_shutdown(c); /* close_notify, never blocks */
  ERR_clear_error();
  SSL_free(c);
}

mlxd_tls_io mlxd_tls_handshake(mlxd_tls_conn* c, int* err, char* why, size_t why_n) {
  *err = 0;
  if (SSL_is_init_finished(c)) return MLXD_TLS_OK;
  ERR_clear_error();
  errno = 0;
  int r = SSL_do_handshake(c);
  if (r == 1) return MLXD_TLS_OK;
  int sys = errno;
  int e = SSL_get_error(c, r);
  if (e == SSL_ERROR_WANT_READ) return MLXD_TLS_WANT_READ;
  if (e == SSL_ERROR_WANT_WRITE) return MLXD_TLS_WANT_WRITE;
  if (e == SSL_ERROR_SSL) {
    ssl_reason(why, why_n);
    return MLXD_TLS_ERROR;
  }
  ERR_clear_error();
  if (e == SSL_ERROR_SYSCALL && sys) {
    *err = sys;
    snprintf(why, why_n, "%s", strerror(sys));
    return MLXD_TLS_ERROR;
  }
  snprintf(why, why_n, "the peer closed the connection");
  return MLXD_TLS_EOF;
}

int mlxd_tls_handshake_all(mlxd_tls_conn* const* conns, const int* fds, const int* peers,
                           const char* const* addrs, int n, double timeout_s, mlxd_status* st) {
  struct pollfd* pf = calloc((size_t)n + 1, sizeof *pf);
  int* which = calloc((size_t)n + 1, sizeof *which);
  bool* done = calloc((size_t)n + 1, sizeof *done);
  if (!pf || !which || !done) {
    free(pf);
    free(which);
    free(done);
    return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP, "out of memory for the TLS handshakes");
  }
  double deadline = mlxd_now() + timeout_s;
  int rc = 0;
  for (;;) {
    int np = 0;
    for (int i = 0; i < n && rc == 0; i++) {
      if (!conns[i] || done[i]) continue;
      char why[256];
      int err = 0;
      mlxd_tls_io io = mlxd_tls_handshake(conns[i], &err, why, sizeof why);
      if (io == MLXD_TLS_OK) {
        done[i] = true;
        continue;
      }
      if (io == MLXD_TLS_WANT_READ || io == MLXD_TLS_WANT_WRITE) {
        pf[np].fd = fds[i];
        pf[np].events = io == MLXD_TLS_WANT_READ ? POLLIN : POLLOUT;
        which[np++] = i;
        continue;
      }
      rc = mlxd_tls_handshake_failed(st, peers[i], addrs[i], why);
    }
    if (rc != 0 || np == 0) break;
    double now = mlxd_now();
    if (now >= deadline) {
      int i = which[0];
      rc = mlxd_tls_handshake_timeout(st, peers[i], addrs[i], timeout_s);
      break;
    }
    int ms = mlxd_ms_left(deadline);
    if (ms > TLS_POLL_MS) ms = TLS_POLL_MS;
    if (poll(pf, (nfds_t)np, ms) < 0 && errno != EINTR) {
      rc = mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_TCP, "poll during the TLS handshakes failed");
      mlxd_status_set_sys(st, "poll", errno);
      break;
    }
  }
  free(pf);
  free(which);
  free(done);
  return rc;
}

int mlxd_tls_handshake_failed(mlxd_status* st, int peer, const char* addr, const char* why) {
  int rc = mlxd_fail_at(st, MLXD_EREMOTE, MLXD_LAYER_TCP,
                        "TLS handshake with rank %d failed: %s; do both ranks run with "
                        "MLXDIST_TLS=1 and the same MLXDIST_SECRET_FILE?",
                        peer, why);
  mlxd_status_set_peer(st, peer, addr);
  return rc;
}

int mlxd_tls_handshake_timeout(mlxd_status* st, int peer, const char* addr, double timeout_s) {
  int rc = mlxd_fail_at(st, MLXD_ETIMEDOUT, MLXD_LAYER_TCP,
                        "TLS handshake with rank %d timed out after %g s "
                        "(MLXDIST_CONNECT_TIMEOUT); does that rank run with MLXDIST_TLS=1?",
                        peer, timeout_s);
  mlxd_status_set_peer(st, peer, addr);
  return rc;
}

static mlxd_tls_io io_result(mlxd_tls_conn* c, int r, int* err, char* why, size_t why_n) {
  int sys = errno;
  int e = SSL_get_error(c, r);
  *err = 0;
  switch (e) {
    case SSL_ERROR_WANT_READ: return MLXD_TLS_WANT_READ;
    case SSL_ERROR_WANT_WRITE: return MLXD_TLS_WANT_WRITE;
    case SSL_ERROR_ZERO_RETURN: return MLXD_TLS_EOF;
    case SSL_ERROR_SYSCALL:
      ERR_clear_error();
      if (!sys) return MLXD_TLS_EOF;
      *err = sys;
      return MLXD_TLS_ERROR;
    default: ssl_reason(why, why_n); return MLXD_TLS_ERROR;
  }
}

mlxd_tls_io mlxd_tls_write(mlxd_tls_conn* c, const void* buf, size_t n, size_t* moved, int* err,
                           char* why, size_t why_n) {
  ERR_clear_error();
  errno = 0;
  int r = SSL_write_ex(c, buf, n, moved);
  if (r == 1) return MLXD_TLS_OK;
  return io_result(c, r, err, why, why_n);
}

mlxd_tls_io mlxd_tls_read(mlxd_tls_conn* c, void* buf, size_t n, size_t* moved, int* err, char* why,
                          size_t why_n) {
  ERR_clear_error();
  errno = 0;
  int r = SSL_read_ex(c, buf, n, moved);
  if (r == 1) return MLXD_TLS_OK;
  return io_result(c, r, err, why, why_n);
}

bool mlxd_tls_pending(mlxd_tls_conn* c) { return SSL_pending(c) > 0; }

/* Private: TLS 1.3 for the TCP transport (MLXDIST_TLS=1), with OpenSSL's
 * libssl. docs/security.md ("Encryption") says what it protects.
 *
 * Keying. No certificates: both ends hold the job's secret
 * (MLXDIST_SECRET_FILE) and use a key derived from it ("tls psk", see
 * security/secret.h) as a TLS 1.3 external pre-shared key, with
 * (EC)DHE on top (psk_dhe_ke: forward secrecy) and the cipher suite
 * TLS_AES_128_GCM_SHA256 only. A peer without the same secret fails the
 * handshake (its binder does not verify), on both sides.
 *
 * Roles. Of the two ends of a connection, the higher rank is the TLS client.
 *
 * When. Eager connections (MLXDIST_CONNECT=eager): all handshakes at once
 * inside the transport's creation (mlxd_tls_handshake_all). Lazy ones: each
 * connection's handshake is stepped (mlxd_tls_handshake) by the transport's
 * progress as soon as the ring's own handshake handed it over (tcp_tls.c).
 *
 * I/O. The sockets are non-blocking; the wrappers below map OpenSSL's
 * results to "moved n bytes", "would block" (wanting a read or a write),
 * "end of stream" or an error with OpenSSL's reason. The socket I/O under
 * OpenSSL uses send(MSG_NOSIGNAL)/recv (a closed peer never raises SIGPIPE).
 * Data OpenSSL has already read is not visible to poll(): callers read
 * until "would block", check mlxd_tls_pending() before they sleep, and read
 * each connection once after the handshake (which may have read ahead).
 *
 * Threads: an SSL object is used by one thread at a time; the TCP transport
 * only touches them under its mutex. The context (mlxd_tls) is read-only
 * after creation. */
#ifndef MLXD_TLS_H
#define MLXD_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include "util/status.h"

typedef struct mlxd_tls mlxd_tls;
typedef struct ssl_st mlxd_tls_conn; /* OpenSSL's SSL */

/* MLXDIST_TLS: *on = false for 0 (the default), true for 1; anything else
 * is an MLXD_EINVAL error naming the variable. */
int mlxd_tls_wanted(bool* on, mlxd_status* st);

/* The TLS context of this process, keyed from MLXDIST_SECRET_FILE. Unset
 * secret: an MLXD_EINVAL error naming MLXDIST_TLS and MLXDIST_SECRET_FILE. */
mlxd_tls* mlxd_tls_new(mlxd_status* st);
void mlxd_tls_free(mlxd_tls* x);

/* A TLS connection over the connected non-blocking socket fd (not owned).
 * NULL on failure (out of memory), with st set. */
mlxd_tls_conn* mlxd_tls_conn_new(mlxd_tls* x, int fd, bool client, mlxd_status* st);
/* Send close_notify if possible (never blocks) and free. NULL is a no-op. */
void mlxd_tls_conn_free(mlxd_tls_conn* c);

/* Handshake conns[0..n) (NULL entries skipped) all at once, polling their
 * sockets, for at most timeout_s (blocks that long at most). peers[i] /
 * addrs[i] name the other end in errors ("TLS handshake with rank 1
 * (127.0.0.1:5000) failed: ..."). The eager transport's creation. */
int mlxd_tls_handshake_all(mlxd_tls_conn* const* conns, const int* fds, const int* peers,
                           const char* const* addrs, int n, double timeout_s, mlxd_status* st);

typedef enum mlxd_tls_io {
  MLXD_TLS_OK,         /* *moved > 0 bytes (a handshake: it is complete) */
  MLXD_TLS_WANT_READ,  /* would block until the socket is readable */
  MLXD_TLS_WANT_WRITE, /* would block until the socket is writable */
  MLXD_TLS_EOF,        /* the peer closed the connection */
  MLXD_TLS_ERROR,      /* *err: an errno (a socket call failed) or 0 and why is set */
} mlxd_tls_io;

/* One non-blocking step of c's handshake (never blocks): OK once it is
 * complete (also when it was already), WANT_READ / WANT_WRITE while it
 * waits for the socket; EOF or ERROR when it failed, with why set (OpenSSL's
 * reason, strerror, or "the peer closed the connection"). A lazy
 * connection's handshake (tcp_tls.c), and each round of handshake_all. */
mlxd_tls_io mlxd_tls_handshake(mlxd_tls_conn* c, int* err, char* why, size_t why_n);
/* The two ways a handshake with peer fails, worded once for the eager and
 * the lazy set-up: st set (naming peer, at addr; may be NULL), its code
 * returned. failed: why is the reason from mlxd_tls_handshake;
 * timeout: no completion within timeout_s (MLXDIST_CONNECT_TIMEOUT). */
int mlxd_tls_handshake_failed(mlxd_status* st, int peer, const char* addr, const char* why);
int mlxd_tls_handshake_timeout(mlxd_status* st, int peer, const char* addr, double timeout_s);

/* Write up to n > 0 bytes. After WANT_*, call again with the same bytes
 * (the buffer may move). Partial writes are OK results. */
mlxd_tls_io mlxd_tls_write(mlxd_tls_conn* c, const void* buf, size_t n, size_t* moved, int* err,
                           char* why, size_t why_n);
mlxd_tls_io mlxd_tls_read(mlxd_tls_conn* c, void* buf, size_t n, size_t* moved, int* err, char* why,
                          size_t why_n);
/* Whether decrypted bytes wait inside OpenSSL (poll cannot see them). */
bool mlxd_tls_pending(mlxd_tls_conn* c);

#endif

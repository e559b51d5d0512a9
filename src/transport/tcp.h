/* Private: the TCP transport (an mlxd_transport over stream sockets).
 * Connection set-up (hostfile, bootstrap, retries, handshakes) is the ring
 * backend's job (src/backends/ring); this file only moves bytes, over
 * connections handed to it at creation (mlxd_tcp_transport_new) or made on
 * first use by a dialer (mlxd_tcp_transport_lazy). */
#ifndef MLXD_TCP_H
#define MLXD_TCP_H

#include "transport/spin.h"
#include "transport/transport.h"

/* Build a transport from connected stream sockets. fds[p * nconn + c] is
 * connection c (0 <= c < nconn) to peer p; entries for p == rank are -1.
 * Takes ownership of every fd (closed by destroy, also when this fails).
 * Returns NULL with st set on failure. */
mlxd_transport* mlxd_tcp_transport_new(int rank, int size, const int* fds, int nconn,
                                       mlxd_status* st);

/* Set how a wait spends the time before it blocks (spin.h) from the number
 * of the group's ranks on this machine's CPUs; creation assumes all of them
 * (the transport does not know the hosts). Returns the rule it set. Takes
 * the transport's mutex; never blocks otherwise, cannot fail. */
mlxd_spin_rule mlxd_tcp_set_local_ranks(mlxd_transport* t, int local_ranks);

/* What makes a lazy transport's connections (the networking layer's: net/dialer.c). Every
 * op is called with the transport's mutex held, from the thread that drives
 * the transport (or the watchdog's heartbeat), never concurrently, and never
 * blocks. A connection that completes its handshake is handed over with
 * ready(ready_ctx, peer, conn, fd) from inside want or step (the transport
 * owns fd from then on; it may be blocking). */
typedef struct mlxd_tcp_dialer mlxd_tcp_dialer;
typedef struct mlxd_tcp_dialer_ops {
  /* Start making the nconn connections to peer, unless they exist or are
   * under way (peer != this rank). 0, or an error (st names the peer). */
  int (*want)(mlxd_tcp_dialer* d, int peer, mlxd_status* st);
  /* One non-blocking pass: accept and answer incoming handshakes, advance
   * outgoing ones, expire what ran out of time. 0, or an error that fails
   * the transport (a connection that could not be made within
   * MLXDIST_CONNECT_TIMEOUT, a peer that failed the handshake's proof; st
   * names the peer). */
  int (*step)(mlxd_tcp_dialer* d, mlxd_status* st);
  /* When step must run next even if fd() shows nothing (a retry, an
   * expiry), as mlxd_now() time; INFINITY when nothing is timed. */
  double (*next)(mlxd_tcp_dialer* d);
  /* A descriptor (an epoll fd) that is readable while step has work. */
  int (*fd)(mlxd_tcp_dialer* d);
  /* From now on answer every hello that passes its checks with a refusal
   * naming why (handshake.h) and dial nothing: why is the transport's
   * failure (it failed), or NULL (it is being destroyed). A failure given
   * once stays the reason. Never blocks. */
  void (*refuse)(mlxd_tcp_dialer* d, const mlxd_status* why);
  /* The transport's forget (transport.h): close() every descriptor, nothing else. */
  void (*forget)(mlxd_tcp_dialer* d);
  /* Close the listeners and every connection not handed over; free d. */
  void (*free)(mlxd_tcp_dialer* d);
} mlxd_tcp_dialer_ops;
struct mlxd_tcp_dialer {
  const mlxd_tcp_dialer_ops* ops;
  void (*ready)(void* ctx, int peer, int conn, int fd); /* set by the transport */
  void* ready_ctx;
};

/* Build a transport that starts with no connection: the first isend or
 * irecv naming a peer asks d for its connections (so every peer a wait
 * depends on is connected and watched). Takes ownership of d (freed by
 * destroy, also when this fails). With MLXDIST_TLS=1 each connection's TLS
 * handshake runs in the transport's progress once d hands it over
 * (tcp_tls.c); its context is made here (no MLXDIST_SECRET_FILE: st). */
mlxd_transport* mlxd_tcp_transport_lazy(int rank, int size, int nconn, mlxd_tcp_dialer* d,
                                        mlxd_status* st);

/* Connections this transport holds (made at creation or since); -1 when t
 * is not a TCP transport. peers (size entries, may be NULL) receives 1 for
 * each peer with at least one. For logs and tests. */
int mlxd_tcp_connections(mlxd_transport* t, unsigned char* peers);

#endif

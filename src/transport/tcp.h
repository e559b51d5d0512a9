/* Private: the TCP transport (an mlxd_transport over connected sockets).
 * Connection set-up (hostfile, bootstrap, retries) is the ring backend's
 * job (src/backends/ring); this file only moves bytes. */
#ifndef MLXD_TCP_H
#define MLXD_TCP_H

#include "transport/transport.h"

/* Build a transport from connected stream sockets. fds[p * nconn + c] is
 * connection c (0 <= c < nconn) to peer p; entries for p == rank are -1.
 * Takes ownership of every fd (closed by destroy, also when this fails).
 * Returns NULL with st set on failure. */
mlxd_transport* mlxd_tcp_transport_new(int rank, int size, const int* fds, int nconn,
                                       mlxd_status* st);

#endif

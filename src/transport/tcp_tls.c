/* The TCP transport over TLS 1.3 (MLXDIST_TLS=1; keying in tls.h).
 *
 * Set-up: inside the transport's creation, every connection gets an SSL
 * object (the higher rank of the two ends is the client) and all the
 * handshakes run at once, non-blocking, for at most MLXDIST_CONNECT_TIMEOUT.
 *
 * Writing: TLS cannot take an iovec, so the next bytes of a connection's
 * queue (fragment headers and small payloads) are coalesced into wbuf and
 * written as one record; a payload of at least TCP_TLS_WBUF bytes is handed
 * to SSL_write straight from the sender's buffer. Bytes count as sent (and
 * a send completes) only once OpenSSL took them, so nothing a completed
 * send wrote waits in wbuf. After a "would block", the very same bytes are
 * offered again (OpenSSL requires it): wbuf is not refilled until it has
 * been written, and a direct write is re-derived from the unchanged queue.
 *
 * Reading: SSL_read in place of recv, until it would block; so between
 * rounds OpenSSL holds at most an incomplete record, which poll sees the
 * rest of. Two exceptions the progress loop (tcp.c) handles: decrypted bytes
 * not yet returned (mlxd_tls_pending), and records read ahead during the
 * handshake (every connection is read once before the first poll: kick). A read that needs the socket writable (TLS 1.3 key
 * update) sets want_write so that the next round polls for POLLOUT. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "transport/tcp_impl.h"
#include "util/tunables.h"

int mlxd_tcp_tls_start(tcp_transport* t, mlxd_status* st) {
  t->tls = mlxd_tls_new(st);
  if (!t->tls) return st->code;
  int nc = t->base.size * t->nconn;
  mlxd_tls_conn** ssl = calloc((size_t)nc, sizeof *ssl);
  int* fds = calloc((size_t)nc, sizeof *fds);
  int* peers = calloc((size_t)nc, sizeof *peers);
  const char** addrs = calloc((size_t)nc, sizeof *addrs);
  int rc = 0;
  if (!ssl || !fds || !peers || !addrs)
    rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP, "out of memory setting up TLS");
  for (int i = 0; i < nc && rc == 0; i++) {
    tcp_conn* c = &t->conns[i];
    fds[i] = c->fd;
    peers[i] = c->peer;
    addrs[i] = t->peers[c->peer].addr;
    if (c->fd < 0) continue;
    c->wbuf = malloc(TCP_TLS_WBUF);
    c->ssl = mlxd_tls_conn_new(t->tls, c->fd, t->base.rank > c->peer, st);
    if (!c->ssl) {
      rc = st->code;
    } else if (!c->wbuf) {
      rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP, "out of memory setting up TLS");
    }
    ssl[i] = c->ssl;
  }
  if (rc == 0) {
    double to = mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT);
    rc = mlxd_tls_handshake_all(ssl, fds, peers, addrs, nc, to > 0 ? to : 30, st);
  }
  for (int i = 0; i < nc && rc == 0; i++) t->conns[i].kick = t->conns[i].ssl != NULL;
  free(ssl);
  free(fds);
  free(peers);
  free(addrs);
  return rc;
}

/* The outcome of a TLS write or read that did not move bytes, as 0 (would
 * block), an errno, or -2 (c->tls_why set). */
static int io_error(mlxd_tls_io io, int err) {
  switch (io) {
    case MLXD_TLS_WANT_READ:
    case MLXD_TLS_WANT_WRITE: return 0;
    case MLXD_TLS_EOF: return EPIPE;
    default: return err ? err : -2;
  }
}

/* Copy the next bytes of c's queue (without accounting them) into wbuf. */
static void stage(tcp_conn* c) {
  c->wpos = c->wlen = 0;
  tcp_frag* f = c->qhead;
  size_t s = f ? f->sent : 0;
  while (f && c->wlen < TCP_TLS_WBUF) {
    size_t room = TCP_TLS_WBUF - c->wlen;
    size_t m;
    if (s < TCP_HDR) {
      m = TCP_HDR - s < room ? TCP_HDR - s : room;
      memcpy(c->wbuf + c->wlen, f->hdr + s, m);
    } else {
      size_t pdone = s - TCP_HDR;
      m = f->len - pdone < room ? f->len - pdone : room;
      memcpy(c->wbuf + c->wlen, mlxd_tcp_frag_data(f) + pdone, m);
    }
    c->wlen += m;
    s += m;
    if (s == TCP_HDR + f->len) {
      f = f->next;
      s = f ? f->sent : 0;
    }
  }
}

int mlxd_tcp_tls_write(tcp_transport* t, tcp_conn* c) {
  for (;;) {
    size_t k = 0;
    int err = 0;
    mlxd_tls_io io;
    if (c->wpos < c->wlen) {
      io = mlxd_tls_write(c->ssl, c->wbuf + c->wpos, c->wlen - c->wpos, &k, &err, c->tls_why,
                          sizeof c->tls_why);
      if (io != MLXD_TLS_OK) return io_error(io, err);
      c->wpos += k;
      if (c->wpos == c->wlen) c->wpos = c->wlen = 0;
      mlxd_tcp_conn_advance(t, c, k);
      continue;
    }
    tcp_frag* f = c->qhead;
    if (!f) return 0;
    size_t pdone = f->sent >= TCP_HDR ? f->sent - TCP_HDR : 0;
    if (f->sent >= TCP_HDR && f->len - pdone >= TCP_TLS_WBUF) {
      size_t m = f->len - pdone < TCP_IO_MAX ? f->len - pdone : TCP_IO_MAX;
      io = mlxd_tls_write(c->ssl, mlxd_tcp_frag_data(f) + pdone, m, &k, &err, c->tls_why,
                          sizeof c->tls_why);
      if (io != MLXD_TLS_OK) return io_error(io, err);
      mlxd_tcp_conn_advance(t, c, k);
      continue;
    }
    stage(c);
  }
}

ssize_t mlxd_tcp_tls_recv(tcp_conn* c, void* buf, size_t n) {
  size_t k = 0;
  int err = 0;
  mlxd_tls_io io = mlxd_tls_read(c->ssl, buf, n, &k, &err, c->tls_why, sizeof c->tls_why);
  switch (io) {
    case MLXD_TLS_OK: return (ssize_t)k;
    case MLXD_TLS_EOF: return 0;
    case MLXD_TLS_WANT_WRITE:
      c->want_write = true;
      errno = EAGAIN;
      return -1;
    case MLXD_TLS_WANT_READ: errno = EAGAIN; return -1;
    default: errno = err ? err : EPROTO; return -1;
  }
}

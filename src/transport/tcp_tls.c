/* The TCP transport over TLS 1.3 (MLXDIST_TLS=1; keying in tls.h).
 *
 * Set-up, eager (mlxd_tcp_transport_new): inside the transport's creation,
 * every connection gets an SSL object (the higher rank of the two ends is
 * the client) and all the handshakes run at once, non-blocking, for at most
 * MLXDIST_CONNECT_TIMEOUT.
 *
 * Set-up, lazy (mlxd_tcp_transport_lazy): the dialer hands a connection
 * over once the ring's own handshake (job token, the secret's proofs, the
 * simultaneous-connect rule: net/mesh.h) has filled its slot on this side;
 * that is where its TLS handshake starts (mlxd_tcp_tls_begin: the client
 * sends its hello at once), and it runs inside the transport's progress as
 * one more non-blocking state of the connection (tls_hs): an event on its
 * socket steps it (mlxd_tcp_tls_step), so does the dialer's step (the
 * heartbeat tick of a rank busy outside mlxdist, mlxd_tcp_tls_step_all),
 * and a send steps it too. Until it is complete the connection carries no
 * data: fragments and heartbeats queued for it wait (no EPOLLOUT is asked
 * for them, only for the handshake's own writes), reads do nothing, and an
 * abort record is not sent over it. The handshake is bounded by
 * MLXDIST_CONNECT_TIMEOUT from the hand-over (checked before every wait,
 * mlxd_tcp_tls_before_wait, which also caps the wait's sleep). A failure
 * or the timeout fails the transport naming the peer, with the eager
 * set-up's words (tls.c). Only a peer that passed the ring's handshake (so
 * holds the secret, which TLS needs) ever gets here: a stranger is refused
 * before, by the dialer, as at init.
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
#include "util/clock.h"
#include "util/tunables.h"

/* MLXDIST_CONNECT_TIMEOUT, as the ring's set-up reads it. */
static double connect_s(void) {
  double to = mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT);
  return to > 0 ? to : 30;
}

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
    tcp_conn* c = mlxd_tcp_conn_at(t, i); /* eager: NULL only for this rank */
    fds[i] = c ? c->fd : -1;
    peers[i] = i / t->nconn;
    addrs[i] = t->peers[i / t->nconn].addr;
    if (!c || c->fd < 0) continue;
    c->wbuf = malloc(TCP_TLS_WBUF);
    c->ssl = mlxd_tls_conn_new(t->tls, c->fd, t->base.rank > c->peer, st);
    if (!c->ssl) {
      rc = st->code;
    } else if (!c->wbuf) {
      rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP, "out of memory setting up TLS");
    }
    ssl[i] = c->ssl;
  }
  if (rc == 0) rc = mlxd_tls_handshake_all(ssl, fds, peers, addrs, nc, connect_s(), st);
  for (int i = 0; i < nc && rc == 0; i++) {
    tcp_conn* c = mlxd_tcp_conn_at(t, i);
    if (c) c->kick = c->ssl != NULL;
  }
  free(ssl);
  free(fds);
  free(peers);
  free(addrs);
  return rc;
}

int mlxd_tcp_tls_begin(tcp_transport* t, tcp_conn* c, mlxd_status* st) {
  c->wbuf = malloc(TCP_TLS_WBUF);
  if (!c->wbuf)
    return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP,
                        "out of memory setting up TLS on the connection to rank %d", c->peer);
  c->ssl = mlxd_tls_conn_new(t->tls, c->fd, t->base.rank > c->peer, st);
  if (!c->ssl) return st->code;
  c->tls_hs = true;
  c->tls_by = mlxd_now() + connect_s();
  t->tls_hs_n++;
  (void)mlxd_tcp_tls_step(t, c); /* a failure failed the transport */
  mlxd_tcp_conn_arm(t, c);
  return 0;
}

int mlxd_tcp_tls_step(tcp_transport* t, tcp_conn* c) {
  if (!c->tls_hs) return 0;
  if (t->eng.err.code || c->fd < 0) return -1;
  int err = 0;
  mlxd_tls_io io = mlxd_tls_handshake(c->ssl, &err, c->tls_why, sizeof c->tls_why);
  if (io == MLXD_TLS_WANT_READ || io == MLXD_TLS_WANT_WRITE) {
    c->want_write = io == MLXD_TLS_WANT_WRITE;
    return 1;
  }
  if (io != MLXD_TLS_OK) { /* stays tls_hs: nothing more goes over it */
    mlxd_status s;
    mlxd_status_clear(&s);
    mlxd_tls_handshake_failed(&s, c->peer, t->peers[c->peer].addr, c->tls_why);
    mlxd_tcp_fail(t, &s);
    return -1;
  }
  c->tls_hs = false;
  c->want_write = false;
  c->tls_why[0] = '\0';
  t->tls_hs_n--;
  c->kick = true; /* the handshake may have read records ahead: read before sleeping */
  t->peers[c->peer].heard = mlxd_now();
  mlxd_tcp_wake(t); /* a progressor asleep in epoll_wait cannot see them */
  return 0;
}

void mlxd_tcp_tls_step_all(tcp_transport* t) {
  for (int i = 0; t->tls_hs_n > 0 && !t->eng.err.code && i < t->base.size * t->nconn; i++) {
    tcp_conn* c = mlxd_tcp_conn_at(t, i);
    if (!c || !c->tls_hs || c->fd < 0) continue;
    (void)mlxd_tcp_tls_step(t, c);
    mlxd_tcp_conn_arm(t, c); /* done: EPOLLOUT for what was queued meanwhile */
  }
}

int mlxd_tcp_tls_before_wait(tcp_transport* t, int timeout_ms) {
  double now = t->tls_hs_n > 0 ? mlxd_now() : 0;
  for (int i = 0; i < t->base.size * t->nconn && (timeout_ms > 0 || t->tls_hs_n > 0); i++) {
    tcp_conn* c = mlxd_tcp_conn_at(t, i);
    if (!c || !c->ssl || c->fd < 0 || c->eof) continue;
    if (c->tls_hs) {
      if (t->eng.err.code) continue;
      if (now >= c->tls_by) {
        mlxd_status s;
        mlxd_status_clear(&s);
        mlxd_tls_handshake_timeout(&s, c->peer, t->peers[c->peer].addr, connect_s());
        mlxd_tcp_fail(t, &s);
        return 0;
      }
      int ms = mlxd_ms_left(c->tls_by);
      if (ms < timeout_ms) timeout_ms = ms;
      continue;
    }
    if (c->kick || mlxd_tls_pending(c->ssl)) timeout_ms = 0;
  }
  return timeout_ms;
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
  /* Lazy: nothing goes out before the handshake is complete (a failed
   * transport does not step it: its abort record is not sent here). */
  if (c->tls_hs && (t->eng.err.code || mlxd_tcp_tls_step(t, c) != 0)) return 0;
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
  if (c->tls_hs) { /* only mlxd_tcp_tls_step advances a handshake */
    errno = EAGAIN;
    return -1;
  }
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

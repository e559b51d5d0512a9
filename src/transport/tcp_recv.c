/* The TCP transport's receive side (tcp.c has the design): posting a
 * receive, matching it against messages that arrived first, and reading
 * headers and payload off a connection into the posted buffer or an
 * unexpected-message buffer. Called with the transport's mutex held. */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/buffer.h"
#include "transport/engine.h"
#include "transport/tcp.h"
#include "transport/tcp_impl.h"
#include "util/clock.h"

int mlxd_tcp_irecv(mlxd_transport* tt, int peer, uint64_t tag, const mlxd_sig* sig, void* buf,
                   size_t n, mlxd_req** out, mlxd_status* st) {
  tcp_transport* t = (tcp_transport*)tt;
  assert(peer >= 0 && peer < t->base.size && peer != t->base.rank && (buf || n == 0) && out);
  *out = NULL;
  pthread_mutex_lock(&t->mu);
  tcp_req* r = (tcp_req*)mlxd_eng_req_alloc(&t->eng, TCP_REQ_SMALL);
  if (!r) {
    int code = mlxd_eng_req_refused(&t->eng, MLXD_ENG_RECV, peer, st);
    pthread_mutex_unlock(&t->mu);
    return code;
  }
  tcp_peer* pe = &t->peers[peer];
  mlxd_eng_req_init(&r->q, MLXD_ENG_RECV, peer, pe->addr, tag, sig, buf, n);
  /* The engine matches it against the messages that came first (their
   * calls compared), or posts it. */
  mlxd_eng_unexp* u = NULL;
  int k = mlxd_eng_recv(&t->eng, &pe->ep, &r->q, &u);
  if (k < 0) { /* the calls clash: the transport failed, r is released */
    int code = mlxd_eng_fail_status(&t->eng, st);
    pthread_mutex_unlock(&t->mu);
    return code;
  }
  tcp_imsg* m = (tcp_imsg*)u; /* the message taken over (k > 0) */
  if (k == 1) {               /* complete (copied into buf), or a size mismatch */
    if (!r->q.m.mismatch) r->done = n;
    mlxd_tcp_imsg_free(t, m);
  } else if (k == 2) {     /* still arriving (m->u.fill) */
    if (r->q.m.mismatch) { /* drain and drop the rest */
      mlxd_tcp_imsg_release(t, m);
      m->discard = true;
    } else { /* its rest lands in its buffer, copied to buf at its end */
      m->req = r;
      r->im = m;
      r->done = m->u.got;
      r->q.where = TCP_W_MSG;
    }
  } else if (t->eng.err.code || pe->closed) { /* posted, but nothing more will come */
    mlxd_eng_unlink(&t->eng, &r->q);
    if (!t->eng.err.code) mlxd_tcp_fail_lost(t, peer, NULL, 0);
    int code = mlxd_eng_fail_status(&t->eng, st);
    mlxd_tcp_req_free(t, r);
    pthread_mutex_unlock(&t->mu);
    return code;
  } else {
    mlxd_tcp_want(t, peer); /* lazy: connect now, so the wait watches the peer's liveness */
  }
  pthread_mutex_unlock(&t->mu);
  *out = (mlxd_req*)r;
  return 0;
}

/* Fail the transport: peer sent a header that breaks the protocol. */
static void fail_header(tcp_transport* t, int peer, const mlxd_tcp_hdr* h, const char* why) {
  char ts[64];
  mlxd_status s;
  mlxd_match_tag_str(h->tag, ts, sizeof ts);
  mlxd_fail_at(&s, MLXD_EREMOTE, MLXD_LAYER_TCP,
               "bad message header from rank %d (%s, offset %" PRIu64 ", length %" PRIu64
               ", total %" PRIu64 "): %s; is the peer an mlxdist rank of the same version?",
               peer, ts, h->off, h->len, h->total, why);
  mlxd_status_set_peer(&s, peer, t->peers[peer].addr);
  mlxd_tcp_fail(t, &s);
}

/* A fragment header arrived on c: check it (tcp_wire.h), then find or
 * create its message. 0 or -1 (failed). */
static int on_header(tcp_transport* t, tcp_conn* c, const unsigned char* raw) {
  tcp_peer* pe = &t->peers[c->peer];
  char why[256];
  mlxd_tcp_hdr h;
  if (mlxd_tcp_hdr_decode(raw, &h, why, sizeof why) != 0) {
    fail_header(t, c->peer, &h, why);
    return -1;
  }
  tcp_imsg* m = MLXD_MATCH_ENTRY(mlxd_match_find(&pe->arriving, h.tag), tcp_imsg, arr);
  mlxd_tcp_rx_state rs = {.ux_charged = pe->ux_charged, .ux_budget = t->ux_budget};
  tcp_req* r = NULL;
  if (m) {
    rs.arriving = true;
    rs.arr_total = m->u.len;
    rs.arr_got = m->announced;
  } else {
    r = MLXD_MATCH_ENTRY(mlxd_match_find(&pe->ep.mq.posted, h.tag), tcp_req, q.link);
    rs.posted = r != NULL;
    rs.posted_n = r ? r->q.m.n : 0;
  }
  mlxd_tcp_admit what = mlxd_tcp_hdr_admit(&h, &rs, why, sizeof why);
  if (what == MLXD_TCP_REJECT) {
    fail_header(t, c->peer, &h, why);
    return -1;
  }
  if (what == MLXD_TCP_CONTROL) { /* tcp_live.c: no message, no match */
    c->ctrl = true;
    c->ctrl_step = (unsigned)(h.tag & 0xFFFF);
    c->cur = NULL;
    c->cur_off = 0;
    c->cur_len = (size_t)h.len;
    c->cur_got = 0;
    c->in_payload = true;
    return 0;
  }
  if (!m) {
    /* A new message: the engine compares the calls (its receive's, or any
     * posted receive's of the same operation) and takes the receive the
     * admit check saw out of the posted queue. */
    bool clashed = false;
    if ((tcp_req*)mlxd_eng_match_posted(&t->eng, c->peer, &pe->ep.mq, h.tag, &h.sig, &clashed) !=
            r ||
        clashed)
      return -1; /* (a different receive cannot be: the same queue, the same tag) */
    m = mlxd_tcp_pool_get(&t->imsg_pool, sizeof *m);
    if (!m) {
      mlxd_status s;
      mlxd_fail_at(&s, MLXD_ENOMEM, MLXD_LAYER_TCP,
                   "out of memory receiving a message from rank %d", c->peer);
      mlxd_status_set_peer(&s, c->peer, pe->addr);
      mlxd_tcp_fail(t, &s);
      return -1;
    }
    m->u.len = (size_t)h.total;
    m->peer = c->peer;
    m->u.sig = h.sig;
    if (what == MLXD_TCP_DIRECT) {
      m->u.buf = r->q.buf;
      m->req = r;
      r->im = m;
      r->q.where = TCP_W_MSG;
    } else if (what == MLXD_TCP_MISMATCH) {
      mlxd_match_req_mismatch(&r->q.m, m->u.len);
      mlxd_tcp_completed(t);
      m->discard = true; /* drained into nothing: no allocation */
    } else {
      m->owned = true;
      m->u.buf = mlxd_buffer_alloc(m->u.len);
      if (!m->u.buf) {
        mlxd_tcp_pool_put(&t->imsg_pool, m, sizeof *m);
        mlxd_status s;
        mlxd_fail_at(&s, MLXD_ENOMEM, MLXD_LAYER_TCP,
                     "out of memory buffering a %" PRIu64 "-byte message from rank %d", h.total,
                     c->peer);
        mlxd_status_set_peer(&s, c->peer, pe->addr);
        mlxd_tcp_fail(t, &s);
        return -1;
      }
      m->charged = h.total + MLXD_TCP_UX_OVERHEAD;
      pe->ux_charged += m->charged;
      m->u.fill = m; /* a receive that takes it over is bound here (mlxd_tcp_irecv) */
      mlxd_match_push(&pe->ep.mq.unexpected, &m->u.link, h.tag);
    }
    mlxd_match_push(&pe->arriving, &m->arr, h.tag);
  }
  m->announced += (size_t)h.len; /* the admit check keeps the sum within total */
  c->cur = m;
  c->cur_off = (size_t)h.off;
  c->cur_len = (size_t)h.len;
  c->cur_got = 0;
  c->in_payload = true;
  return 0;
}

/* The current fragment of c is complete. */
static void frag_done(tcp_transport* t, tcp_conn* c) {
  if (c->ctrl) {
    c->ctrl = false;
    c->in_payload = false;
    mlxd_tcp_ctrl_done(t, c);
    return;
  }
  tcp_imsg* m = c->cur;
  tcp_peer* pe = &t->peers[c->peer];
  c->cur = NULL;
  c->in_payload = false;
  m->u.got += c->cur_len;
  if (m->u.got < m->u.len) return;
  m->u.complete = true;
  m->u.fill = NULL;
  mlxd_match_remove(&pe->arriving, &m->arr);
  if (m->req) {
    tcp_req* r = m->req;
    if (m->owned && r->q.m.n) memcpy(r->q.buf, m->u.buf, r->q.m.n);
    r->im = NULL;
    r->done = r->q.m.n;
    mlxd_tcp_req_complete(t, r);
    mlxd_tcp_imsg_free(t, m);
  } else if (m->discard) {
    mlxd_tcp_imsg_free(t, m);
  }
  /* else: an unexpected message, kept until its receive is posted */
}

static void payload_got(tcp_conn* c, size_t k) {
  c->cur_got += k;
  if (c->cur && c->cur->req) c->cur->req->done += k;
}

/* recv(MSG_DONTWAIT) on c, through TLS when it is on. */
static ssize_t conn_recv(tcp_conn* c, void* buf, size_t n) {
  if (c->ssl) return mlxd_tcp_tls_recv(c, buf, n);
  return recv(c->fd, buf, n, MSG_DONTWAIT);
}

/* Read everything available on c. 0 or an errno (-1 for EOF; EPROTO with
 * c->ssl: a TLS error, c->tls_why says why). */
int mlxd_tcp_conn_read(tcp_transport* t, tcp_conn* c) {
  for (;;) {
    if (t->eng.err.code) return 0;
    if (!c->in_payload) {
      size_t avail = c->rlen - c->rpos;
      if (avail >= TCP_HDR) {
        const unsigned char* h = c->rbuf + c->rpos;
        c->rpos += TCP_HDR;
        if (on_header(t, c, h) != 0) return 0;
        continue;
      }
      if (c->rpos > 0) {
        memmove(c->rbuf, c->rbuf + c->rpos, avail);
        c->rlen = avail;
        c->rpos = 0;
      }
      ssize_t k = conn_recv(c, c->rbuf + c->rlen, TCP_RBUF - c->rlen);
      if (k == 0) return -1;
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        return errno;
      }
      c->rlen += (size_t)k;
      continue;
    }
    size_t need = c->cur_len - c->cur_got;
    if (need == 0) {
      frag_done(t, c);
      continue;
    }
    tcp_imsg* m = c->cur;
    char* dst = c->ctrl    ? (char*)c->ctrl_buf + c->cur_got
                : m->u.buf ? m->u.buf + c->cur_off + c->cur_got
                           : NULL; /* NULL: discard */
    size_t avail = c->rlen - c->rpos;
    if (avail > 0) {
      size_t k = avail < need ? avail : need;
      if (dst) memcpy(dst, c->rbuf + c->rpos, k);
      c->rpos += k;
      payload_got(c, k);
      continue;
    }
    c->rpos = c->rlen = 0;
    ssize_t k;
    if (dst && need >= TCP_RBUF / 2) {
      k = conn_recv(c, dst, need < TCP_IO_MAX ? need : TCP_IO_MAX);
      if (k > 0) {
        payload_got(c, (size_t)k);
        continue;
      }
    } else {
      k = conn_recv(c, c->rbuf, TCP_RBUF);
      if (k > 0) {
        c->rlen = (size_t)k;
        continue;
      }
    }
    if (k == 0) return -1;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return errno;
  }
}

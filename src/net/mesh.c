/* The connection mesh (net.h): connect with retries and exponential back-off,
 * accept, and the handshake of handshake.h on every connection. The result
 * is a full mesh: nconn sockets between every pair of ranks, so send/recv
 * works between any two ranks.
 *
 * Every rank listens (bound to its own address, a bounded backlog), then runs
 * ONE non-blocking loop (poll) over everything at once until every slot is
 * filled or MLXDIST_CONNECT_TIMEOUT runs out:
 *  - outgoing: a connection c to every lower rank j: connect (retried with
 *    back-off while j is not listening yet), send the hello, read j's reply,
 *    check it (and j's proof of the secret), send the confirm; done;
 *  - incoming: every connection accepted on the listeners is a pending
 *    handshake with its own short deadline (HS_TIMEOUT_S), at most
 *    MAX_PENDING at once (the oldest is dropped to make room): read the
 *    hello, check it, answer with the reply, read the confirm; only then is
 *    the slot (rank, conn) filled.
 * A pending connection that is silent, garbage, of another job (token), of
 * another group shape, claims a rank whose slot is taken, or fails the proof
 * is closed with ONE line on stderr naming its address and why
 * ("[ring] rank R: refused a connection from A: why"; at most LOG_LINES per
 * set-up, then a count) and never ends or delays the set-up: the rightful
 * peer still gets in. Nothing waits on another rank's progress in a fixed
 * order, so no rank can block another.
 *
 * This file holds the engine's loop (mesh.h): its set-up and teardown, one
 * step over the sockets, the set-up's bound, the eager mesh (mlxd_net_mesh)
 * and the group's TCP transport, lazy or eager (mlxd_net_tcp_open). The
 * connecting side is mesh_connect.c, the accepting side mesh_accept.c, the
 * lazy dialer over the same engine dialer.c. */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "net/mesh.h"
#include "net/net.h"
#include "net/sock.h"
#include "security/secret.h"
#include "transport/tcp.h"
#include "transport/tcp_wire.h"
#include "util/bytes.h"
#include "util/clock.h"
#include "util/env.h"
#include "util/tunables.h"
#include "util/ztable.h"

/* Lazy: whether slot (j, c) is filled or an incoming handshake for it has
 * passed its hello (it will mlxd_mesh_fill it unless its proof fails). */
bool mlxd_mesh_slot_taken(const mesh* m, int j, int c) {
  if (slot_fd(m, j * m->K + c) >= 0) return true;
  for (int i = 0; m->npending > 0 && i < m->pend_hi; i++) {
    const pending* p = &m->pend[i];
    if (p->state == P_CONFIRM && (int)p->hello.rank == j && (int)p->hello.conn == c) return true;
  }
  return false;
}

/* Slot (j, c) is filled with fd. */
void mlxd_mesh_fill(mesh* m, int j, int c, int fd) {
  m->fds[j * m->K + c] = m->lazy ? fd + 1 : fd;
  m->filled++;
  if (m->lazy && m->d.ready) m->d.ready(m->d.ready_ctx, j, c, fd);
  if (m->lazy && m->filled == (m->size - 1) * m->K) /* no peer may connect any more */
    for (int k = 0; k < m->K; k++)
      if (m->lfds[k] >= 0) {
        ep_ctl(m, EPOLL_CTL_DEL, m->lfds[k], 0, 0, 0);
        close(m->lfds[k]);
        m->lfds[k] = -1;
        mlxd_net_log("rank %d: every peer is connected: listener %d closed", m->rank, k);
      }
  if (m->lazy && m->filled == (m->size - 1) * m->K) mlxd_mesh_pend_end(m);
}

/* MLXDIST_CONNECT_TIMEOUT ran out: say which peer is missing and what was seen. */
static int mesh_timeout(mesh* m, mlxd_status* st) {
  for (int i = 0; i < m->nout; i++) {
    outgoing* o = m->olist[i];
    if (o->state != O_NONE && o->state != O_DONE) return mlxd_mesh_out_timeout(m, o, st);
  }
  int missing = -1;
  for (int j = m->rank + 1; j < m->size && missing < 0; j++)
    for (int c = 0; c < m->K && linked(m, j); c++)
      if (slot_fd(m, j * m->K + c) < 0) missing = j;
  char seen[300] = "", fds[300];
  if (m->refused > 0)
    snprintf(seen, sizeof seen, " %d connection%s refused, the last from %.200s", m->refused,
             m->refused == 1 ? " was" : "s were", m->last_refused);
  mlxd_mesh_fd_text(m, fds, sizeof fds);
  mlxd_fail_at(st, MLXD_ETIMEDOUT, MLXD_LAYER_BOOTSTRAP,
               "rank %d did not connect to this rank (%d, listening on %s) within %g s "
               "(MLXDIST_CONNECT_TIMEOUT); is it running with the same %s%s?%s%s",
               missing, m->rank, m->hosts->addrs[m->rank * m->K].text, m->budget, m->what,
               m->auth.have_key ? " and secret" : "", seen, fds);
  if (missing >= 0) mlxd_status_set_peer(st, missing, NULL);
  return st->code;
}

/* The earliest timer: a retry, an attempt's or a handshake's expiry, a
 * lazy connection's give-up. */
double mlxd_mesh_next(const mesh* m) {
  double wake = INFINITY;
  for (int i = 0; m->nactive > 0 && i < m->nout; i++) {
    const outgoing* o = m->olist[i];
    if (o->state == O_NONE || o->state == O_DONE) continue;
    if (o->state == O_IDLE && o->retry_at < wake) wake = o->retry_at;
    if (o->state == O_CONNECTING && o->attempt_by < wake) wake = o->attempt_by;
    if (m->lazy && o->give_up < wake) wake = o->give_up;
  }
  for (int i = 0; m->npending > 0 && i < m->pend_hi; i++)
    if (m->pend[i].state != P_FREE && m->pend[i].deadline < wake) wake = m->pend[i].deadline;
  if (m->rest && m->rest_until < wake) wake = m->rest_until;
  return wake;
}

#define MESH_EVENTS 64

/* Start the retries that are due, wait at most timeout_ms for the sockets,
 * handle what they have, expire what ran out. */
int mlxd_mesh_step(mesh* m, int timeout_ms, mlxd_status* st) {
  double now = mlxd_now();
  mlxd_mesh_accept_resume(m, now);
  for (int i = 0; m->nactive > 0 && i < m->nout; i++) {
    outgoing* o = m->olist[i];
    if (o->state != O_IDLE || o->retry_at > now) continue;
    if (m->lazy && mlxd_mesh_slot_taken(m, o->j, o->c)) {
      mlxd_mesh_out_drop(m, o);
      continue;
    }
    if (mlxd_mesh_out_start(m, o, st) != 0) return -1;
  }
  if (timeout_ms > 0) {
    double wake = mlxd_mesh_next(m);
    if (wake != INFINITY) {
      int ms = mlxd_ms_left(wake);
      if (ms < timeout_ms) timeout_ms = ms;
    }
  }
  struct epoll_event ev[MESH_EVENTS];
  int n = epoll_wait(m->ep, ev, MESH_EVENTS, timeout_ms < 0 ? 0 : timeout_ms);
  if (n < 0 && errno != EINTR) {
    int e = errno;
    mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "waiting for connections failed");
    mlxd_status_set_sys(st, "epoll_wait", e);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    int kind = (int)(ev[i].data.u64 >> 32), idx = (int)(uint32_t)ev[i].data.u64;
    if (kind == EV_LISTEN) {
      if (m->lfds[idx] >= 0) mlxd_mesh_pend_accept(m, m->lfds[idx]);
    } else if (kind == EV_PEND) {
      pending* p = &m->pend[idx];
      if (p->state != P_FREE && p->fd >= 0) mlxd_mesh_pend_read(m, p);
    } else if (kind == EV_OUT) {
      outgoing* o = m->outs[idx];
      if (!o) continue;
      if (o->state == O_CONNECTING)
        mlxd_mesh_out_connected(m, o, false);
      else if (o->state == O_WAIT_REPLY && mlxd_mesh_out_read(m, o, st) != 0)
        return -1;
    }
  }
  now = mlxd_now();
  for (int i = 0; m->nactive > 0 && i < m->nout; i++) {
    outgoing* o = m->olist[i];
    if (o->state == O_CONNECTING && now >= o->attempt_by) mlxd_mesh_out_connected(m, o, true);
    if (m->lazy && o->state != O_NONE && o->state != O_DONE && now >= o->give_up) {
      if (mlxd_mesh_slot_taken(m, o->j, o->c)) {
        mlxd_mesh_out_drop(m, o);
        continue;
      }
      mlxd_mesh_out_timeout(m, o, st);
      return -1;
    }
  }
  mlxd_mesh_pend_expire(m, now);
  return 0;
}

void mlxd_mesh_free(mesh* m) {
  if (!m) return;
  for (int i = 0; i < m->nout; i++) {
    if (m->olist[i]->fd >= 0) close(m->olist[i]->fd);
    free(m->olist[i]);
  }
  free(m->olist);
  for (int i = 0; m->pend && i < m->pend_hi; i++)
    if (m->pend[i].state != P_FREE && m->pend[i].fd >= 0) close(m->pend[i].fd);
  if (m->ep >= 0) close(m->ep);
  if (m->lazy) {
    for (int c = 0; c < m->K; c++)
      if (m->lfds[c] >= 0) close(m->lfds[c]);
    mlxd_ztable_free(m->fds, (size_t)m->size * (size_t)m->K, sizeof *m->fds);
    mlxd_net_hosts_free(&m->own_hosts);
  }
  mlxd_net_auth_clear(&m->auth);
  mlxd_ztable_free(m->outs, (size_t)m->size * (size_t)m->K, sizeof *m->outs);
  mlxd_ztable_free(m->pend, (size_t)m->npend, sizeof *m->pend);
  free(m);
}

/* A mesh over hosts (borrowed: the caller keeps it alive while m lives) for
 * rank, listening on lfds (K of them; not owned). NULL with st set. */
mesh* mlxd_mesh_new(int rank, const mlxd_net_hosts* hosts, const int* lfds,
                    const mlxd_net_auth* auth, const mlxd_net_mesh_opts* opts, bool lazy,
                    mlxd_status* st) {
  const int size = hosts->size, K = hosts->nconn;
  mesh* m = calloc(1, sizeof *m);
  if (!m) {
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory setting up connections");
    return NULL;
  }
  m->ep = -1;
  for (int c = 0; c < 64; c++) m->lfds[c] = c < K ? lfds[c] : -1;
  long np = (long)size * K;
  if (np < MAX_PENDING) np = MAX_PENDING;
  if (np > PENDING_CAP) np = PENDING_CAP;
  double budget = mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT);
  if (!(budget > 0)) budget = 30;
  m->rank = rank;
  m->size = size;
  m->K = K;
  m->lazy = lazy;
  m->hosts = hosts;
  m->auth = *auth;
  m->budget = budget;
  m->npend = (int)np;
  m->tag = opts && opts->tag ? opts->tag : "ring";
  m->link = opts ? opts->link : NULL;
  m->what = opts && opts->what ? opts->what : "hostfile";
  m->ex = (mlxd_hs_expect){rank, size, K, m->auth.token, auth->have_key, lazy};
  m->outs = mlxd_ztable_new((size_t)size * (size_t)K, sizeof *m->outs);
  m->pend = mlxd_ztable_new((size_t)np, sizeof *m->pend); /* P_FREE is zero */
  m->ep = epoll_create1(EPOLL_CLOEXEC);
  if (!m->outs || !m->pend || m->ep < 0) {
    int e = errno;
    if (m->ep < 0 && m->outs && m->pend) {
      mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "cannot create an epoll set");
      mlxd_status_set_sys(st, "epoll_create1", e);
    } else {
      mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory setting up connections");
    }
    if (lazy) /* the caller's: not ours yet */
      for (int c = 0; c < 64; c++) m->lfds[c] = -1;
    m->lazy = false;
    mlxd_mesh_free(m);
    return NULL;
  }
  for (int c = 0; c < K; c++) {
    /* The backlog grows with the job as the pending table does (Linux takes
     * a second listen() as a new backlog): at 256 ranks, 255 peers
     * connecting at once overflowed 64 and their SYNs waited for TCP's
     * retransmission. */
    if (np > LISTEN_BACKLOG) (void)listen(lfds[c], (int)np);
    ep_ctl(m, EPOLL_CTL_ADD, lfds[c], EPOLLIN, EV_LISTEN, c);
  }
  return m;
}

int mlxd_net_mesh(int rank, const mlxd_net_hosts* hosts, const int* listen_fds,
                  const mlxd_net_auth* auth, int* fds, mlxd_status* st) {
  return mlxd_net_mesh_with(rank, hosts, listen_fds, auth, NULL, fds, st);
}

int mlxd_net_mesh_with(int rank, const mlxd_net_hosts* hosts, const int* listen_fds,
                       const mlxd_net_auth* auth, const mlxd_net_mesh_opts* opts, int* fds,
                       mlxd_status* st) {
  const int size = hosts->size, K = hosts->nconn;
  const bool* link = opts ? opts->link : NULL;
  int nlinks = 0;
  for (int j = 0; j < size; j++)
    if (j != rank && (!link || link[j])) nlinks++;
  const int total = size * K;
  for (int i = 0; i < total; i++) fds[i] = -1;
  mesh* m = mlxd_mesh_new(rank, hosts, listen_fds, auth, opts, false, st);
  if (!m) return st->code;
  const double deadline = mlxd_now() + m->budget;
  m->fds = fds;
  m->need = nlinks * K;
  int rc = 0;
  for (int j = 0; j < rank && !rc; j++)
    for (int c = 0; c < K && linked(m, j) && !rc; c++) {
      outgoing* o = mlxd_mesh_out_make(m, j, c);
      if (!o) {
        rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP,
                          "out of memory setting up connections");
        break;
      }
      o->state = O_IDLE;
      m->nactive++;
    }
  while (!rc && m->filled < m->need) {
    if (mlxd_now() >= deadline) {
      rc = mesh_timeout(m, st);
      break;
    }
    if (mlxd_mesh_step(m, mlxd_ms_left(deadline), st) != 0) {
      rc = st->code ? st->code : MLXD_ESYS;
      break;
    }
  }
  /* What is still pending is refused too: every slot is filled (or set-up failed). */
  mlxd_mesh_pend_end(m);
  if (m->refused > m->shown)
    fprintf(stderr, "[%s] rank %d: %d more refused connection%s not shown\n", m->tag, rank,
            m->refused - m->shown, m->refused - m->shown == 1 ? "" : "s");
  mlxd_mesh_free(m);
  if (rc) {
    mlxd_net_close_all(fds, total);
    return rc;
  }
  for (int i = 0; i < total; i++)
    if (fds[i] >= 0) mlxd_net_sock_nonblock(fds[i], false);
  return 0;
}

int mlxd_net_tcp_open(int rank, mlxd_net_hosts* hosts, int* lfds, const mlxd_net_auth* auth,
                      mlxd_transport** out, mlxd_status* st) {
  const int n = hosts->size, k = hosts->nconn;
  *out = NULL;
  bool lazy = mlxd_net_connect_lazy();
  if (mlxd_net_nofile(n, k, lazy, st)) return st->code;
  if (lazy) {
    struct mlxd_tcp_dialer* d = mlxd_net_dialer_take(rank, hosts, lfds, auth, st);
    if (!d) return st->code;
    *out = mlxd_tcp_transport_lazy(rank, n, k, d, st); /* owns d, also on failure */
    return *out ? 0 : st->code;
  }
  int* fds = malloc(sizeof(int) * (size_t)n * (size_t)k);
  if (!fds)
    return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory connecting %d ranks",
                        n);
  int rc = mlxd_net_mesh(rank, hosts, lfds, auth, fds, st);
  if (rc == 0) {
    *out = mlxd_tcp_transport_new(rank, n, fds, k, st); /* owns the fds, also on failure */
    if (!*out) rc = st->code ? st->code : MLXD_ESYS;
  }
  free(fds);
  return rc;
}

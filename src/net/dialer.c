/* The lazy dialer (net.h, transport/tcp.h): the TCP transport's connections
 * made on first use (MLXDIST_CONNECT=lazy), over the mesh's engine
 * (mesh.h): the transport wants a peer, steps the engine in its progress
 * rounds, and gets each slot as it is filled; a failed or closing transport
 * refuses every hello with its reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net/mesh.h"
#include "net/net.h"
#include "transport/tcp.h"
#include "transport/tcp_wire.h"
#include "util/clock.h"
#include "util/tunables.h"
#include "util/ztable.h"

/* ---- the lazy dialer (tcp.h) ---- */

static int dial_want(mlxd_tcp_dialer* d, int peer, mlxd_status* st) {
  mesh* m = (mesh*)d;
  double now = mlxd_now();
  for (int c = 0; c < m->K; c++) {
    outgoing* o = mlxd_mesh_out_make(m, peer, c);
    if (!o) {
      mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP,
                   "out of memory setting up a connection to rank %d", peer);
      mlxd_status_set_peer(st, peer, m->hosts->addrs[peer * m->K + c].text);
      return st->code;
    }
    o->wanted = true;
    if (o->state != O_NONE || mlxd_mesh_slot_taken(m, peer, c)) continue;
    mlxd_mesh_out_arm(m, o, now);
    if (mlxd_mesh_out_start(m, o, st) != 0) return st->code;
  }
  return 0;
}

static int dial_step(mlxd_tcp_dialer* d, mlxd_status* st) {
  mesh* m = (mesh*)d;
  return mlxd_mesh_step(m, 0, st) != 0 ? (st->code ? st->code : MLXD_ESYS) : 0;
}

static double dial_next(mlxd_tcp_dialer* d) { return mlxd_mesh_next((mesh*)d); }

static int dial_fd(mlxd_tcp_dialer* d) { return ((mesh*)d)->ep; }

static void dial_refuse(mlxd_tcp_dialer* d, const mlxd_status* why) {
  mesh* m = (mesh*)d;
  _Static_assert(MLXD_HS_REFUSAL_BODY_MAX >= MLXD_TCP_ABORT_MAX, "a refusal holds a record");
  if (m->refusing == MLXD_HS_REFUSE_FAILED) return; /* the failure stays the reason */
  if (why && why->code) {
    mlxd_tcp_abort_rec r;
    memset(&r, 0, sizeof r);
    r.code = why->code >= MLXD_EINVAL && why->code <= MLXD_ECALLBACK ? (uint32_t)why->code
                                                                     : (uint32_t)MLXD_EREMOTE;
    r.reporter = why->has_reporter && why->reporter >= 0 && why->reporter < m->size ? why->reporter
                                                                                    : m->rank;
    r.peer = why->has_peer && why->peer >= 0 && why->peer < m->size ? why->peer : -1;
    r.sys_errno = why->sys_errno > 0 && why->sys_errno < 4096 ? why->sys_errno : 0;
    r.syscall = why->syscall;
    snprintf(r.addr, sizeof r.addr, "%s", r.peer >= 0 ? why->peer_addr : "");
    snprintf(r.detail, sizeof r.detail, "%s", why->msg);
    m->refuse_len = mlxd_tcp_abort_encode(m->refuse_body, &r);
    m->refusing = MLXD_HS_REFUSE_FAILED;
  } else {
    m->refusing = MLXD_HS_REFUSE_CLOSING;
    m->refuse_len = 0;
  }
  /* nothing is dialed from here on */
  for (int i = 0; i < m->nout; i++) {
    outgoing* o = m->olist[i];
    o->wanted = false;
    if (o->state != O_NONE && o->state != O_DONE) mlxd_mesh_out_drop(m, o);
  }
}

static void dial_forget(mlxd_tcp_dialer* d) {
  mesh* m = (mesh*)d;
  for (int i = 0; i < m->nout; i++)
    if (m->olist[i]->fd >= 0) {
      close(m->olist[i]->fd);
      m->olist[i]->fd = -1;
    }
  for (int i = 0; i < m->pend_hi; i++)
    if (m->pend[i].state != P_FREE && m->pend[i].fd >= 0) {
      close(m->pend[i].fd);
      m->pend[i].fd = -1;
    }
  for (int c = 0; c < m->K; c++)
    if (m->lfds[c] >= 0) {
      close(m->lfds[c]);
      m->lfds[c] = -1;
    }
  if (m->ep >= 0) close(m->ep);
  m->ep = -1;
}

static void dial_free(mlxd_tcp_dialer* d) {
  mesh* m = (mesh*)d;
  mlxd_mesh_pend_end(m);
  if (m->refused > m->shown)
    fprintf(stderr, "[%s] rank %d: %d more refused connection%s not shown\n", m->tag, m->rank,
            m->refused - m->shown, m->refused - m->shown == 1 ? "" : "s");
  mlxd_mesh_free(m);
}

static const mlxd_tcp_dialer_ops dial_ops = {dial_want,   dial_step,   dial_next, dial_fd,
                                             dial_refuse, dial_forget, dial_free};

bool mlxd_net_connect_lazy(void) {
  /* MLXDIST_TLS=1 too: a connection's TLS handshake follows this file's, in the transport */
  const char* v = mlxd_tunable_str(MLXD_T_CONNECT);
  return !(v && strcmp(v, "eager") == 0);
}

mlxd_tcp_dialer* mlxd_net_dialer_take(int rank, mlxd_net_hosts* hosts, int* lfds,
                                      const mlxd_net_auth* auth, mlxd_status* st) {
  const int K = hosts->nconn, size = hosts->size;
  /* fd + 1 per slot, zero: empty (not a -1 written per slot: that is a page
   * per 1,024 slots touched at init) */
  int* fds = mlxd_ztable_new((size_t)size * (size_t)K, sizeof *fds);
  mesh* m = NULL;
  if (fds) m = mlxd_mesh_new(rank, hosts, lfds, auth, NULL, true, st);
  if (!m) {
    if (!fds)
      mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory setting up connections");
    mlxd_ztable_free(fds, (size_t)size * (size_t)K, sizeof *fds);
    return NULL; /* lfds and hosts stay the caller's */
  }
  /* the address book is taken over, not copied (a copy writes every entry) */
  m->own_hosts = *hosts;
  *hosts = (mlxd_net_hosts){0, 0, NULL};
  m->hosts = &m->own_hosts;
  m->fds = fds;
  for (int c = 0; c < K; c++) lfds[c] = -1; /* ours now */
  m->d.ops = &dial_ops;
  return &m->d;
}

mlxd_tcp_dialer* mlxd_net_dialer_new(int rank, const mlxd_net_hosts* hosts, int* lfds,
                                     const mlxd_net_auth* auth, mlxd_status* st) {
  size_t n = (size_t)hosts->size * (size_t)hosts->nconn;
  mlxd_net_hosts own = {hosts->size, hosts->nconn, malloc(sizeof(mlxd_net_addr) * (n ? n : 1))};
  if (!own.addrs) {
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory setting up connections");
    return NULL;
  }
  memcpy(own.addrs, hosts->addrs, sizeof(mlxd_net_addr) * n);
  mlxd_tcp_dialer* d = mlxd_net_dialer_take(rank, &own, lfds, auth, st);
  mlxd_net_hosts_free(&own); /* empty when taken */
  return d;
}

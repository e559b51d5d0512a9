/* The mesh's connecting side (mesh.h): this rank's connection c to rank j,
 * from connect() (retried with back-off while j is not listening yet) to
 * the hello, j's reply or refusal, and the confirm that fills the slot;
 * and what a connection that ran out of MLXDIST_CONNECT_TIMEOUT saw. */
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

/* The outgoing connection for slot (j, c), made on first use (NULL: out of memory). */
outgoing* mlxd_mesh_out_make(mesh* m, int j, int c) {
  int slot = j * m->K + c;
  if (m->outs[slot]) return m->outs[slot];
  if (m->nout == m->olist_cap) {
    int cap = m->olist_cap ? 2 * m->olist_cap : 16;
    outgoing** l = realloc(m->olist, sizeof *l * (size_t)cap);
    if (!l) return NULL;
    m->olist = l;
    m->olist_cap = cap;
  }
  outgoing* o = calloc(1, sizeof *o);
  if (!o) return NULL;
  *o = (outgoing){
      .j = j, .c = c, .fd = -1, .state = O_NONE, .backoff = 0.01, .attempt_s = CONNECT_FIRST_S};
  m->olist[m->nout++] = o;
  m->outs[slot] = o;
  return o;
}

/* Arm outgoing connection o for a first attempt now (a lazy dial, or a
 * dial again), within MLXDIST_CONNECT_TIMEOUT of the first want. */
void mlxd_mesh_out_arm(mesh* m, outgoing* o, double now) {
  o->state = O_IDLE;
  /* The bound counts from the first want, also for a dial again: a peer
   * that keeps failing its handshakes cannot stretch it. */
  if (o->first_want <= 0) o->first_want = now;
  o->give_up = o->first_want + m->budget;
  o->retry_at = now;
  o->backoff = 0.01;
  o->attempt_s = CONNECT_FIRST_S;
  m->nactive++;
}

static bool transient_errno(int e) {
  return e == ECONNREFUSED || e == ETIMEDOUT || e == ENETUNREACH || e == EHOSTUNREACH ||
         e == ECONNRESET || e == EADDRNOTAVAIL || e == EAGAIN || e == EINTR || e == EPIPE ||
         e == ECONNABORTED;
}

static void out_close(mesh* m, outgoing* o) {
  if (o->fd >= 0) {
    ep_ctl(m, EPOLL_CTL_DEL, o->fd, 0, 0, 0);
    close(o->fd);
  }
  o->fd = -1;
}

/* Lazy: this outgoing connection is no longer needed (the slot is filled or
 * being accepted from the peer, or nothing is dialed any more). */
void mlxd_mesh_out_drop(mesh* m, outgoing* o) {
  out_close(m, o);
  if (m->lazy) mlxd_mesh_pend_release(m, o->j, o->c);
  if (o->state != O_NONE && o->state != O_DONE) m->nactive--;
  o->state = O_NONE;
  o->got = 0;
}

void mlxd_mesh_out_retry(mesh* m, outgoing* o, int err) {
  out_close(m, o);
  if (m->lazy) mlxd_mesh_pend_release(m, o->j, o->c); /* answered: the slot is being accepted */
  o->got = 0;
  o->last_errno = err;
  if (err == ECONNREFUSED) o->refused++;
  if (m->lazy && mlxd_mesh_slot_taken(m, o->j, o->c)) {
    mlxd_mesh_out_drop(m, o);
    return;
  }
  o->state = O_IDLE;
  o->retry_at = mlxd_now() + o->backoff;
  o->backoff = o->backoff * 2 > 0.5 ? 0.5 : o->backoff * 2;
}

/* The connection is up: send the hello. */
static void out_send_hello(mesh* m, outgoing* o) {
  mlxd_net_sock_nodelay(o->fd);
  mlxd_hs_msg h;
  memset(&h, 0, sizeof h);
  h.rank = (uint32_t)m->rank;
  h.size = (uint32_t)m->size;
  h.conn = (uint32_t)o->c;
  h.nconn = (uint32_t)m->K;
  h.flags = m->auth.have_key ? MLXD_HS_FLAG_SECRET : 0;
  memcpy(h.token, m->auth.token, MLXD_HS_TOKEN_BYTES);
  mlxd_status ignore = {0};
  if (mlxd_random_bytes(o->nonce, sizeof o->nonce, &ignore) != 0) {
    mlxd_mesh_out_retry(m, o, EAGAIN);
    return;
  }
  memcpy(h.nonce, o->nonce, sizeof o->nonce);
  unsigned char buf[MLXD_HS_HELLO_BYTES];
  mlxd_hs_encode_hello(buf, &h);
  /* A fresh socket's send buffer takes it whole; anything else is a failed attempt. */
  ssize_t k = send(o->fd, buf, sizeof buf, MSG_NOSIGNAL);
  if (k != (ssize_t)sizeof buf) {
    mlxd_mesh_out_retry(m, o, k < 0 ? errno : EPIPE);
    return;
  }
  o->state = O_WAIT_REPLY;
  o->got = 0;
  o->want = MLXD_HS_REPLY_BYTES; /* a refusal's head says how much more (mlxd_mesh_out_read) */
  ep_ctl(m, EPOLL_CTL_MOD, o->fd, EPOLLIN, EV_OUT, o->j * m->K + o->c);
}

/* Start a connect() attempt (O_IDLE -> O_CONNECTING or straight on); a
 * non-transient failure is fatal (st set, -1). */
int mlxd_mesh_out_start(mesh* m, outgoing* o, mlxd_status* st) {
  const mlxd_net_addr* a = &m->hosts->addrs[o->j * m->K + o->c];
  o->attempts++;
  int fd = socket(a->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0 && mlxd_net_short_of_fds(errno)) { /* a flood's idle connections may hold them */
    int e = errno;
    mlxd_mesh_fd_short(m, e, "socket");
    if (mlxd_mesh_pend_shed(m))
      fd = socket(a->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    else
      errno = e;
  }
  if (fd < 0) {
    int e = errno;
    char lim[96] = "";
    if (e == EMFILE || e == ENFILE) mlxd_net_nofile_text(lim, sizeof lim);
    mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP,
                 "cannot create a socket to connect to rank %d%s%s%s", o->j, lim[0] ? " (" : "",
                 lim, lim[0] ? "; raise it with ulimit -n)" : "");
    mlxd_status_set_peer(st, o->j, a->text);
    mlxd_status_set_sys(st, "socket", e);
    return -1;
  }
  mlxd_net_sock_buffers(fd);
  /* The ephemeral port this socket gets may be one a rank of this job that
   * starts later is told to listen on (a hostfile's ports): with SO_REUSEADDR
   * on both, its bind still succeeds (no listener holds the port). At 256
   * ranks on one host, the lazy mesh's connects took such a port. */
  int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  o->fd = fd;
  ep_ctl(m, EPOLL_CTL_ADD, fd, EPOLLOUT, EV_OUT, o->j * m->K + o->c);
  if (connect(fd, (const struct sockaddr*)&a->sa, a->len) == 0) {
    out_send_hello(m, o);
    return 0;
  }
  int e = errno;
  if (e == EINPROGRESS) {
    o->state = O_CONNECTING;
    o->attempt_by = mlxd_now() + o->attempt_s;
    return 0;
  }
  if (transient_errno(e)) {
    mlxd_mesh_out_retry(m, o, e);
    return 0;
  }
  out_close(m, o);
  mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "cannot connect to rank %d", o->j);
  mlxd_status_set_peer(st, o->j, a->text);
  mlxd_status_set_sys(st, "connect", e);
  return -1;
}

/* O_CONNECTING and the socket is writable (or the attempt is over). */
void mlxd_mesh_out_connected(mesh* m, outgoing* o, bool expired) {
  int err = 0;
  socklen_t el = sizeof err;
  struct sockaddr_storage sa;
  socklen_t sl = sizeof sa;
  /* Connected, its event not seen yet (more were ready than one epoll_wait returns)? */
  if (expired && getpeername(o->fd, (struct sockaddr*)&sa, &sl) == 0) expired = false;
  if (expired) {
    err = ETIMEDOUT;
    o->attempt_s = o->attempt_s * 2 > CONNECT_ATTEMPT_S ? CONNECT_ATTEMPT_S : o->attempt_s * 2;
  } else if (getsockopt(o->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
    err = errno;
  if (err) {
    mlxd_mesh_out_retry(m, o, err);
    return;
  }
  out_send_hello(m, o);
}

/* The reply is complete: check it and j's proof, send the confirm. */
static int out_finish(mesh* m, outgoing* o, mlxd_status* st) {
  const char* at = m->hosts->addrs[o->j * m->K + o->c].text;
  mlxd_hs_msg r;
  mlxd_hs_err e = mlxd_hs_check_reply(o->in, o->got, &m->ex, o->j, o->c, &r);
  const unsigned char* key = m->auth.have_key ? m->auth.key : NULL;
  unsigned char mac[MLXD_HS_MAC_BYTES];
  /* Lazy: the confirm commits the peer to this connection, so it is not sent
   * for a slot this rank filled meanwhile, nor while a hello from a higher
   * peer for it is past its reply (the higher rank's connection is kept); the
   * peer sees this one closed before its confirm and refuses it. */
  if (e == MLXD_HS_OK && m->lazy && mlxd_mesh_slot_taken(m, o->j, o->c) &&
      (slot_fd(m, o->j * m->K + o->c) >= 0 || m->rank < o->j)) {
    mlxd_net_log(
        "rank %d: connection %d to rank %d answered, but the slot is taken: closed "
        "without a confirm",
        m->rank, o->c, o->j);
    mlxd_mesh_out_drop(m, o);
    return 0;
  }
  if (e == MLXD_HS_OK) {
    if (mlxd_hs_mac(key, false, m->auth.token, m->size, m->K, o->c, m->rank, o->j, o->nonce,
                    r.nonce, mac) != 0)
      return mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "libcrypto failed (HMAC)");
    if (key && !mlxd_hs_mac_equal(mac, r.mac)) e = MLXD_HS_MAC_E;
  }
  /* The confirm carries this rank's proof; sent even when j's proof failed, so
   * that j logs the mismatch too. */
  if (e == MLXD_HS_OK || e == MLXD_HS_MAC_E) {
    unsigned char cbuf[MLXD_HS_CONFIRM_BYTES];
    if (mlxd_hs_mac(key, true, m->auth.token, m->size, m->K, o->c, m->rank, o->j, o->nonce, r.nonce,
                    mac) != 0)
      return mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "libcrypto failed (HMAC)");
    mlxd_hs_encode_confirm(cbuf, mac);
    ssize_t k = send(o->fd, cbuf, sizeof cbuf, MSG_NOSIGNAL);
    if (e == MLXD_HS_OK && k != (ssize_t)sizeof cbuf) {
      mlxd_mesh_out_retry(m, o, k < 0 ? errno : EPIPE);
      return 0;
    }
  }
  if (e == MLXD_HS_MAC_E)
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                 "the shared secret did not match: rank %d's proof does not match this rank's "
                 "MLXDIST_SECRET_FILE (every rank needs a file with the same secret)",
                 o->j);
  else if (e == MLXD_HS_NO_SECRET)
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                 "the shared secret did not match: rank %d uses no secret but this rank has "
                 "MLXDIST_SECRET_FILE (every rank needs the same secret)",
                 o->j);
  else if (e == MLXD_HS_SECRET)
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                 "the shared secret did not match: rank %d requires a shared secret but this "
                 "rank has none (set MLXDIST_SECRET_FILE on every rank)",
                 o->j);
  else if (e != MLXD_HS_OK)
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                 "the process listening at rank %d's address is not rank %d of this job (%s); "
                 "check the %s",
                 o->j, o->j, mlxd_hs_reason(e), m->what);
  if (e != MLXD_HS_OK) {
    mlxd_status_set_peer(st, o->j, at);
    return -1;
  }
  ep_ctl(m, EPOLL_CTL_DEL, o->fd, 0, 0, 0);
  o->state = O_DONE;
  m->nactive--;
  int fd = o->fd;
  o->fd = -1;
  /* Lazy, this rank the higher: a lower peer's hello for the slot that got
   * its reply loses to this connection; closed before its confirm counts.
   * This rank the lower: a deferred hello of the higher peer loses too (the
   * peer answered this one, so it dropped its own). */
  for (int i = 0; m->lazy && m->npending > 0 && i < m->pend_hi; i++) {
    pending* p = &m->pend[i];
    if ((p->state == P_CONFIRM || p->state == P_DEFER) && (int)p->hello.rank == o->j &&
        (int)p->hello.conn == o->c)
      mlxd_mesh_pend_yield(m, p, "this rank's own connection for the slot completed first");
  }
  mlxd_net_log("rank %d: connection %d to rank %d at %s ready", m->rank, o->c, o->j, at);
  mlxd_mesh_fill(m, o->j, o->c, fd);
  return 0;
}

/* A refusal is complete (or malformed): check it and its proof; the
 * transport fails with the acceptor's reason (always -1, st set). */
static int out_refused(mesh* m, outgoing* o, mlxd_status* st) {
  const char* at = m->hosts->addrs[o->j * m->K + o->c].text;
  mlxd_hs_msg r;
  unsigned kind = 0;
  const unsigned char* body = NULL;
  size_t blen = 0;
  mlxd_hs_err e =
      mlxd_hs_check_refusal(o->in, o->got, &m->ex, o->j, o->c, &r, NULL, &kind, &body, &blen);
  const unsigned char* key = m->auth.have_key ? m->auth.key : NULL;
  if (e == MLXD_HS_OK) {
    unsigned char mac[MLXD_HS_MAC_BYTES];
    if (mlxd_hs_mac_refusal(key, m->auth.token, m->size, m->K, o->c, m->rank, o->j, o->nonce,
                            r.nonce, o->in + MLXD_HS_REPLY_BYTES, 4 + blen, mac) != 0) {
      mlxd_mesh_out_drop(m, o);
      mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "libcrypto failed (HMAC)");
      return -1;
    }
    if (key && !mlxd_hs_mac_equal(mac, r.mac)) e = MLXD_HS_MAC_E;
  }
  mlxd_tcp_abort_rec rec;
  char why[200] = "";
  /* the record names the rank that found the failure first: any rank of the group */
  if (e == MLXD_HS_OK && kind == MLXD_HS_REFUSE_FAILED)
    (void)mlxd_tcp_abort_decode(body, blen, m->size, &rec, why, sizeof why);
  if (e != MLXD_HS_OK || why[0]) {
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                 "the process listening at rank %d's address is not rank %d of this job (a "
                 "refusal: %s); check the %s",
                 o->j, o->j, why[0] ? why : mlxd_hs_reason(e), m->what);
    mlxd_status_set_peer(st, o->j, at);
  } else if (kind == MLXD_HS_REFUSE_CLOSING) {
    mlxd_fail_at(st, MLXD_EREMOTE, MLXD_LAYER_BOOTSTRAP,
                 "rank %d turned this rank's connection down: it is shutting down (its group is "
                 "being destroyed or its process is exiting); did every rank run the same "
                 "operations?",
                 o->j);
    mlxd_status_set_peer(st, o->j, at);
  } else {
    mlxd_fail_at(st, (int)rec.code, MLXD_LAYER_BOOTSTRAP,
                 "rank %d turned this rank's connection down: its group failed: %s", o->j,
                 rec.detail[0] ? rec.detail : "no reason given");
    if (rec.peer >= 0)
      mlxd_status_set_peer(st, rec.peer, rec.addr);
    else
      mlxd_status_set_peer(st, o->j, at);
    if (rec.syscall || rec.sys_errno) mlxd_status_set_sys(st, rec.syscall, rec.sys_errno);
    mlxd_status_set_reporter(st, rec.reporter);
  }
  mlxd_mesh_out_drop(m, o);
  return -1;
}

/* O_WAIT_REPLY and readable. */
int mlxd_mesh_out_read(mesh* m, outgoing* o, mlxd_status* st) {
  ssize_t k = recv(o->fd, o->in + o->got, o->want - o->got, 0);
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  if (k <= 0) {
    /* Closed before the reply: j refused the hello (another job on that port?
     * lazy: j keeps its own connection for this slot) or was not ready; try
     * again until the deadline. */
    o->closed++;
    mlxd_mesh_out_retry(m, o, k == 0 ? ECONNRESET : errno);
    return 0;
  }
  o->got += (size_t)k;
  if (mlxd_hs_is_refusal(o->in, o->got)) {
    /* its head says how long it is (bounded: MLXD_HS_REFUSAL_MAX) */
    size_t need = 0;
    mlxd_hs_msg r;
    mlxd_hs_err e =
        mlxd_hs_check_refusal(o->in, o->got, &m->ex, o->j, o->c, &r, &need, NULL, NULL, NULL);
    if (e == MLXD_HS_SHORT && need > o->got && need <= sizeof o->in) {
      o->want = need;
      return 0;
    }
    return out_refused(m, o, st);
  }
  /* garbage is known as soon as the magic is */
  if (o->got >= 4 && o->got < o->want) {
    mlxd_hs_msg r;
    if (mlxd_hs_check_reply(o->in, o->got, &m->ex, o->j, o->c, &r) == MLXD_HS_MAGIC)
      return out_finish(m, o, st);
  }
  return o->got == o->want ? out_finish(m, o, st) : 0;
}

/* Outgoing connection o ran out of MLXDIST_CONNECT_TIMEOUT: say what was seen. */
int mlxd_mesh_out_timeout(mesh* m, outgoing* o, mlxd_status* st) {
  const char* at = m->hosts->addrs[o->j * m->K + o->c].text;
  char fds[300];
  mlxd_mesh_fd_text(m, fds, sizeof fds);
  if (o->closed > 0)
    mlxd_fail_at(st, MLXD_ETIMEDOUT, MLXD_LAYER_BOOTSTRAP,
                 "rank %d closed this rank's handshake %d time%s within %g s "
                 "(MLXDIST_CONNECT_TIMEOUT): the process listening at its address refused it "
                 "(another job on that port, or a different MLXDIST_JOB_TOKEN?)%s",
                 o->j, o->closed, o->closed == 1 ? "" : "s", m->budget, fds);
  else if (o->state == O_WAIT_REPLY)
    mlxd_fail_at(st, MLXD_ETIMEDOUT, MLXD_LAYER_BOOTSTRAP,
                 "no handshake answer from rank %d within %g s (MLXDIST_CONNECT_TIMEOUT)%s", o->j,
                 m->budget, fds);
  else {
    /* Both sides dial a lazy peer: the reason a peer gave up on this
     * rank is often in what this rank refused from it. */
    char seen[300] = "";
    if (m->refused > 0)
      snprintf(seen, sizeof seen, "; %d connection%s refused here, the last from %.200s",
               m->refused, m->refused == 1 ? " was" : "s were", m->last_refused);
    /* ECONNREFUSED: nothing listened there (yet); a launcher may start a
     * rank tens of seconds after the first at 1,024 ranks on few cores */
    char refused[200] = "";
    if (o->refused > 0)
      snprintf(refused, sizeof refused,
               ", %d of them refused (nothing listened at %.80s: has rank %d started?)", o->refused,
               at, o->j);
    mlxd_fail_at(st, MLXD_ETIMEDOUT, MLXD_LAYER_BOOTSTRAP,
                 "cannot connect to rank %d within %g s%s (MLXDIST_CONNECT_TIMEOUT) after %d "
                 "attempt%s%s%s%s",
                 o->j, m->budget, m->lazy ? " of first needing it" : "", o->attempts,
                 o->attempts == 1 ? "" : "s", refused, seen, fds);
  }
  mlxd_status_set_peer(st, o->j, at);
  if (o->state != O_WAIT_REPLY && o->last_errno) mlxd_status_set_sys(st, "connect", o->last_errno);
  return st->code;
}

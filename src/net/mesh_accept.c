/* The mesh's accepting side (mesh.h): connections accepted on the listeners,
 * each a pending handshake with its own short deadline: the hello read and
 * checked, the reply (or a refusal) sent, the confirm read; only then is the
 * slot (rank, conn) filled. A stranger is refused with one line on stderr;
 * short of descriptors, the oldest silent connection makes room. */
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

static void pend_close(mesh* m, pending* p) {
  if (p->fd >= 0) {
    ep_ctl(m, EPOLL_CTL_DEL, p->fd, 0, 0, 0);
    close(p->fd);
  }
  p->fd = -1;
  bool confirming = p->state == P_CONFIRM;
  p->state = P_FREE;
  m->npending--;
  if (!m->lazy || !confirming) return;
  /* Lazy: this rank's own attempt for the slot may have stood down for this
   * handshake; if the transport wants the peer and nothing else fills the
   * slot, connect again (within the first want's MLXDIST_CONNECT_TIMEOUT). */
  int j = (int)p->hello.rank, c = (int)p->hello.conn;
  outgoing* o = m->outs[j * m->K + c]; /* NULL: never wanted */
  if (m->refusing || !o || !o->wanted || o->state != O_NONE || mlxd_mesh_slot_taken(m, j, c))
    return;
  mlxd_net_log("rank %d: rank %d's connection %d failed in its handshake: connecting again",
               m->rank, j, c);
  double now = mlxd_now();
  mlxd_mesh_out_arm(m, o, now);
}

/* One line on stderr for a refused incoming connection (always, not only
 * with MLX_RING_VERBOSE; at most LOG_LINES per set-up), then close it. */
static void refuse(mesh* m, pending* p, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void refuse(mesh* m, pending* p, const char* fmt, ...) {
  char why[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  m->refused++;
  snprintf(m->last_refused, sizeof m->last_refused, "%s: %s", p->addr, why);
  if (m->shown < LOG_LINES) {
    m->shown++;
    fprintf(stderr, "[%s] rank %d: refused a connection from %s: %s\n", m->tag, m->rank, p->addr,
            why);
  } else if (m->refused == LOG_LINES + 1) {
    fprintf(stderr, "[%s] rank %d: further refused connections are counted, not shown\n", m->tag,
            m->rank);
  }
  pend_close(m, p);
}

/* The set-up ended (lazy: every peer is connected, or the group is
 * destroyed): what is still pending is refused, as at the end of an eager
 * mesh. */
void mlxd_mesh_pend_end(mesh* m) {
  for (int i = 0; m->npending > 0 && i < m->pend_hi; i++)
    if (m->pend[i].state != P_FREE)
      refuse(m, &m->pend[i], "%s when the set-up ended",
             m->pend[i].got == 0 && m->pend[i].state == P_HELLO ? "it had sent nothing"
                                                                : "its handshake was incomplete");
}

/* accept() or socket() ran short of descriptors or kernel buffers: said
 * once per engine (a flood of idle connections must not mlxd_mesh_fill stderr). */
void mlxd_mesh_fd_short(mesh* m, int e, const char* call) {
  bool first = m->fd_errno == 0;
  m->fd_errno = e;
  if (!first) return;
  char lim[96];
  mlxd_net_nofile_text(lim, sizeof lim);
  fprintf(stderr,
          "[%s] rank %d: %s failed: %s (%s); connections that have sent no hello are closed "
          "to make room, oldest first, and accepting pauses while there are none (said once)\n",
          m->tag, m->rank, call, strerror(e), lim);
}

/* Close the oldest pending connection that has not sent a whole hello (an
 * honest peer sends it at once; one that did keeps its place), counted as
 * refused, not logged line by line. Whether there was one. */
bool mlxd_mesh_pend_shed(mesh* m) {
  pending* oldest = NULL;
  for (int i = 0; m->npending > 0 && i < m->pend_hi; i++) {
    pending* q = &m->pend[i];
    if (q->state == P_HELLO && (!oldest || q->since < oldest->since)) oldest = q;
  }
  if (!oldest) return false;
  m->fd_shed++;
  m->refused++;
  snprintf(m->last_refused, sizeof m->last_refused,
           "%s: closed without a hello to make room (out of descriptors)", oldest->addr);
  pend_close(m, oldest);
  return true;
}

/* Nothing to shed: the listeners leave the epoll set for a while (a
 * level-triggered listener with a backlog would wake every step), the
 * pause doubling up to ACCEPT_REST_MAX_S while it lasts. */
static void accept_rest(mesh* m) {
  m->rest_s = m->rest_s > 0 ? 2 * m->rest_s : ACCEPT_REST_S;
  if (m->rest_s > ACCEPT_REST_MAX_S) m->rest_s = ACCEPT_REST_MAX_S;
  m->rest_until = mlxd_now() + m->rest_s;
  if (m->rest) return;
  m->rest = true;
  for (int c = 0; c < m->K; c++)
    if (m->lfds[c] >= 0) ep_ctl(m, EPOLL_CTL_MOD, m->lfds[c], 0, EV_LISTEN, c);
}

void mlxd_mesh_accept_resume(mesh* m, double now) {
  if (!m->rest || now < m->rest_until) return;
  m->rest = false;
  for (int c = 0; c < m->K; c++)
    if (m->lfds[c] >= 0) ep_ctl(m, EPOLL_CTL_MOD, m->lfds[c], EPOLLIN, EV_LISTEN, c);
}

/* What was short, for the messages of a connect bound that ran out. */
void mlxd_mesh_fd_text(const mesh* m, char* buf, size_t n) {
  buf[0] = '\0';
  if (!m->fd_errno) return;
  char lim[96];
  mlxd_net_nofile_text(lim, sizeof lim);
  snprintf(buf, n,
           "; this rank ran short of descriptors or buffers (%s; %s), %d connection%s without a "
           "hello closed to make room",
           strerror(m->fd_errno), lim, m->fd_shed, m->fd_shed == 1 ? "" : "s");
}

/* ---- incoming ---- */

void mlxd_mesh_pend_accept(mesh* m, int lfd) {
  for (int round = 0; round < 4 * MAX_PENDING; round++) {
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(lfd, (struct sockaddr*)&sa, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      /* Short of descriptors or buffers: never fatal (the listeners stay
       * open for the group's life, and anyone who reaches them can hold
       * idle connections). Make room at a silent connection's expense and
       * accept again, or pause accepting for a while. */
      if (mlxd_net_short_of_fds(errno)) {
        mlxd_mesh_fd_short(m, errno, "accept");
        if (mlxd_mesh_pend_shed(m)) continue;
        accept_rest(m);
      }
      return; /* EAGAIN: all taken; anything else: try again next round */
    }
    m->rest_s = 0;
    /* A free entry, else the oldest that has not sent a well-formed hello
     * (a rightful peer sends it right after connecting; one that did has
     * shown this job's token and keeps its place: a busy honest peer is not
     * dropped for strangers). All well-formed: the newcomer waits in the
     * backlog's stead (closed; an honest connector retries). */
    pending* p = NULL;
    pending* oldest = NULL;
    for (int i = 0; i < m->npend && !p; i++) { /* stops at the first free: pend_hi at most */
      pending* q = &m->pend[i];
      if (q->state == P_FREE)
        p = q;
      else if (q->state == P_HELLO && (!oldest || q->since < oldest->since))
        oldest = q;
    }
    if (!p && !oldest) {
      close(fd);
      m->refused++;
      continue;
    }
    if (!p) {
      refuse(m, oldest,
             "too many connections waiting for a handshake (%d); the oldest without a hello is "
             "dropped",
             m->npend);
      p = oldest;
    }
    mlxd_net_sock_nodelay(fd);
    if ((int)(p - m->pend) >= m->pend_hi) m->pend_hi = (int)(p - m->pend) + 1;
    memset(p, 0, sizeof *p);
    p->fd = fd;
    p->state = P_HELLO;
    p->since = mlxd_now();
    p->deadline = p->since + HS_TIMEOUT_S;
    m->npending++;
    mlxd_net_format_addr((struct sockaddr*)&sa, p->addr, sizeof p->addr);
    ep_ctl(m, EPOLL_CTL_ADD, fd, EPOLLIN, EV_PEND, (int)(p - m->pend));
    mlxd_mesh_pend_read(m, p); /* the hello is usually there already: a flood cannot push it out */
  }
}

/* Lazy: close a hello with this job's token without a word (a simultaneous
 * connect this rank's own connection wins, or a slot filled meanwhile). */
void mlxd_mesh_pend_yield(mesh* m, pending* p, const char* why) {
  mlxd_net_log("rank %d: closed rank %u's connection %u from %s: %s", m->rank,
               (unsigned)p->hello.rank, (unsigned)p->hello.conn, p->addr, why);
  pend_close(m, p);
}

/* The reply's fields for hello h (this rank's, a fresh nonce). 0 or -1. */
static int reply_fields(const mesh* m, const mlxd_hs_msg* h, mlxd_hs_msg* r) {
  memset(r, 0, sizeof *r);
  r->rank = (uint32_t)m->rank;
  r->size = (uint32_t)m->size;
  r->conn = h->conn;
  r->nconn = (uint32_t)m->K;
  r->flags = m->auth.have_key ? MLXD_HS_FLAG_SECRET : 0;
  memcpy(r->token, m->auth.token, MLXD_HS_TOKEN_BYTES);
  mlxd_status ignore = {0};
  return mlxd_random_bytes(r->nonce, sizeof r->nonce, &ignore) != 0 ? -1 : 0;
}

/* Refusing (the transport failed or is being destroyed): answer a hello
 * that passed its checks with the reason, proven with the secret, and close. */
static void pend_refuse(mesh* m, pending* p) {
  const mlxd_hs_msg* h = &p->hello;
  mlxd_hs_msg r;
  unsigned char buf[MLXD_HS_REFUSAL_MAX];
  if (reply_fields(m, h, &r) != 0) {
    refuse(m, p, "no random bytes for the handshake (libcrypto)");
    return;
  }
  size_t n = mlxd_hs_encode_refusal(buf, &r, m->refusing, m->refuse_body, m->refuse_len);
  const unsigned char* key = m->auth.have_key ? m->auth.key : NULL;
  if (mlxd_hs_mac_refusal(key, m->auth.token, m->size, m->K, (int)h->conn, (int)h->rank, m->rank,
                          h->nonce, r.nonce, buf + MLXD_HS_REPLY_BYTES, n - MLXD_HS_REPLY_BYTES,
                          buf + 72) != 0) {
    refuse(m, p, "libcrypto failed (HMAC)");
    return;
  }
  /* a fresh socket's send buffer takes it whole; the hello was read whole,
   * so the close that follows is a FIN, not a reset */
  ssize_t k = send(p->fd, buf, n, MSG_NOSIGNAL);
  m->refusals++;
  mlxd_net_log("rank %d: turned down rank %u's connection %u from %s (%s)%s", m->rank,
               (unsigned)h->rank, (unsigned)h->conn, p->addr,
               m->refusing == MLXD_HS_REFUSE_FAILED ? "its group failed" : "shutting down",
               k == (ssize_t)n ? "" : ": the refusal could not be sent");
  pend_close(m, p);
}

static int pend_answer(mesh* m, pending* p, mlxd_hs_err e);

/* The hello is complete: check it, answer (or defer the answer), wait for
 * the confirm. */
static int pend_hello(mesh* m, pending* p) {
  mlxd_hs_msg* h = &p->hello;
  mlxd_hs_err e = mlxd_hs_check_hello(p->in, p->got, &m->ex, h);
  if (e != MLXD_HS_OK && e != MLXD_HS_NO_SECRET && e != MLXD_HS_SECRET) {
    if (e == MLXD_HS_SIZE)
      refuse(m, p, "%s (it says %u ranks with %u connections each, this group has %d with %d)",
             mlxd_hs_reason(e), (unsigned)h->size, (unsigned)h->nconn, m->size, m->K);
    else if (e == MLXD_HS_RANK || e == MLXD_HS_CONN)
      refuse(m, p, "%s (it claims rank %u, connection %u)", mlxd_hs_reason(e), (unsigned)h->rank,
             (unsigned)h->conn);
    else
      refuse(m, p, "%s", mlxd_hs_reason(e));
    return 0;
  }
  /* mlxd_hs_check_hello range-checks rank and connection only on its way
   * to MLXD_HS_OK: a secret mismatch returns before, and h->rank indexes
   * below (linked, the slot). */
  if (h->rank >= (uint32_t)m->size || (int)h->rank == m->rank || h->conn >= (uint32_t)m->K) {
    refuse(m, p, "%s (it claims rank %u, connection %u)", mlxd_hs_reason(MLXD_HS_RANK),
           (unsigned)h->rank, (unsigned)h->conn);
    return 0;
  }
  if (!linked(m, (int)h->rank)) {
    refuse(m, p, "rank %u has no connection with this rank in this group", (unsigned)h->rank);
    return 0;
  }
  if (e == MLXD_HS_OK && m->refusing) {
    pend_refuse(m, p);
    return 0;
  }
  int slot = (int)h->rank * m->K + (int)h->conn;
  if (e == MLXD_HS_OK && m->lazy) {
    const outgoing* o = m->outs[slot]; /* NULL: this rank never dialed it */
    int ostate = o ? o->state : O_NONE;
    if (slot_fd(m, slot) >= 0 || ostate == O_DONE) {
      mlxd_mesh_pend_yield(m, p, "the slot is filled already");
      return 0;
    }
    if (ostate != O_NONE && m->rank > (int)h->rank) {
      mlxd_mesh_pend_yield(m, p, "both connected at once; the higher rank's connection is kept");
      return 0;
    }
    if ((ostate == O_CONNECTING || ostate == O_WAIT_REPLY) && m->rank < (int)h->rank) {
      /* This rank's own connection is open: the peer answers or closes it
       * first (the file's head, "An abandoned dial"). The proof is asked
       * for after the reply, so this hello holds the budget a busy honest
       * peer's gets (its token was shown). */
      p->state = P_DEFER;
      p->deadline = mlxd_now() + (m->budget > HS_TIMEOUT_S ? m->budget : HS_TIMEOUT_S);
      mlxd_net_log(
          "rank %d: rank %u's connection %u from %s waits for this rank's own for the "
          "slot to be over",
          m->rank, (unsigned)h->rank, (unsigned)h->conn, p->addr);
      return 0;
    }
  }
  return pend_answer(m, p, e);
}

/* Answer hello p->hello (checked; e: MLXD_HS_OK, or a secret mismatch that is
 * answered so that the peer can name it too, then refused): the reply, then
 * wait for the confirm. Always 0. */
static int pend_answer(mesh* m, pending* p, mlxd_hs_err e) {
  const mlxd_hs_msg* h = &p->hello;
  int slot = (int)h->rank * m->K + (int)h->conn;
  if (e == MLXD_HS_OK && slot_fd(m, slot) >= 0) {
    refuse(m, p, "rank %u's connection %u is already established (a duplicate or an impostor)",
           (unsigned)h->rank, (unsigned)h->conn);
    return 0;
  }
  mlxd_hs_msg r;
  memset(&r, 0, sizeof r);
  r.rank = (uint32_t)m->rank;
  r.size = (uint32_t)m->size;
  r.conn = h->conn;
  r.nconn = (uint32_t)m->K;
  r.flags = m->auth.have_key ? MLXD_HS_FLAG_SECRET : 0;
  memcpy(r.token, m->auth.token, MLXD_HS_TOKEN_BYTES);
  mlxd_status ignore = {0};
  if (mlxd_random_bytes(r.nonce, sizeof r.nonce, &ignore) != 0) {
    refuse(m, p, "no random bytes for the handshake (libcrypto)");
    return 0;
  }
  const unsigned char* key = m->auth.have_key ? m->auth.key : NULL;
  if (mlxd_hs_mac(key, false, m->auth.token, m->size, m->K, (int)h->conn, (int)h->rank, m->rank,
                  h->nonce, r.nonce, r.mac) != 0 ||
      mlxd_hs_mac(key, true, m->auth.token, m->size, m->K, (int)h->conn, (int)h->rank, m->rank,
                  h->nonce, r.nonce, p->expect) != 0) {
    refuse(m, p, "libcrypto failed (HMAC)");
    return 0;
  }
  unsigned char buf[MLXD_HS_REPLY_BYTES];
  mlxd_hs_encode_reply(buf, &r);
  ssize_t k = send(p->fd, buf, sizeof buf, MSG_NOSIGNAL);
  if (e != MLXD_HS_OK) { /* answered, so that the peer can name the problem too */
    refuse(m, p, "%s (it claims rank %u)", mlxd_hs_reason(e), (unsigned)h->rank);
    return 0;
  }
  if (k != (ssize_t)sizeof buf) {
    refuse(m, p, "cannot send the handshake reply: %s", k < 0 ? strerror(errno) : "short write");
    return 0;
  }
  p->state = P_CONFIRM;
  p->got = 0;
  /* It showed this job's token: a busy honest peer gets the whole connect
   * budget for its proof, not the stranger's HS_TIMEOUT_S. */
  p->deadline = mlxd_now() + (m->budget > HS_TIMEOUT_S ? m->budget : HS_TIMEOUT_S);
  return 0;
}

/* Lazy: this rank's own connection for slot (j, c) is over without filling
 * the slot (the peer closed it, it failed, or it was dropped): the hello j
 * sent for the slot meanwhile is answered now (or turned down, when this
 * rank refuses every hello; or closed quietly, the slot filled). */
void mlxd_mesh_pend_release(mesh* m, int j, int c) {
  for (int i = 0; m->npending > 0 && i < m->pend_hi; i++) {
    pending* p = &m->pend[i];
    if (p->state != P_DEFER || (int)p->hello.rank != j || (int)p->hello.conn != c) continue;
    if (m->refusing) {
      pend_refuse(m, p);
    } else if (slot_fd(m, j * m->K + c) >= 0) {
      mlxd_mesh_pend_yield(m, p, "the slot is filled already");
    } else {
      mlxd_net_log(
          "rank %d: this rank's own connection %d to rank %d is over: answering its "
          "hello from %s",
          m->rank, c, j, p->addr);
      (void)pend_answer(m, p, MLXD_HS_OK);
    }
  }
}

static void pend_confirm(mesh* m, pending* p) {
  mlxd_hs_err e = mlxd_hs_check_confirm(p->in, p->got, p->expect);
  const mlxd_hs_msg* h = &p->hello;
  if (e != MLXD_HS_OK) {
    refuse(m, p, "%s (it claimed rank %u)", mlxd_hs_reason(e), (unsigned)h->rank);
    return;
  }
  if (m->refusing) { /* answered before the transport failed or its destroy began */
    mlxd_mesh_pend_yield(m, p, "the group failed or is shutting down");
    return;
  }
  int slot = (int)h->rank * m->K + (int)h->conn;
  if (slot_fd(m, slot) >= 0) { /* two complete handshakes for one slot: the first won */
    refuse(m, p, "rank %u's connection %u is already established (a duplicate or an impostor)",
           (unsigned)h->rank, (unsigned)h->conn);
    return;
  }
  mlxd_net_log("rank %d: accepted connection %u from rank %u at %s", m->rank, (unsigned)h->conn,
               (unsigned)h->rank, p->addr);
  int fd = p->fd;
  ep_ctl(m, EPOLL_CTL_DEL, fd, 0, 0, 0);
  p->fd = -1;
  p->state = P_FREE;
  m->npending--;
  mlxd_mesh_fill(m, (int)h->rank, (int)h->conn, fd);
  /* Lazy: this rank's own attempt for the slot, if any, is closed by the
   * peer (it keeps the higher rank's); mlxd_mesh_out_retry drops it then. */
}

void mlxd_mesh_pend_read(mesh* m, pending* p) {
  if (p->state == P_DEFER) { /* its hello is read; an honest peer waits for the reply */
    unsigned char extra;
    ssize_t k = recv(p->fd, &extra, 1, 0);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (k > 0)
      refuse(m, p, "it sent more than a hello before the reply (it claimed rank %u)",
             (unsigned)p->hello.rank);
    else
      refuse(m, p, "it closed the connection in the middle of the handshake (no reply yet)");
    return;
  }
  size_t want = p->state == P_HELLO ? MLXD_HS_HELLO_BYTES : MLXD_HS_CONFIRM_BYTES;
  ssize_t k = recv(p->fd, p->in + p->got, want - p->got, 0);
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (k <= 0) {
    if (p->got == 0 && p->state == P_HELLO)
      refuse(m, p, "it closed the connection without a handshake");
    else
      refuse(m, p, "it closed the connection in the middle of the handshake (%s)",
             p->state == P_HELLO ? "partial hello" : "no proof sent");
    return;
  }
  p->got += (size_t)k;
  if (p->got >= 4 && p->got < want) { /* garbage is refused as soon as it shows */
    mlxd_hs_msg tmp;
    mlxd_hs_err e = p->state == P_HELLO ? mlxd_hs_check_hello(p->in, p->got, &m->ex, &tmp)
                                        : mlxd_hs_check_confirm(p->in, p->got, p->expect);
    if (e == MLXD_HS_MAGIC) {
      refuse(m, p, "%s", mlxd_hs_reason(e));
      return;
    }
  }
  if (p->got < want) return;
  if (p->state == P_HELLO)
    pend_hello(m, p);
  else
    pend_confirm(m, p);
}

void mlxd_mesh_pend_expire(mesh* m, double now) {
  for (int i = 0; m->npending > 0 && i < m->pend_hi; i++) {
    pending* p = &m->pend[i];
    if (p->state == P_FREE || now < p->deadline) continue;
    /* What the peer sent may be waiting unread (more sockets were ready than
     * one epoll_wait returns, or this rank was not scheduled for a while):
     * read it before giving up, so that a peer that sent its confirm, and so
     * already uses this connection, is not cut off. */
    mlxd_mesh_pend_read(m, p);
    if (p->state == P_FREE || now < p->deadline) continue;
    if (p->state == P_HELLO && p->got == 0)
      refuse(m, p, "it sent nothing within %g s", HS_TIMEOUT_S);
    else if (p->state == P_HELLO)
      refuse(m, p, "it did not send a whole hello within %g s", HS_TIMEOUT_S);
    else
      refuse(m, p, "it did not complete the handshake within %g s", m->budget);
  }
}

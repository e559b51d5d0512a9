/* Connection set-up for the ring backend: listen, connect with retries and
 * exponential back-off, accept, and the handshake of handshake.h on every
 * connection. The result is a full mesh: nconn sockets between every pair of
 * ranks, so send/recv works between any two ranks.
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
 * order, so no rank can block another. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "backends/ring/handshake.h"
#include "backends/ring/ring_internal.h"
#include "security/secret.h"
#include "transport/tcp.h"
#include "transport/tcp_wire.h"
#include "util/bytes.h"
#include "util/clock.h"
#include "util/env.h"
#include "util/tunables.h"
#include "util/ztable.h"

#define SOCK_BUF_BYTES (4 << 20)
#define LISTEN_BACKLOG 64 /* bounded: a flood fills it, not memory; accepted at once anyway */
#define MAX_PENDING 64    /* incoming handshakes in progress at once: at least this many... */
#define PENDING_CAP 4096  /* ...and one per connection of the group up to this many */
#define HS_TIMEOUT_S 3.0  /* an incoming connection's time to send a well-formed hello */
/* One outgoing connect() attempt waits CONNECT_FIRST_S, doubling per expired
 * attempt up to CONNECT_ATTEMPT_S, then a fresh one. Short at first: a flood
 * that fills a listener's backlog while it cannot accept (during split's
 * exchange or a caller's all-gather) gets the rightful SYN dropped, and the
 * kernel would resend it only after 1 s (test_trust split flood). */
#define CONNECT_FIRST_S 0.25
#define CONNECT_ATTEMPT_S 2.0
#define LOG_LINES 20 /* refused connections logged per set-up, then counted */
/* accept() out of descriptors or buffers with nothing to shed: the listeners
 * rest this long, doubling up to ACCEPT_REST_MAX_S */
#define ACCEPT_REST_S 0.01
#define ACCEPT_REST_MAX_S 1.0

bool mlxd_ring_verbose(void) {
  const char* v = mlxd_env_get("MLX_RING_VERBOSE");
  return v && *v && strcmp(v, "0") != 0;
}

void mlxd_ring_log(const char* fmt, ...) {
  if (!mlxd_ring_verbose()) return;
  char line[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "[ring] %s\n", line);
}

void mlxd_ring_close_all(int* fds, int n) {
  for (int i = 0; i < n; i++) {
    if (fds[i] >= 0) close(fds[i]);
    fds[i] = -1;
  }
}

static void set_buffers(int fd) {
  int v = SOCK_BUF_BYTES;
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v);
}

static void set_nodelay(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int set_nonblock(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -1;
  return fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

/* A failed system call while setting up this rank's own sockets. */
static int setup_fail_sys(mlxd_status* st, const char* what, const char* addr, const char* call,
                          int err) {
  mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "%s %s", what, addr);
  mlxd_status_set_sys(st, call, err);
  return MLXD_ESYS;
}

int mlxd_ring_listen(mlxd_ring_addr* addr, int* fd_out, mlxd_status* st) {
  *fd_out = -1;
  /* non-blocking: the mesh loop accepts until the queue is empty */
  int fd = socket(addr->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return setup_fail_sys(st, "cannot create a socket to listen on", addr->text, "socket", errno);
  int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  set_buffers(fd); /* inherited by accepted sockets; must precede listen for window scaling */
  if (bind(fd, (struct sockaddr*)&addr->sa, addr->len) != 0) {
    int e = errno;
    close(fd);
    /* EADDRINUSE: another process listens there (another job with the same
     * hostfile?): the bind exclusivity that keeps two such jobs apart. */
    return setup_fail_sys(st, "cannot bind this rank's listen address", addr->text, "bind", e);
  }
  if (listen(fd, LISTEN_BACKLOG) != 0) {
    int e = errno;
    close(fd);
    return setup_fail_sys(st, "cannot listen on", addr->text, "listen", e);
  }
  socklen_t len = sizeof addr->sa;
  if (getsockname(fd, (struct sockaddr*)&addr->sa, &len) == 0) {
    addr->len = len;
    mlxd_ring_format_addr((struct sockaddr*)&addr->sa, addr->text, sizeof addr->text);
  }
  mlxd_ring_log("listening on %s", addr->text);
  *fd_out = fd;
  return 0;
}

int mlxd_ring_listen_many(const mlxd_ring_addr* host, int nconn, int* lfds, mlxd_ring_addr* addrs,
                          mlxd_status* st) {
  for (int c = 0; c < nconn; c++) lfds[c] = -1;
  unsigned lo, hi; /* MLXDIST_PORT_RANGE (endpoint.c) */
  if (mlxd_ring_port_range(&lo, &hi, st)) return st->code;
  for (int c = 0; c < nconn; c++) {
    addrs[c] = *host;
    if (addrs[c].sa.ss_family == AF_INET)
      ((struct sockaddr_in*)(void*)&addrs[c].sa)->sin_port = 0;
    else
      ((struct sockaddr_in6*)(void*)&addrs[c].sa)->sin6_port = 0;
    if ((lo ? mlxd_ring_listen_in_range(&addrs[c], lo, hi, &lfds[c], st)
            : mlxd_ring_listen(&addrs[c], &lfds[c], st)) != 0) {
      mlxd_ring_close_all(lfds, nconn);
      return st->code;
    }
  }
  return 0;
}

/* ---- the job's identity and secret ---- */

void mlxd_ring_auth_clear(mlxd_ring_auth* a) { mlxd_wipe(a, sizeof *a); }

int mlxd_ring_auth_env_token(mlxd_ring_auth* a, bool* found, mlxd_status* st) {
  const char* v = mlxd_tunable_str(MLXD_T_JOB_TOKEN);
  *found = v && *v;
  if (!*found) return 0;
  if (mlxd_hs_token_parse(v, a->token) != 0)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "MLXDIST_JOB_TOKEN='%.80s%s' is not a job token (expected exactly %d hex "
                        "digits, as mlxdist-launch sets it; unset it to derive one from the "
                        "hostfile)",
                        v, strlen(v) > 80 ? "..." : "", 2 * MLXD_RING_TOKEN_BYTES);
  return 0;
}

int mlxd_ring_auth_load(mlxd_ring_auth* a, mlxd_status* st) {
  memset(a, 0, sizeof *a);
  mlxd_secret s;
  if (mlxd_secret_load(&s, st)) {
    /* the secret's own messages are plain; keep them, under the bootstrap layer */
    char msg[MLXD_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", st->msg);
    int code = st->code;
    mlxd_fail_at(st, code, MLXD_LAYER_BOOTSTRAP, "%s", msg);
    return code;
  }
  if (s.have) {
    if (mlxd_secret_derive(&s, "handshake", a->key) != 0) {
      memset(&s, 0, sizeof s);
      return mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP,
                          "cannot derive the handshake key from MLXDIST_SECRET_FILE (libcrypto)");
    }
    a->have_key = true;
  }
  mlxd_wipe(&s, sizeof s);
  return 0;
}

/* ---- the mesh: one loop over every connection and handshake ----
 *
 * One engine serves both ways of connecting. Eager (mlxd_ring_mesh_with):
 * every connection to a lower rank is wanted at once and the loop runs until
 * every slot is filled. Lazy (mlxd_ring_dialer_new, the TCP transport's
 * dialer, tcp.h): nothing is wanted at first; the transport wants a peer the
 * first time an op names it, and runs one non-blocking step per progress
 * round; any rank may connect to any other (the hello may come from a lower
 * rank), and each filled slot is handed to the transport at once.
 *
 * Both ends may want each other at once. A slot (peer, conn) is filled by
 * exactly one connection on both ends: an acceptor that reads a hello for a
 * slot it is itself connecting keeps its own connection when it is the higher
 * rank (closes the hello quietly, without a reply) and takes the hello when
 * it is the lower one (once its own attempt is over, below: the peer closes
 * it, the same rule seen from there; so a stranger claiming a higher rank at
 * a lower one gets the full handshake, and its refusal logged, unless this
 * rank's own connection to that rank completes first: then it is closed
 * quietly, as the honest peer's would be); a
 * hello for a slot already filled is closed quietly too. An outgoing
 * connection the peer closed is retried only while the slot is neither
 * filled nor being accepted. A connector sends its confirm (which
 * commits the peer) only while the slot is free on its side too: not once it
 * is filled, nor while it has answered a higher peer's hello for it; when a
 * higher rank's own connection completes, a lower peer's answered hello for
 * the slot is closed. A handshake this rank stood down for that then fails
 * re-arms a wanted peer's dial. A pending handshake is read once more before
 * its deadline refuses it (its bytes may sit unread under load). No
 * connection carries data before its slot is filled on its side, so no byte
 * is lost.
 *
 * An abandoned dial is never left for the peer to refuse. A lower rank that
 * reads a higher peer's hello for a slot while its own connection for that
 * slot is open (connecting, or its hello sent) does not answer at once: it
 * answers once its own connection is over (P_DEFER, pend_release). That
 * happens in one of three ways: the peer read its hello and closed it (the
 * higher rank keeps its own), the connect failed, or the peer answered it
 * (then this rank's connection fills the slot and the deferred hello is
 * closed quietly). So the reply that completes the higher rank's connection,
 * and with it perhaps its whole set-up, is sent only after the higher rank
 * has read, and closed, the lower rank's competing connection: the higher
 * rank can never end its set-up holding it silent and refuse it with a line
 * ("it had sent nothing when the set-up ended": honest 2- and 4-rank jobs
 * printed it in some runs, when the reply came first and the lower rank's
 * hello was still unsent or unread; ring_lazy_quiet). This is an order of
 * events, not a timing: it holds however the two processes are scheduled
 * and however the network delays either connection. The higher rank never
 * defers (it answers or closes a lower rank's hello at once, in its next
 * step), so what a deferral waits for never waits on anything itself: no
 * cycle, no deadlock. The one dial still closed before its hello is an
 * attempt whose connect bound ran out unconnected (a SYN dropped by a full
 * backlog); the peer sees it only if its handshake completes in the instant
 * between that check and the close.
 *
 * Every socket of the engine is in one epoll set (listeners, pending
 * handshakes, outgoing connections), so a step costs what is active. */

enum { O_NONE, O_IDLE, O_CONNECTING, O_WAIT_REPLY, O_DONE };
/* P_DEFER (lazy): a higher peer's hello passed its checks while this rank's
 * own connection for the slot is open; answered once that one is over
 * (pend_release), see "An abandoned dial" above. */
enum { P_FREE, P_HELLO, P_CONFIRM, P_DEFER };
enum { EV_LISTEN = 1, EV_PEND = 2, EV_OUT = 3 };

typedef struct outgoing { /* this rank's connection c to rank j */
  int j, c;
  int fd;
  int state;
  double retry_at;   /* O_IDLE: when to connect again */
  double attempt_by; /* O_CONNECTING: when this attempt is given up */
  double give_up;    /* lazy: MLXDIST_CONNECT_TIMEOUT from the first want */
  double first_want; /* lazy: when the transport first asked for the peer (0: never) */
  double backoff;
  double attempt_s;     /* the next connect() attempt's bound */
  int attempts, closed; /* connect attempts; handshakes the peer closed */
  int refused;          /* attempts answered ECONNREFUSED (nothing listened yet) */
  bool wanted;          /* lazy: the transport asked for this peer */
  int last_errno;
  unsigned char nonce[MLXD_HS_NONCE_BYTES];
  unsigned char in[MLXD_HS_REFUSAL_MAX]; /* the reply, or a refusal */
  size_t got, want;
} outgoing;

typedef struct pending { /* an accepted connection in its handshake */
  int fd;
  int state;
  double since, deadline;
  char addr[80];
  unsigned char in[MLXD_HS_HELLO_BYTES]; /* the hello, then the confirm */
  size_t got;
  mlxd_hs_msg hello;
  unsigned char expect[MLXD_HS_MAC_BYTES]; /* the confirm's MAC */
} pending;

typedef struct mesh {
  mlxd_tcp_dialer d; /* first: the lazy transport's view */
  int rank, size, K;
  bool lazy;
  const mlxd_ring_hosts* hosts;
  mlxd_ring_hosts own_hosts; /* lazy: a copy */
  int lfds[64];
  mlxd_ring_auth auth;
  mlxd_hs_expect ex;
  /* Slot j * K + c: rank j's connection c. Tables sized by the group, but
   * written only for the slots used: a rank of a big group touches memory
   * for the peers it talks to (util/ztable.h), not for every rank. */
  int* fds; /* eager: the caller's (>= 0: filled); lazy: a ztable of fd + 1 (0: empty; the
               transport owns the fd) */
  int filled, need;
  outgoing** outs;  /* a ztable: outs[slot], NULL until this rank first dials the slot */
  outgoing** olist; /* the outgoing connections made (nout), what the loops walk */
  int nout, olist_cap;
  int nactive;         /* outs not in O_NONE / O_DONE */
  pending* pend;       /* a ztable of npend entries, P_FREE (zero) until used */
  int npend, npending; /* entries, entries in use */
  int pend_hi;         /* entries [pend_hi, npend) were never used */
  int ep;
  /* accept() or socket() short of descriptors or buffers (EMFILE, ENFILE,
   * ENOBUFS, ENOMEM): never fatal to accept; logged once, counted */
  int fd_errno; /* the last such errno (0: none yet) */
  int fd_shed;  /* pending connections without a hello closed to make room */
  bool rest;    /* the listeners are out of the epoll set until rest_until */
  double rest_until, rest_s;
  /* lazy, the transport failed or is being destroyed: every hello that passes
   * its checks is answered with a refusal (handshake.h) and nothing is dialed */
  unsigned refusing; /* 0, MLXD_HS_REFUSE_FAILED or _CLOSING */
  unsigned char refuse_body[MLXD_HS_REFUSAL_BODY_MAX];
  size_t refuse_len;
  int refusals; /* hellos answered so */
  /* refused connections: logged up to LOG_LINES, the rest counted */
  int refused, shown;
  char last_refused[260];
  double budget;
  const char* tag;  /* "ring", "jaccl" */
  const bool* link; /* NULL: every rank */
  const char* what; /* "hostfile" */
} mesh;

static bool linked(const mesh* m, int j) { return !m->link || m->link[j]; }

/* Slot's fd, -1 when empty. */
static int slot_fd(const mesh* m, int slot) { return m->lazy ? m->fds[slot] - 1 : m->fds[slot]; }

/* The outgoing connection for slot (j, c), made on first use (NULL: out of memory). */
static outgoing* out_make(mesh* m, int j, int c) {
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

static void ep_ctl(mesh* m, int op, int fd, unsigned events, int kind, int idx) {
  struct epoll_event ev;
  memset(&ev, 0, sizeof ev);
  ev.events = events;
  ev.data.u64 = ((uint64_t)kind << 32) | (uint32_t)idx;
  (void)epoll_ctl(m->ep, op, fd, &ev); /* ADD/MOD of a valid fd: only ENOMEM, seen as a stall */
}

static bool slot_taken(const mesh* m, int j, int c);

/* Arm outgoing connection o for a first attempt now (a lazy dial, or a
 * dial again), within MLXDIST_CONNECT_TIMEOUT of the first want. */
static void out_arm(mesh* m, outgoing* o, double now) {
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
  if (m->refusing || !o || !o->wanted || o->state != O_NONE || slot_taken(m, j, c)) return;
  mlxd_ring_log("rank %d: rank %d's connection %d failed in its handshake: connecting again",
                m->rank, j, c);
  double now = mlxd_now();
  out_arm(m, o, now);
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

static bool transient_errno(int e) {
  return e == ECONNREFUSED || e == ETIMEDOUT || e == ENETUNREACH || e == EHOSTUNREACH ||
         e == ECONNRESET || e == EADDRNOTAVAIL || e == EAGAIN || e == EINTR || e == EPIPE ||
         e == ECONNABORTED;
}

static void pend_release(mesh* m, int j, int c);

static void out_close(mesh* m, outgoing* o) {
  if (o->fd >= 0) {
    ep_ctl(m, EPOLL_CTL_DEL, o->fd, 0, 0, 0);
    close(o->fd);
  }
  o->fd = -1;
}

/* Lazy: this outgoing connection is no longer needed (the slot is filled or
 * being accepted from the peer, or nothing is dialed any more). */
static void out_drop(mesh* m, outgoing* o) {
  out_close(m, o);
  if (m->lazy) pend_release(m, o->j, o->c);
  if (o->state != O_NONE && o->state != O_DONE) m->nactive--;
  o->state = O_NONE;
  o->got = 0;
}

/* Lazy: whether slot (j, c) is filled or an incoming handshake for it has
 * passed its hello (it will fill it unless its proof fails). */
static bool slot_taken(const mesh* m, int j, int c) {
  if (slot_fd(m, j * m->K + c) >= 0) return true;
  for (int i = 0; m->npending > 0 && i < m->pend_hi; i++) {
    const pending* p = &m->pend[i];
    if (p->state == P_CONFIRM && (int)p->hello.rank == j && (int)p->hello.conn == c) return true;
  }
  return false;
}

static void out_retry(mesh* m, outgoing* o, int err) {
  out_close(m, o);
  if (m->lazy) pend_release(m, o->j, o->c); /* answered: the slot is being accepted */
  o->got = 0;
  o->last_errno = err;
  if (err == ECONNREFUSED) o->refused++;
  if (m->lazy && slot_taken(m, o->j, o->c)) {
    out_drop(m, o);
    return;
  }
  o->state = O_IDLE;
  o->retry_at = mlxd_now() + o->backoff;
  o->backoff = o->backoff * 2 > 0.5 ? 0.5 : o->backoff * 2;
}

/* The set-up ended (lazy: every peer is connected, or the group is
 * destroyed): what is still pending is refused, as at the end of an eager
 * mesh. */
static void pend_end(mesh* m) {
  for (int i = 0; m->npending > 0 && i < m->pend_hi; i++)
    if (m->pend[i].state != P_FREE)
      refuse(m, &m->pend[i], "%s when the set-up ended",
             m->pend[i].got == 0 && m->pend[i].state == P_HELLO ? "it had sent nothing"
                                                                : "its handshake was incomplete");
}

/* Slot (j, c) is filled with fd. */
static void fill(mesh* m, int j, int c, int fd) {
  m->fds[j * m->K + c] = m->lazy ? fd + 1 : fd;
  m->filled++;
  if (m->lazy && m->d.ready) m->d.ready(m->d.ready_ctx, j, c, fd);
  if (m->lazy && m->filled == (m->size - 1) * m->K) /* no peer may connect any more */
    for (int k = 0; k < m->K; k++)
      if (m->lfds[k] >= 0) {
        ep_ctl(m, EPOLL_CTL_DEL, m->lfds[k], 0, 0, 0);
        close(m->lfds[k]);
        m->lfds[k] = -1;
        mlxd_ring_log("rank %d: every peer is connected: listener %d closed", m->rank, k);
      }
  if (m->lazy && m->filled == (m->size - 1) * m->K) pend_end(m);
}

/* The connection is up: send the hello. */
static void out_send_hello(mesh* m, outgoing* o) {
  set_nodelay(o->fd);
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
    out_retry(m, o, EAGAIN);
    return;
  }
  memcpy(h.nonce, o->nonce, sizeof o->nonce);
  unsigned char buf[MLXD_HS_HELLO_BYTES];
  mlxd_hs_encode_hello(buf, &h);
  /* A fresh socket's send buffer takes it whole; anything else is a failed attempt. */
  ssize_t k = send(o->fd, buf, sizeof buf, MSG_NOSIGNAL);
  if (k != (ssize_t)sizeof buf) {
    out_retry(m, o, k < 0 ? errno : EPIPE);
    return;
  }
  o->state = O_WAIT_REPLY;
  o->got = 0;
  o->want = MLXD_HS_REPLY_BYTES; /* a refusal's head says how much more (out_read) */
  ep_ctl(m, EPOLL_CTL_MOD, o->fd, EPOLLIN, EV_OUT, o->j * m->K + o->c);
}

/* The open-file limit, for the messages of a failed socket() or accept(). */
static void nofile_text(char* buf, size_t n) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    snprintf(buf, n, "RLIMIT_NOFILE unknown");
    return;
  }
  snprintf(buf, n, "RLIMIT_NOFILE soft %llu, hard %llu", (unsigned long long)rl.rlim_cur,
           (unsigned long long)rl.rlim_max);
}

static bool short_of_fds(int e) {
  return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM;
}

/* accept() or socket() ran short of descriptors or kernel buffers: said
 * once per engine (a flood of idle connections must not fill stderr). */
static void fd_short(mesh* m, int e, const char* call) {
  bool first = m->fd_errno == 0;
  m->fd_errno = e;
  if (!first) return;
  char lim[96];
  nofile_text(lim, sizeof lim);
  fprintf(stderr,
          "[%s] rank %d: %s failed: %s (%s); connections that have sent no hello are closed "
          "to make room, oldest first, and accepting pauses while there are none (said once)\n",
          m->tag, m->rank, call, strerror(e), lim);
}

/* Close the oldest pending connection that has not sent a whole hello (an
 * honest peer sends it at once; one that did keeps its place), counted as
 * refused, not logged line by line. Whether there was one. */
static bool pend_shed(mesh* m) {
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

static void accept_resume(mesh* m, double now) {
  if (!m->rest || now < m->rest_until) return;
  m->rest = false;
  for (int c = 0; c < m->K; c++)
    if (m->lfds[c] >= 0) ep_ctl(m, EPOLL_CTL_MOD, m->lfds[c], EPOLLIN, EV_LISTEN, c);
}

/* What was short, for the messages of a connect bound that ran out. */
static void fd_text(const mesh* m, char* buf, size_t n) {
  buf[0] = '\0';
  if (!m->fd_errno) return;
  char lim[96];
  nofile_text(lim, sizeof lim);
  snprintf(buf, n,
           "; this rank ran short of descriptors or buffers (%s; %s), %d connection%s without a "
           "hello closed to make room",
           strerror(m->fd_errno), lim, m->fd_shed, m->fd_shed == 1 ? "" : "s");
}

/* Start a connect() attempt (O_IDLE -> O_CONNECTING or straight on); a
 * non-transient failure is fatal (st set, -1). */
static int out_start(mesh* m, outgoing* o, mlxd_status* st) {
  const mlxd_ring_addr* a = &m->hosts->addrs[o->j * m->K + o->c];
  o->attempts++;
  int fd = socket(a->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0 && short_of_fds(errno)) { /* a flood's idle connections may hold them */
    int e = errno;
    fd_short(m, e, "socket");
    if (pend_shed(m))
      fd = socket(a->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    else
      errno = e;
  }
  if (fd < 0) {
    int e = errno;
    char lim[96] = "";
    if (e == EMFILE || e == ENFILE) nofile_text(lim, sizeof lim);
    mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP,
                 "cannot create a socket to connect to rank %d%s%s%s", o->j, lim[0] ? " (" : "",
                 lim, lim[0] ? "; raise it with ulimit -n)" : "");
    mlxd_status_set_peer(st, o->j, a->text);
    mlxd_status_set_sys(st, "socket", e);
    return -1;
  }
  set_buffers(fd);
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
    out_retry(m, o, e);
    return 0;
  }
  out_close(m, o);
  mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "cannot connect to rank %d", o->j);
  mlxd_status_set_peer(st, o->j, a->text);
  mlxd_status_set_sys(st, "connect", e);
  return -1;
}

/* O_CONNECTING and the socket is writable (or the attempt is over). */
static void out_connected(mesh* m, outgoing* o, bool expired) {
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
    out_retry(m, o, err);
    return;
  }
  out_send_hello(m, o);
}

static void pend_yield(mesh* m, pending* p, const char* why);

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
  if (e == MLXD_HS_OK && m->lazy && slot_taken(m, o->j, o->c) &&
      (slot_fd(m, o->j * m->K + o->c) >= 0 || m->rank < o->j)) {
    mlxd_ring_log(
        "rank %d: connection %d to rank %d answered, but the slot is taken: closed "
        "without a confirm",
        m->rank, o->c, o->j);
    out_drop(m, o);
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
      out_retry(m, o, k < 0 ? errno : EPIPE);
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
      pend_yield(m, p, "this rank's own connection for the slot completed first");
  }
  mlxd_ring_log("rank %d: connection %d to rank %d at %s ready", m->rank, o->c, o->j, at);
  fill(m, o->j, o->c, fd);
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
      out_drop(m, o);
      mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "libcrypto failed (HMAC)");
      return -1;
    }
    if (key && !mlxd_hs_mac_equal(mac, r.mac)) e = MLXD_HS_MAC_E;
  }
  mlxd_tcp_abort_rec rec;
  char why[200] = "";
  if (e == MLXD_HS_OK && kind == MLXD_HS_REFUSE_FAILED) {
    /* the record names the rank that found the failure first: any rank of the group */
    int32_t reporter = blen >= 8 ? (int32_t)((uint32_t)body[4] | (uint32_t)body[5] << 8 |
                                             (uint32_t)body[6] << 16 | (uint32_t)body[7] << 24)
                                 : -1;
    if (reporter < 0 || reporter >= m->size)
      snprintf(why, sizeof why, "a failure record naming rank %d as its reporter", (int)reporter);
    else
      (void)mlxd_tcp_abort_decode(body, blen, reporter, m->size, &rec, why, sizeof why);
  }
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
  out_drop(m, o);
  return -1;
}

/* O_WAIT_REPLY and readable. */
static int out_read(mesh* m, outgoing* o, mlxd_status* st) {
  ssize_t k = recv(o->fd, o->in + o->got, o->want - o->got, 0);
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  if (k <= 0) {
    /* Closed before the reply: j refused the hello (another job on that port?
     * lazy: j keeps its own connection for this slot) or was not ready; try
     * again until the deadline. */
    o->closed++;
    out_retry(m, o, k == 0 ? ECONNRESET : errno);
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

/* ---- incoming ---- */

static void pend_read(mesh* m, pending* p);

static void pend_accept(mesh* m, int lfd) {
  for (int round = 0; round < 4 * MAX_PENDING; round++) {
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(lfd, (struct sockaddr*)&sa, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      /* Short of descriptors or buffers: never fatal (the listeners stay
       * open for the group's life, and anyone who reaches them can hold
       * idle connections). Make room at a silent connection's expense and
       * accept again, or pause accepting for a while. */
      if (short_of_fds(errno)) {
        fd_short(m, errno, "accept");
        if (pend_shed(m)) continue;
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
    set_nodelay(fd);
    if ((int)(p - m->pend) >= m->pend_hi) m->pend_hi = (int)(p - m->pend) + 1;
    memset(p, 0, sizeof *p);
    p->fd = fd;
    p->state = P_HELLO;
    p->since = mlxd_now();
    p->deadline = p->since + HS_TIMEOUT_S;
    m->npending++;
    mlxd_ring_format_addr((struct sockaddr*)&sa, p->addr, sizeof p->addr);
    ep_ctl(m, EPOLL_CTL_ADD, fd, EPOLLIN, EV_PEND, (int)(p - m->pend));
    pend_read(m, p); /* the hello is usually there already: a flood cannot push it out */
  }
}

/* Lazy: close a hello with this job's token without a word (a simultaneous
 * connect this rank's own connection wins, or a slot filled meanwhile). */
static void pend_yield(mesh* m, pending* p, const char* why) {
  mlxd_ring_log("rank %d: closed rank %u's connection %u from %s: %s", m->rank,
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
  mlxd_ring_log("rank %d: turned down rank %u's connection %u from %s (%s)%s", m->rank,
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
      pend_yield(m, p, "the slot is filled already");
      return 0;
    }
    if (ostate != O_NONE && m->rank > (int)h->rank) {
      pend_yield(m, p, "both connected at once; the higher rank's connection is kept");
      return 0;
    }
    if ((ostate == O_CONNECTING || ostate == O_WAIT_REPLY) && m->rank < (int)h->rank) {
      /* This rank's own connection is open: the peer answers or closes it
       * first (the file's head, "An abandoned dial"). The proof is asked
       * for after the reply, so this hello holds the budget a busy honest
       * peer's gets (its token was shown). */
      p->state = P_DEFER;
      p->deadline = mlxd_now() + (m->budget > HS_TIMEOUT_S ? m->budget : HS_TIMEOUT_S);
      mlxd_ring_log(
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
static void pend_release(mesh* m, int j, int c) {
  for (int i = 0; m->npending > 0 && i < m->pend_hi; i++) {
    pending* p = &m->pend[i];
    if (p->state != P_DEFER || (int)p->hello.rank != j || (int)p->hello.conn != c) continue;
    if (m->refusing) {
      pend_refuse(m, p);
    } else if (slot_fd(m, j * m->K + c) >= 0) {
      pend_yield(m, p, "the slot is filled already");
    } else {
      mlxd_ring_log(
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
    pend_yield(m, p, "the group failed or is shutting down");
    return;
  }
  int slot = (int)h->rank * m->K + (int)h->conn;
  if (slot_fd(m, slot) >= 0) { /* two complete handshakes for one slot: the first won */
    refuse(m, p, "rank %u's connection %u is already established (a duplicate or an impostor)",
           (unsigned)h->rank, (unsigned)h->conn);
    return;
  }
  mlxd_ring_log("rank %d: accepted connection %u from rank %u at %s", m->rank, (unsigned)h->conn,
                (unsigned)h->rank, p->addr);
  int fd = p->fd;
  ep_ctl(m, EPOLL_CTL_DEL, fd, 0, 0, 0);
  p->fd = -1;
  p->state = P_FREE;
  m->npending--;
  fill(m, (int)h->rank, (int)h->conn, fd);
  /* Lazy: this rank's own attempt for the slot, if any, is closed by the
   * peer (it keeps the higher rank's); out_retry drops it then. */
}

static void pend_read(mesh* m, pending* p) {
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

static void pend_expire(mesh* m, double now) {
  for (int i = 0; m->npending > 0 && i < m->pend_hi; i++) {
    pending* p = &m->pend[i];
    if (p->state == P_FREE || now < p->deadline) continue;
    /* What the peer sent may be waiting unread (more sockets were ready than
     * one epoll_wait returns, or this rank was not scheduled for a while):
     * read it before giving up, so that a peer that sent its confirm, and so
     * already uses this connection, is not cut off. */
    pend_read(m, p);
    if (p->state == P_FREE || now < p->deadline) continue;
    if (p->state == P_HELLO && p->got == 0)
      refuse(m, p, "it sent nothing within %g s", HS_TIMEOUT_S);
    else if (p->state == P_HELLO)
      refuse(m, p, "it did not send a whole hello within %g s", HS_TIMEOUT_S);
    else
      refuse(m, p, "it did not complete the handshake within %g s", m->budget);
  }
}

/* ---- the loop ---- */

/* Outgoing connection o ran out of MLXDIST_CONNECT_TIMEOUT: say what was seen. */
static int out_timeout(mesh* m, outgoing* o, mlxd_status* st) {
  const char* at = m->hosts->addrs[o->j * m->K + o->c].text;
  char fds[300];
  fd_text(m, fds, sizeof fds);
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

/* MLXDIST_CONNECT_TIMEOUT ran out: say which peer is missing and what was seen. */
static int mesh_timeout(mesh* m, mlxd_status* st) {
  for (int i = 0; i < m->nout; i++) {
    outgoing* o = m->olist[i];
    if (o->state != O_NONE && o->state != O_DONE) return out_timeout(m, o, st);
  }
  int missing = -1;
  for (int j = m->rank + 1; j < m->size && missing < 0; j++)
    for (int c = 0; c < m->K && linked(m, j); c++)
      if (slot_fd(m, j * m->K + c) < 0) missing = j;
  char seen[300] = "", fds[300];
  if (m->refused > 0)
    snprintf(seen, sizeof seen, " %d connection%s refused, the last from %.200s", m->refused,
             m->refused == 1 ? " was" : "s were", m->last_refused);
  fd_text(m, fds, sizeof fds);
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
static double mesh_next(const mesh* m) {
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
static int mesh_step(mesh* m, int timeout_ms, mlxd_status* st) {
  double now = mlxd_now();
  accept_resume(m, now);
  for (int i = 0; m->nactive > 0 && i < m->nout; i++) {
    outgoing* o = m->olist[i];
    if (o->state != O_IDLE || o->retry_at > now) continue;
    if (m->lazy && slot_taken(m, o->j, o->c)) {
      out_drop(m, o);
      continue;
    }
    if (out_start(m, o, st) != 0) return -1;
  }
  if (timeout_ms > 0) {
    double wake = mesh_next(m);
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
      if (m->lfds[idx] >= 0) pend_accept(m, m->lfds[idx]);
    } else if (kind == EV_PEND) {
      pending* p = &m->pend[idx];
      if (p->state != P_FREE && p->fd >= 0) pend_read(m, p);
    } else if (kind == EV_OUT) {
      outgoing* o = m->outs[idx];
      if (!o) continue;
      if (o->state == O_CONNECTING)
        out_connected(m, o, false);
      else if (o->state == O_WAIT_REPLY && out_read(m, o, st) != 0)
        return -1;
    }
  }
  now = mlxd_now();
  for (int i = 0; m->nactive > 0 && i < m->nout; i++) {
    outgoing* o = m->olist[i];
    if (o->state == O_CONNECTING && now >= o->attempt_by) out_connected(m, o, true);
    if (m->lazy && o->state != O_NONE && o->state != O_DONE && now >= o->give_up) {
      if (slot_taken(m, o->j, o->c)) {
        out_drop(m, o);
        continue;
      }
      out_timeout(m, o, st);
      return -1;
    }
  }
  pend_expire(m, now);
  return 0;
}

static void mesh_free(mesh* m) {
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
    mlxd_ring_hosts_free(&m->own_hosts);
  }
  mlxd_ring_auth_clear(&m->auth);
  mlxd_ztable_free(m->outs, (size_t)m->size * (size_t)m->K, sizeof *m->outs);
  mlxd_ztable_free(m->pend, (size_t)m->npend, sizeof *m->pend);
  free(m);
}

/* A mesh over hosts (borrowed: the caller keeps it alive while m lives) for
 * rank, listening on lfds (K of them; not owned). NULL with st set. */
static mesh* mesh_new(int rank, const mlxd_ring_hosts* hosts, const int* lfds,
                      const mlxd_ring_auth* auth, const mlxd_ring_mesh_opts* opts, bool lazy,
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
    mesh_free(m);
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

int mlxd_ring_mesh(int rank, const mlxd_ring_hosts* hosts, const int* listen_fds,
                   const mlxd_ring_auth* auth, int* fds, mlxd_status* st) {
  return mlxd_ring_mesh_with(rank, hosts, listen_fds, auth, NULL, fds, st);
}

int mlxd_ring_mesh_with(int rank, const mlxd_ring_hosts* hosts, const int* listen_fds,
                        const mlxd_ring_auth* auth, const mlxd_ring_mesh_opts* opts, int* fds,
                        mlxd_status* st) {
  const int size = hosts->size, K = hosts->nconn;
  const bool* link = opts ? opts->link : NULL;
  int nlinks = 0;
  for (int j = 0; j < size; j++)
    if (j != rank && (!link || link[j])) nlinks++;
  const int total = size * K;
  for (int i = 0; i < total; i++) fds[i] = -1;
  mesh* m = mesh_new(rank, hosts, listen_fds, auth, opts, false, st);
  if (!m) return st->code;
  const double deadline = mlxd_now() + m->budget;
  m->fds = fds;
  m->need = nlinks * K;
  int rc = 0;
  for (int j = 0; j < rank && !rc; j++)
    for (int c = 0; c < K && linked(m, j) && !rc; c++) {
      outgoing* o = out_make(m, j, c);
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
    if (mesh_step(m, mlxd_ms_left(deadline), st) != 0) {
      rc = st->code ? st->code : MLXD_ESYS;
      break;
    }
  }
  /* What is still pending is refused too: every slot is filled (or set-up failed). */
  pend_end(m);
  if (m->refused > m->shown)
    fprintf(stderr, "[%s] rank %d: %d more refused connection%s not shown\n", m->tag, rank,
            m->refused - m->shown, m->refused - m->shown == 1 ? "" : "s");
  mesh_free(m);
  if (rc) {
    mlxd_ring_close_all(fds, total);
    return rc;
  }
  for (int i = 0; i < total; i++)
    if (fds[i] >= 0) set_nonblock(fds[i], false);
  return 0;
}

/* ---- the lazy dialer (tcp.h) ---- */

static int dial_want(mlxd_tcp_dialer* d, int peer, mlxd_status* st) {
  mesh* m = (mesh*)d;
  double now = mlxd_now();
  for (int c = 0; c < m->K; c++) {
    outgoing* o = out_make(m, peer, c);
    if (!o) {
      mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP,
                   "out of memory setting up a connection to rank %d", peer);
      mlxd_status_set_peer(st, peer, m->hosts->addrs[peer * m->K + c].text);
      return st->code;
    }
    o->wanted = true;
    if (o->state != O_NONE || slot_taken(m, peer, c)) continue;
    out_arm(m, o, now);
    if (out_start(m, o, st) != 0) return st->code;
  }
  return 0;
}

static int dial_step(mlxd_tcp_dialer* d, mlxd_status* st) {
  mesh* m = (mesh*)d;
  return mesh_step(m, 0, st) != 0 ? (st->code ? st->code : MLXD_ESYS) : 0;
}

static double dial_next(mlxd_tcp_dialer* d) { return mesh_next((mesh*)d); }
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
    if (o->state != O_NONE && o->state != O_DONE) out_drop(m, o);
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
  pend_end(m);
  if (m->refused > m->shown)
    fprintf(stderr, "[%s] rank %d: %d more refused connection%s not shown\n", m->tag, m->rank,
            m->refused - m->shown, m->refused - m->shown == 1 ? "" : "s");
  mesh_free(m);
}

static const mlxd_tcp_dialer_ops dial_ops = {dial_want,   dial_step,   dial_next, dial_fd,
                                             dial_refuse, dial_forget, dial_free};

bool mlxd_ring_connect_lazy(void) {
  /* MLXDIST_TLS=1 too: a connection's TLS handshake follows this file's, in the transport */
  const char* v = mlxd_tunable_str(MLXD_T_CONNECT);
  return !(v && strcmp(v, "eager") == 0);
}

int mlxd_ring_nofile(int size, int nconn, bool lazy, mlxd_status* st) {
  long pend = (long)size * nconn;
  if (pend < MAX_PENDING) pend = MAX_PENDING;
  if (pend > PENDING_CAP) pend = PENDING_CAP;
  /* every connection, the pending handshakes, listeners, and room for the rest of the process */
  rlim_t need = (rlim_t)size * (rlim_t)nconn + (rlim_t)pend + 256;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0; /* unknown: socket() will say */
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur >= need) return 0;
  if (rl.rlim_cur == RLIM_INFINITY) return 0;
  rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
  if (want > rl.rlim_cur) {
    struct rlimit nl = {want, rl.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &nl) == 0) {
      mlxd_ring_log("raised RLIMIT_NOFILE from %llu to %llu (%d ranks x %d connection(s))",
                    (unsigned long long)rl.rlim_cur, (unsigned long long)want, size, nconn);
      rl.rlim_cur = want;
    }
  }
  if (rl.rlim_cur >= need || lazy) return 0; /* lazy: only the connections used count */
  return mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP,
                      "a full mesh of %d ranks x %d connection(s) needs about %llu file "
                      "descriptors, but RLIMIT_NOFILE allows %llu (hard limit %llu): raise it "
                      "(ulimit -n) or use MLXDIST_CONNECT=lazy",
                      size, nconn, (unsigned long long)need, (unsigned long long)rl.rlim_cur,
                      (unsigned long long)rl.rlim_max);
}

mlxd_tcp_dialer* mlxd_ring_dialer_take(int rank, mlxd_ring_hosts* hosts, int* lfds,
                                       const mlxd_ring_auth* auth, mlxd_status* st) {
  const int K = hosts->nconn, size = hosts->size;
  /* fd + 1 per slot, zero: empty (not a -1 written per slot: that is a page
   * per 1,024 slots touched at init) */
  int* fds = mlxd_ztable_new((size_t)size * (size_t)K, sizeof *fds);
  mesh* m = NULL;
  if (fds) m = mesh_new(rank, hosts, lfds, auth, NULL, true, st);
  if (!m) {
    if (!fds)
      mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory setting up connections");
    mlxd_ztable_free(fds, (size_t)size * (size_t)K, sizeof *fds);
    return NULL; /* lfds and hosts stay the caller's */
  }
  /* the address book is taken over, not copied (a copy writes every entry) */
  m->own_hosts = *hosts;
  *hosts = (mlxd_ring_hosts){0, 0, NULL};
  m->hosts = &m->own_hosts;
  m->fds = fds;
  for (int c = 0; c < K; c++) lfds[c] = -1; /* ours now */
  m->d.ops = &dial_ops;
  return &m->d;
}

mlxd_tcp_dialer* mlxd_ring_dialer_new(int rank, const mlxd_ring_hosts* hosts, int* lfds,
                                      const mlxd_ring_auth* auth, mlxd_status* st) {
  size_t n = (size_t)hosts->size * (size_t)hosts->nconn;
  mlxd_ring_hosts own = {hosts->size, hosts->nconn, malloc(sizeof(mlxd_ring_addr) * (n ? n : 1))};
  if (!own.addrs) {
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory setting up connections");
    return NULL;
  }
  memcpy(own.addrs, hosts->addrs, sizeof(mlxd_ring_addr) * n);
  mlxd_tcp_dialer* d = mlxd_ring_dialer_take(rank, &own, lfds, auth, st);
  mlxd_ring_hosts_free(&own); /* empty when taken */
  return d;
}

/* Private to src/net: the mesh's engine, shared by its loop (mesh.c), its
 * connecting side (mesh_connect.c), its accepting side (mesh_accept.c) and the
 * lazy dialer (dialer.c). */
#ifndef MLXD_NET_MESH_H
#define MLXD_NET_MESH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>

#include "net/net.h"
#include "net/sock.h"
#include "transport/tcp.h"

#define HS_TIMEOUT_S 3.0 /* an incoming connection's time to send a well-formed hello */
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

/* ---- the mesh: one loop over every connection and handshake ----
 *
 * One engine serves both ways of connecting. Eager (mlxd_net_mesh_with):
 * every connection to a lower rank is wanted at once and the loop runs until
 * every slot is filled. Lazy (mlxd_net_dialer_new, the TCP transport's
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
 * answers once its own connection is over (P_DEFER, mlxd_mesh_pend_release). That
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
 * (mlxd_mesh_pend_release), see "An abandoned dial" above. */
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
  const mlxd_net_hosts* hosts;
  mlxd_net_hosts own_hosts; /* lazy: a copy */
  int lfds[64];
  mlxd_net_auth auth;
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

static inline bool linked(const mesh* m, int j) { return !m->link || m->link[j]; }

/* Slot's fd, -1 when empty. */
static inline int slot_fd(const mesh* m, int slot) {
  return m->lazy ? m->fds[slot] - 1 : m->fds[slot];
}

static inline void ep_ctl(mesh* m, int op, int fd, unsigned events, int kind, int idx) {
  struct epoll_event ev;
  memset(&ev, 0, sizeof ev);
  ev.events = events;
  ev.data.u64 = ((uint64_t)kind << 32) | (uint32_t)idx;
  (void)epoll_ctl(m->ep, op, fd, &ev); /* ADD/MOD of a valid fd: only ENOMEM, seen as a stall */
}

/* mesh.c */
bool mlxd_mesh_slot_taken(const mesh* m, int j, int c);
void mlxd_mesh_fill(mesh* m, int j, int c, int fd);
double mlxd_mesh_next(const mesh* m);
int mlxd_mesh_step(mesh* m, int timeout_ms, mlxd_status* st);
void mlxd_mesh_free(mesh* m);
mesh* mlxd_mesh_new(int rank, const mlxd_net_hosts* hosts, const int* lfds,
                    const mlxd_net_auth* auth, const mlxd_net_mesh_opts* opts, bool lazy,
                    mlxd_status* st);

/* mesh_connect.c */
outgoing* mlxd_mesh_out_make(mesh* m, int j, int c);
void mlxd_mesh_out_arm(mesh* m, outgoing* o, double now);
void mlxd_mesh_out_drop(mesh* m, outgoing* o);
void mlxd_mesh_out_retry(mesh* m, outgoing* o, int err);
int mlxd_mesh_out_start(mesh* m, outgoing* o, mlxd_status* st);
void mlxd_mesh_out_connected(mesh* m, outgoing* o, bool expired);
int mlxd_mesh_out_read(mesh* m, outgoing* o, mlxd_status* st);
int mlxd_mesh_out_timeout(mesh* m, outgoing* o, mlxd_status* st);

/* mesh_accept.c */
void mlxd_mesh_pend_end(mesh* m);
void mlxd_mesh_fd_short(mesh* m, int e, const char* call);
bool mlxd_mesh_pend_shed(mesh* m);
void mlxd_mesh_accept_resume(mesh* m, double now);
void mlxd_mesh_fd_text(const mesh* m, char* buf, size_t n);
void mlxd_mesh_pend_accept(mesh* m, int lfd);
void mlxd_mesh_pend_yield(mesh* m, pending* p, const char* why);
void mlxd_mesh_pend_release(mesh* m, int j, int c);
void mlxd_mesh_pend_read(mesh* m, pending* p);
void mlxd_mesh_pend_expire(mesh* m, double now);

#endif

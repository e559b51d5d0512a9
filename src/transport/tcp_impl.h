/* Private to the TCP transport: its state, shared by tcp.c (messages,
 * matching, progress), tcp_setup.c (create / destroy) and tcp_tls.c (the
 * TLS variant of the socket I/O). The design is described in tcp.c. */
#ifndef MLXD_TCP_IMPL_H
#define MLXD_TCP_IMPL_H

#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "transport/match.h"
#include "transport/tcp_wire.h"
#include "transport/tls.h"
#include "transport/transport.h"

#define TCP_HDR MLXD_TCP_HDR
#define TCP_FRAG_MAX ((size_t)MLXD_TCP_FRAG_MAX) /* largest fragment of a large message */
#define TCP_SPLIT_MIN ((size_t)64 << 10)         /* messages above this use every connection */
#define TCP_RBUF ((size_t)64 << 10)              /* per-connection receive staging buffer */
#define TCP_IO_MAX ((size_t)1 << 30)             /* at most this many bytes per syscall */
#define TCP_IOV 64                               /* iovec entries per sendmsg */
#define TCP_SOCKBUF (4 << 20)                    /* SO_SNDBUF / SO_RCVBUF we ask for */
#define TCP_BLOCK_MS 1000                        /* longest single blocking poll */
#define TCP_CV_MS 20                             /* longest single condition-variable sleep */
#define TCP_TLS_WBUF ((size_t)16 << 10)          /* TLS: headers and small payloads coalesced */

typedef struct tcp_frag tcp_frag;
typedef struct tcp_imsg tcp_imsg;

struct mlxd_req {
  mlxd_match_req m; /* first: peer, tag, n, outcome (match.h) */
  bool is_send;
  char* buf;
  size_t done;          /* bytes moved so far (for progress detection) */
  size_t frags_left;    /* send: fragments not yet fully written */
  mlxd_match_link link; /* recv: in the peer's posted queue */
  tcp_imsg* im;         /* recv: the incoming message it is attached to */
  tcp_frag* frags;      /* send: fragment array (same allocation) */
};

struct tcp_frag {
  struct mlxd_req* req;
  unsigned char hdr[TCP_HDR];
  size_t off, len;
  size_t sent; /* bytes of header + payload written */
  tcp_frag* next;
};

/* A message being received (or buffered because no receive was posted).
 * It is in its peer's `arriving` queue until its last fragment is in, and
 * in the peer's unexpected queue while it has no receive (req == NULL and
 * not discarded). */
struct tcp_imsg {
  size_t total, got; /* got: payload bytes received */
  size_t announced;  /* payload bytes of the fragments whose header arrived */
  char* buf;         /* the receive's buffer, or an owned one (unexpected) */
  bool owned;        /* buf is ours (mlxd_buffer_alloc) */
  bool discard;      /* size mismatch: drain and drop */
  bool complete;
  int peer;
  uint64_t charged; /* bytes charged to the peer's unexpected budget */
  mlxd_sig sig;     /* the sender's call (its first fragment's header) */
  struct mlxd_req* req;
  mlxd_match_link arr; /* in arriving (tag = the message's tag) */
  mlxd_match_link ux;  /* in the unexpected queue */
};

typedef struct tcp_conn {
  int fd;
  int peer;
  bool eof; /* the peer closed this connection (everything before it was read) */
  tcp_frag *qhead, *qtail;
  unsigned char* rbuf;
  size_t rpos, rlen;
  bool in_payload;
  tcp_imsg* cur;
  size_t cur_off, cur_len, cur_got;
  /* TLS only (ssl != NULL): */
  mlxd_tls_conn* ssl;
  unsigned char* wbuf; /* the next queue bytes, coalesced (TCP_TLS_WBUF) */
  size_t wpos, wlen;
  bool want_write; /* a read needs the socket writable first */
  bool kick;       /* read before polling: OpenSSL may hold bytes from the handshake */
  char tls_why[200];
} tcp_conn;

typedef struct tcp_peer {
  mlxd_match_peer mq;        /* posted receives, unexpected messages */
  mlxd_match_queue arriving; /* messages with fragments still to come */
  unsigned rr;
  bool closed;              /* every connection reached EOF with nothing pending */
  uint64_t ux_charged;      /* bytes of unexpected messages buffered (tcp_wire.h) */
  char addr[MLXD_ADDR_MAX]; /* "10.0.0.2:41000"; "" when unknown (e.g. AF_UNIX) */
} tcp_peer;

typedef struct tcp_transport {
  mlxd_transport base;
  int nconn;
  tcp_conn* conns; /* size * nconn; conns[p * nconn + c] */
  tcp_peer* peers;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool progressing;
  bool in_poll;
  bool completed; /* something completed since the last broadcast */
  int wake_fd;
  mlxd_status err; /* the first failure; err.code == 0 while none */
  double timeout_s;
  double spin_s;
  bool yield_spin;    /* more ranks than CPUs: give the CPU away between spin polls */
  uint64_t ux_budget; /* per peer (MLXDIST_TCP_UNEXPECTED_MB) */
  mlxd_tls* tls;      /* MLXDIST_TLS=1; NULL: plain sockets */
  struct pollfd* pfds;
  tcp_conn** pconn;
} tcp_transport;

extern const mlxd_transport_ops mlxd_tcp_ops;

/* tcp.c: account w bytes written from the head of c's queue (mu held). */
void mlxd_tcp_conn_advance(tcp_transport* t, tcp_conn* c, size_t w);

/* tcp_setup.c */
void mlxd_tcp_destroy(mlxd_transport* tt);

/* tcp_tls.c: the TLS variants (mu held). Handshake every connection
 * (inside create). */
int mlxd_tcp_tls_start(tcp_transport* t, mlxd_status* st);
/* Write as much of c's queue as TLS takes: 0, an errno, or -2 (TLS error,
 * c->tls_why says why). */
int mlxd_tcp_tls_write(tcp_transport* t, tcp_conn* c);
/* As recv(MSG_DONTWAIT): > 0, 0 at end of stream, -1 with errno (EAGAIN:
 * would block; EPROTO: TLS error, c->tls_why says why). */
ssize_t mlxd_tcp_tls_recv(tcp_conn* c, void* buf, size_t n);

#endif

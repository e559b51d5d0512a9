/* The launcher as the job's all-gather (contract C1, launch.h): every rank
 * connects once, proves it holds the job token and posts its address
 * records; once all n ranks did, each gets every rank's records, and the
 * launcher proves it holds the token too. The protocol is in
 * src/net/rendezvous_wire.h.
 *
 * One thread, one epoll loop over the listening socket and every connection:
 * ranks arrive in any order, a slow or hostile connection holds only its own
 * slot (at most SLOTS_SPARE of them beyond the ranks, each dropped after
 * HELLO_S without a complete hello), nothing blocks. What an event costs does
 * not grow with the job: a free slot comes off a stack, a connection's rank is
 * its hello's, the slots' deadlines are looked at every SCAN_S, so the
 * all-gather of N ranks costs O(N) in the launcher besides the N replies of N
 * records each. Bounded: after
 * timeout_s the missing ranks are named and the connected ones told to fail;
 * replies get FLUSH_S to leave.
 *
 * Rounds: once every rank has the result (launch_rdv_done), the server keeps
 * serving until launch_rdv_stop, for ranks that initialise again after
 * clear_backends: each further round is one more all-gather of every rank,
 * bounded by timeout_s from its first rank's arrival. After a failed round,
 * a rank that still arrives is told the reason at once. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"
#include "net/net.h"
#include "security/secret.h"
#include "util/env.h"

#define SLOTS_SPARE 32 /* connections beyond n that may be in their hello at once */
#define HELLO_S 10.0   /* a connection's bound to deliver its hello and records */
#define FLUSH_S 1.0    /* the replies' bound to leave once decided */
#define HOST_CHARS 64
#define SCAN_S 0.1 /* how often the slots' deadlines are looked at */
#define EV_WAKE UINT32_MAX
#define EV_LISTEN (UINT32_MAX - 1)

enum { C_FREE, C_HELLO, C_RECS, C_WAIT, C_SEND };

typedef struct conn {
  int state;
  int fd;
  char peer[80];
  double deadline; /* of the hello */
  unsigned char snonce[MLXD_RDV_NONCE_BYTES];
  unsigned char hdr[MLXD_RDV_HELLO_BYTES];
  size_t got;
  mlxd_rdv_hello h;
  unsigned char* recs; /* h.rec_bytes */
  unsigned char reply[MLXD_RDV_REPLY_BYTES];
  const unsigned char* payload; /* after reply */
  size_t payload_len, sent;
  char reason[MLXD_RDV_MAX_REASON + 1]; /* a failure's payload */
} conn;

struct launch_rdv {
  int n;
  unsigned char key[MLXD_RDV_KEY_BYTES];
  double timeout_s;
  int lfd;
  int wake[2];
  pthread_t thread;
  bool started;
  atomic_bool stop;
  atomic_bool done;
  atomic_bool gave_up;      /* the first round failed and its ranks were told (launch_rdv_failed) */
  char (*host)[HOST_CHARS]; /* per rank, for messages */
  int nslots;
  conn* slots;
  int* free_slots; /* a stack of the free slots' indexes */
  int n_free;
  int epfd;       /* the wake pipe, the listener, every connection (data.u32: its slot) */
  bool listening; /* the listener's events are on */
  int* by_rank;   /* slot of the rank's authenticated connection, -1 */
  int arrived;
  uint32_t rec_bytes; /* the first arrived rank's: every rank must post as many */
  unsigned char* all; /* n * rec_bytes once all arrived */
  bool decided;       /* replies (ok or failed) are queued */
  double flush_deadline;
  int round;       /* 1: the job's start; 2, 3...: a re-initialisation (init after
                    * clear_backends) rendezvouses again */
  double deadline; /* of this round: start + timeout_s, later rounds from their first arrival */
  bool failed;     /* a round failed: every later rank gets fail_reason */
  char fail_reason[MLXD_RDV_MAX_REASON];
  double full_msg_at; /* the last "too many connections" message (one a second at most) */
  bool reply_done;    /* a reply completed since the loop last looked (replies_out) */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* c's events in the epoll set: what its state waits for. */
static void conn_events(launch_rdv* r, conn* c) {
  if (c->fd < 0) return;
  struct epoll_event e = {.events = EPOLLIN, .data.u32 = (uint32_t)(c - r->slots)};
  if (c->state == C_SEND && c->sent < MLXD_RDV_REPLY_BYTES + c->payload_len) e.events |= EPOLLOUT;
  epoll_ctl(r->epfd, EPOLL_CTL_MOD, c->fd, &e);
}

/* Close c's socket (out of the epoll set first: a forked child may hold a copy until its exec). */
static void conn_close_fd(launch_rdv* r, conn* c) {
  if (c->fd < 0) return;
  epoll_ctl(r->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  c->fd = -1;
}

static void conn_close(launch_rdv* r, conn* c) {
  bool was_free = c->state == C_FREE;
  conn_close_fd(r, c);
  free(c->recs);
  memset(c, 0, sizeof *c);
  c->fd = -1;
  c->state = C_FREE;
  if (!was_free) r->free_slots[r->n_free++] = (int)(c - r->slots);
}

/* The listener's events on or off (off while a round is decided). */
static void set_listening(launch_rdv* r, bool on) {
  if (r->listening == on) return;
  struct epoll_event e = {.events = on ? EPOLLIN : 0, .data.u32 = EV_LISTEN};
  epoll_ctl(r->epfd, EPOLL_CTL_MOD, r->lfd, &e);
  r->listening = on;
}

/* Whether c is the connection its rank is counted by (its hello decoded: rank < n). */
static bool counted(const launch_rdv* r, const conn* c) {
  return (c->state == C_WAIT || c->state == C_SEND) && r->by_rank[c->h.rank] == c - r->slots;
}

static void drop(launch_rdv* r, conn* c, const char* why) {
  launch_msg("rendezvous: dropped the connection from %s: %s", c->peer, why);
  if (counted(r, c)) r->by_rank[c->h.rank] = -1;
  conn_close(r, c);
}

/* Queue a reply on c (its records or a reason) and switch it to sending. */
static int queue_reply(launch_rdv* r, conn* c, unsigned status, const void* payload, size_t len) {
  if (mlxd_rdv_reply_encode(c->reply, r->key, c->snonce, c->h.nonce, status, payload,
                            (uint32_t)len) != 0)
    return -1;
  c->payload = payload;
  c->payload_len = len;
  c->sent = 0;
  c->state = C_SEND;
  conn_events(r, c);
  return 0;
}

static void refuse(launch_rdv* r, conn* c, unsigned status, const char* why) {
  snprintf(c->reason, sizeof c->reason, "%s", why);
  if (queue_reply(r, c, status, c->reason, strlen(c->reason)) != 0) conn_close(r, c);
  /* not counted: it is no rank of this job (or a second connection of one) */
  c->deadline = now_s() + FLUSH_S;
}

/* Fail the job: every connected rank gets reason, r->decided. */
static void fail_all(launch_rdv* r, const char* reason) {
  r->decided = true;
  if (!r->failed) snprintf(r->fail_reason, sizeof r->fail_reason, "%s", reason);
  r->failed = true; /* gave_up follows once the replies are out (serve) */
  r->flush_deadline = now_s() + FLUSH_S;
  for (int i = 0; i < r->n; i++) {
    int s = r->by_rank[i];
    if (s < 0) continue;
    conn* c = &r->slots[s];
    snprintf(c->reason, sizeof c->reason, "%s", reason);
    if (queue_reply(r, c, MLXD_RDV_FAILED, c->reason, strlen(c->reason)) != 0)
      drop(r, c, "libcrypto failed");
  }
}

static void all_arrived(launch_rdv* r) {
  size_t rb = r->rec_bytes;
  r->all = malloc((size_t)r->n * rb);
  if (!r->all) {
    fail_all(r, "the launcher ran out of memory");
    return;
  }
  for (int i = 0; i < r->n; i++) memcpy(r->all + (size_t)i * rb, r->slots[r->by_rank[i]].recs, rb);
  r->decided = true;
  r->flush_deadline = now_s() + FLUSH_S + r->n * 0.01;
  for (int i = 0; i < r->n; i++) {
    conn* c = &r->slots[r->by_rank[i]];
    if (queue_reply(r, c, MLXD_RDV_OK, r->all, (size_t)r->n * rb) != 0)
      drop(r, c, "libcrypto failed");
  }
}

/* A complete hello with its records on c: authenticate, then count it. */
static void hello_complete(launch_rdv* r, conn* c) {
  if (!mlxd_rdv_hello_verify(c->hdr, &c->h, r->key, c->snonce, c->recs)) {
    launch_msg(
        "rendezvous: refused the connection from %s (claiming rank %u): its hello does not "
        "authenticate with this job's token (another job's rank, or not a rank)",
        c->peer, (unsigned)c->h.rank);
    refuse(r, c, MLXD_RDV_REFUSED, "the hello does not authenticate with the launcher's job token");
    return;
  }
  int rank = (int)c->h.rank;
  char why[MLXD_RDV_MAX_REASON];
  if (r->failed) { /* a rank late for a rendezvous that failed: tell it why */
    launch_msg("rendezvous: rank %d (from %s) arrived after the rendezvous failed", rank, c->peer);
    refuse(r, c, MLXD_RDV_FAILED, r->fail_reason);
    return;
  }
  if (r->by_rank[rank] >= 0) {
    snprintf(why, sizeof why, "rank %d connected twice (from %s and %s)", rank,
             r->slots[r->by_rank[rank]].peer, c->peer);
    launch_msg("rendezvous: %s; refused the second", why);
    refuse(r, c, MLXD_RDV_FAILED, why);
    return;
  }
  r->by_rank[rank] = (int)(c - r->slots);
  c->state = C_WAIT;
  if (r->arrived == 0) r->rec_bytes = c->h.rec_bytes;
  if (r->arrived == 0 && r->round > 1) r->deadline = now_s() + r->timeout_s;
  r->arrived++;
  if (c->h.rec_bytes != r->rec_bytes) {
    int first = -1;
    for (int i = 0; i < r->n && first < 0; i++)
      if (r->by_rank[i] >= 0 && i != rank) first = i;
    snprintf(why, sizeof why,
             "rank %d posted %u bytes of address records, rank %d %u (is "
             "MLXDIST_RING_CONNECTIONS the same for every rank?)",
             rank, (unsigned)c->h.rec_bytes, first, (unsigned)r->rec_bytes);
    launch_msg("rendezvous failed: %s", why);
    fail_all(r, why);
    return;
  }
  if (r->arrived == r->n) all_arrived(r);
}

static void conn_read(launch_rdv* r, conn* c) {
  for (;;) {
    unsigned char* dst;
    size_t want;
    if (c->state == C_HELLO) {
      dst = c->hdr + c->got;
      want = MLXD_RDV_HELLO_BYTES - c->got;
    } else if (c->state == C_RECS) {
      dst = c->recs + c->got;
      want = c->h.rec_bytes - c->got;
    } else {
      /* waiting or sending: a rank says nothing more; EOF or data means it is gone or odd */
      unsigned char b;
      ssize_t k = recv(c->fd, &b, 1, MSG_DONTWAIT);
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      if (!counted(r, c)) {
        conn_close(r, c); /* a refused connection: its message was printed */
      } else if (c->state == C_SEND && c->sent == MLXD_RDV_REPLY_BYTES + c->payload_len) {
        conn_close_fd(r, c); /* the rank has its reply and left: keep the slot's state */
      } else {
        char why[160];
        snprintf(why, sizeof why,
                 k > 0 ? "rank %u sent more than its hello and records"
                       : "rank %u closed its connection before the rendezvous ended",
                 (unsigned)c->h.rank);
        drop(r, c, why);
        if (!r->decided) r->arrived--;
      }
      return;
    }
    ssize_t k = recv(c->fd, dst, want, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (k <= 0) {
      drop(r, c,
           k == 0 ? "it closed the connection before its hello was complete"
                  : "receive failed before its hello was complete");
      return;
    }
    c->got += (size_t)k;
    if (c->state == C_HELLO && c->got == MLXD_RDV_HELLO_BYTES) {
      char why[200];
      if (mlxd_rdv_hello_decode(c->hdr, r->n, &c->h, why, sizeof why) != 0) {
        char msg[260];
        snprintf(msg, sizeof msg, "malformed hello (%s)", why);
        drop(r, c, msg);
        return;
      }
      c->recs = malloc(c->h.rec_bytes);
      if (!c->recs) {
        drop(r, c, "out of memory");
        return;
      }
      c->state = C_RECS;
      c->got = 0;
    } else if (c->state == C_RECS && c->got == c->h.rec_bytes) {
      hello_complete(r, c);
      return;
    }
  }
}

static void conn_write(launch_rdv* r, conn* c) {
  size_t total = MLXD_RDV_REPLY_BYTES + c->payload_len;
  while (c->sent < total) {
    const unsigned char* p;
    size_t len;
    if (c->sent < MLXD_RDV_REPLY_BYTES) {
      p = c->reply + c->sent;
      len = MLXD_RDV_REPLY_BYTES - c->sent;
    } else {
      p = c->payload + (c->sent - MLXD_RDV_REPLY_BYTES);
      len = total - c->sent;
    }
    ssize_t k = send(c->fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (k <= 0) {
      drop(r, c, "sending the reply failed");
      return;
    }
    c->sent += (size_t)k;
  }
  /* all sent: a counted rank stays until its rank has it (it closes); others go now */
  r->reply_done = true;
  if (!counted(r, c)) {
    conn_close(r, c);
  } else {
    shutdown(c->fd, SHUT_WR);
    conn_events(r, c);
  }
}

static void on_accept(launch_rdv* r) {
  for (;;) {
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    int fd = accept4(r->lfd, (struct sockaddr*)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    char peer[80];
    mlxd_net_format_addr((struct sockaddr*)&sa, peer, sizeof peer);
    conn* c = r->n_free > 0 ? &r->slots[r->free_slots[--r->n_free]] : NULL;
    if (!c) {
      double t = now_s();
      if (t - r->full_msg_at >= 1.0)
        launch_msg("rendezvous: refused a connection from %s: too many connections in their hello",
                   peer);
      r->full_msg_at = t;
      close(fd);
      continue;
    }
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    c->state = C_HELLO;
    struct epoll_event e = {.events = EPOLLIN, .data.u32 = (uint32_t)(c - r->slots)};
    if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, fd, &e) != 0) {
      c->fd = -1; /* not in the set: closed here */
      close(fd);
      drop(r, c, "cannot watch it (epoll_ctl)");
      continue;
    }
    c->got = 0;
    c->deadline = now_s() + HELLO_S;
    unsigned char ch[MLXD_RDV_CHALLENGE_BYTES];
    mlxd_status st = {0};
    if (mlxd_random_bytes(c->snonce, sizeof c->snonce, &st) != 0) {
      drop(r, c, "no random bytes for its challenge");
      continue;
    }
    mlxd_rdv_challenge_encode(ch, c->snonce);
    /* a fresh socket's send buffer takes 24 bytes at once */
    if (send(fd, ch, sizeof ch, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof ch)
      drop(r, c, "cannot send the challenge");
  }
}

/* The missing ranks, as one reason and one message per rank. */
static void give_up(launch_rdv* r) {
  char reason[MLXD_RDV_MAX_REASON];
  size_t o = 0;
  int missing = 0;
  for (int i = 0; i < r->n; i++) {
    if (r->by_rank[i] >= 0) continue;
    char one[160];
    if (r->host[i][0])
      snprintf(one, sizeof one, "rank %d (host %s)", i, r->host[i]);
    else
      snprintf(one, sizeof one, "rank %d", i);
    if (r->round > 1)
      launch_msg(
          "%s did not reach the rendezvous of its re-initialisation (round %d) within %g s "
          "of the first rank's",
          one, r->round, r->timeout_s);
    else
      launch_msg("%s did not reach the rendezvous within %g s", one, r->timeout_s);
    if (missing < 8 && o < sizeof reason - 1)
      o += (size_t)snprintf(reason + o, sizeof reason - o, "%s%s", missing ? ", " : "", one);
    missing++;
  }
  if (o >= sizeof reason) o = sizeof reason - 1;
  if (missing > 8) snprintf(reason + o, sizeof reason - o, " and %d more ranks", missing - 8);
  o = strlen(reason);
  snprintf(reason + o, sizeof reason - o, " did not reach the rendezvous within %g s",
           r->timeout_s);
  fail_all(r, reason);
}

/* A round ended (all replies out, or their bound passed): forget its ranks and
 * serve the next (a re-initialisation; after a failure, late ranks get the reason). */
static void next_round(launch_rdv* r) {
  for (int i = 0; i < r->n; i++) {
    if (r->by_rank[i] >= 0) conn_close(r, &r->slots[r->by_rank[i]]);
    r->by_rank[i] = -1;
  }
  free(r->all);
  r->all = NULL;
  r->arrived = 0;
  r->rec_bytes = 0;
  r->decided = false;
  r->round++;
  r->deadline = 1e300; /* until its first rank arrives */
  set_listening(r, true);
}

/* Whether every counted rank's reply is out (all: and every rank is counted). */
static bool replies_out(const launch_rdv* r, bool all) {
  for (int i = 0; i < r->n; i++) {
    int s = r->by_rank[i];
    if (s < 0) {
      if (all) return false;
      continue;
    }
    const conn* c = &r->slots[s];
    if (c->state != C_SEND || c->sent < MLXD_RDV_REPLY_BYTES + c->payload_len) return false;
  }
  return true;
}

/* The slots' deadlines (every SCAN_S): hellos that took too long, refused strangers' replies
 * that had their chance. Returns the earliest deadline still ahead (at most limit). */
static double scan_slots(launch_rdv* r, double t, double limit) {
  double next = limit;
  for (int i = 0; i < r->nslots; i++) {
    conn* c = &r->slots[i];
    if ((c->state == C_HELLO || c->state == C_RECS) && t >= c->deadline) {
      drop(r, c, "no complete hello within the bound");
    } else if (c->state == C_SEND && !r->decided && t >= c->deadline) {
      conn_close(r, c); /* a refused stranger's reply had its chance */
    }
    if (c->state != C_FREE && c->state != C_WAIT && c->deadline < next) next = c->deadline;
  }
  return next;
}

static void* serve(void* arg) {
  launch_rdv* r = arg;
  r->round = 1;
  r->deadline = now_s() + r->timeout_s;
  struct epoll_event ev[64];
  double scan_at = 0, slot_next = 1e300;
  while (!atomic_load(&r->stop)) {
    double t = now_s();
    if (!r->decided && t >= r->deadline) give_up(r);
    if (r->decided) {
      set_listening(r, false);
      /* looked at when a reply completed or at a scan: not once per event */
      bool out = (r->reply_done || t >= scan_at) && replies_out(r, r->all != NULL);
      r->reply_done = false;
      if (out || t >= r->flush_deadline) {
        if (r->all && out) atomic_store(&r->done, true);
        /* only now: a caller that stops the server on failure must not cut the reasons off */
        else if (r->failed && !atomic_load(&r->done))
          atomic_store(&r->gave_up, true);
        next_round(r); /* keep serving: a rank may init again after clear_backends */
        continue;
      }
    }
    if (t >= scan_at || t >= slot_next) {
      slot_next = scan_slots(r, t, 1e300);
      scan_at = t + SCAN_S;
    }
    double next = r->decided ? r->flush_deadline : r->deadline;
    if (slot_next < next) next = slot_next;
    if (scan_at < next) next = scan_at;
    double wait = next - now_s();
    int ms = wait <= 0 ? 0 : wait > 1.0 ? 1000 : (int)(wait * 1000) + 1;
    int k = epoll_wait(r->epfd, ev, (int)(sizeof ev / sizeof ev[0]), ms);
    if (k < 0 && errno != EINTR) {
      launch_msg("rendezvous: epoll_wait failed: %s", strerror(errno));
      break;
    }
    bool stop = false;
    for (int j = 0; j < k; j++) {
      uint32_t id = ev[j].data.u32;
      if (id == EV_WAKE) {
        stop = true;
      } else if (id == EV_LISTEN) {
        if (!r->decided) on_accept(r);
      } else if (id < (uint32_t)r->nslots) {
        conn* c = &r->slots[id];
        uint32_t re = ev[j].events;
        if (c->state == C_FREE || c->fd < 0) continue; /* closed by an earlier event */
        if (re & EPOLLOUT) conn_write(r, c);
        if (c->state != C_FREE && c->fd >= 0 && (re & (EPOLLIN | EPOLLHUP | EPOLLERR)))
          conn_read(r, c);
      }
    }
    if (stop) break; /* stop */
  }
  return NULL;
}

static int bind_listen(int fd, struct sockaddr_storage* sa, socklen_t len, unsigned port) {
  if (sa->ss_family == AF_INET)
    ((struct sockaddr_in*)(void*)sa)->sin_port = htons((uint16_t)port);
  else
    ((struct sockaddr_in6*)(void*)sa)->sin6_port = htons((uint16_t)port);
  if (bind(fd, (struct sockaddr*)sa, len) != 0) return -1;
  return listen(fd, 128);
}

static int open_listener(const char* bind_ip, const char* port_range, char* addr_out,
                         size_t addr_len) {
  char spec[128], why[256];
  snprintf(spec, sizeof spec, strchr(bind_ip, ':') && bind_ip[0] != '[' ? "[%s]:0" : "%s:0",
           bind_ip);
  mlxd_net_addr a;
  if (mlxd_net_parse_addr(spec, true, &a, why, sizeof why) != 0 || a.sa.ss_family == AF_UNSPEC) {
    launch_msg("rendezvous: '%s' is not an IP address to listen on (%s)", bind_ip,
               a.sa.ss_family == AF_UNSPEC ? "expected an IPv4 or IPv6 literal" : why);
    return -1;
  }
  const struct sockaddr_in* in4 = (const void*)&a.sa;
  const struct sockaddr_in6* in6 = (const void*)&a.sa;
  if ((a.sa.ss_family == AF_INET && in4->sin_addr.s_addr == htonl(INADDR_ANY)) ||
      (a.sa.ss_family == AF_INET6 && IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr))) {
    launch_msg(
        "rendezvous: refusing to listen on the wildcard address %s (name the launcher's own "
        "IP address)",
        bind_ip);
    return -1;
  }
  unsigned lo = 0, hi = 0;
  if (port_range && *port_range &&
      mlxd_rdv_parse_port_range(port_range, &lo, &hi, why, sizeof why) != 0) {
    launch_msg("rendezvous: --port-range %s", why);
    return -1;
  }
  int fd = socket(a.sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    launch_msg("rendezvous: cannot create a socket: %s", strerror(errno));
    return -1;
  }
  int ok = -1, err = 0;
  if (!lo) {
    ok = bind_listen(fd, &a.sa, a.len, 0);
    err = errno;
  } else {
    for (unsigned p = lo; p <= hi && ok != 0; p++) {
      ok = bind_listen(fd, &a.sa, a.len, p);
      err = errno;
      if (ok != 0 && err != EADDRINUSE && err != EACCES) break;
    }
  }
  if (ok != 0) {
    if (lo)
      launch_msg("rendezvous: no free port to listen on in --port-range %u-%u on %s (%s)", lo, hi,
                 bind_ip, strerror(err));
    else
      launch_msg("rendezvous: cannot listen on %s: %s", bind_ip, strerror(err));
    close(fd);
    return -1;
  }
  socklen_t len = sizeof a.sa;
  getsockname(fd, (struct sockaddr*)&a.sa, &len);
  mlxd_net_format_addr((struct sockaddr*)&a.sa, addr_out, addr_len);
  return fd;
}

launch_rdv* launch_rdv_start(int n, const char* token_hex, const char* bind_ip,
                             const char* port_range, double timeout_s, const char* const* rank_host,
                             char* addr_out, size_t addr_len) {
  if (n < 1 || n > MLXD_RDV_MAX_RANKS || !(timeout_s > 0) || !bind_ip || !addr_out) {
    launch_msg("rendezvous: bad arguments (n=%d, timeout %g s)", n, timeout_s);
    return NULL;
  }
  launch_rdv* r = calloc(1, sizeof *r);
  if (!r) {
    launch_msg("rendezvous: out of memory");
    return NULL;
  }
  r->lfd = r->wake[0] = r->wake[1] = r->epfd = -1;
  r->n = n;
  r->timeout_s = timeout_s;
  if (!token_hex || mlxd_hs_token_parse(token_hex, r->key) != 0) {
    launch_msg("rendezvous: the job token is not %d hex digits", 2 * MLXD_RDV_KEY_BYTES);
    goto fail;
  }
  r->nslots = n + SLOTS_SPARE;
  r->slots = calloc((size_t)r->nslots, sizeof *r->slots);
  r->free_slots = malloc(sizeof(int) * (size_t)r->nslots);
  r->by_rank = malloc(sizeof(int) * (size_t)n);
  r->host = calloc((size_t)n, sizeof *r->host);
  if (!r->slots || !r->free_slots || !r->by_rank || !r->host) {
    launch_msg("rendezvous: out of memory for %d ranks", n);
    goto fail;
  }
  for (int i = 0; i < r->nslots; i++) {
    r->slots[i].fd = -1;
    r->free_slots[i] = r->nslots - 1 - i; /* slot 0 first */
  }
  r->n_free = r->nslots;
  for (int i = 0; i < n; i++) {
    r->by_rank[i] = -1;
    if (rank_host && rank_host[i]) snprintf(r->host[i], HOST_CHARS, "%s", rank_host[i]);
  }
  if ((r->lfd = open_listener(bind_ip, port_range, addr_out, addr_len)) < 0) goto fail;
  if (pipe2(r->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    launch_msg("rendezvous: pipe: %s", strerror(errno));
    goto fail;
  }
  struct epoll_event we = {.events = EPOLLIN, .data.u32 = EV_WAKE};
  struct epoll_event le = {.events = EPOLLIN, .data.u32 = EV_LISTEN};
  if ((r->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
      epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->wake[0], &we) != 0 ||
      epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->lfd, &le) != 0) {
    launch_msg("rendezvous: epoll: %s", strerror(errno));
    goto fail;
  }
  r->listening = true;
  /* The serving thread is the library's kind (util/env.h): it reads the
   * environment (the tunables of the handshake it runs) from the snapshot,
   * filled here, on the launcher's thread, which may unsetenv afterwards. */
  mlxd_env_refresh();
  if (mlxd_thread_start(&r->thread, "launch-rdv", serve, r) != 0) {
    launch_msg("rendezvous: cannot start its thread");
    goto fail;
  }
  r->started = true;
  return r;
fail:
  launch_rdv_stop(r);
  return NULL;
}

bool launch_rdv_done(const launch_rdv* r) { return r && atomic_load(&r->done); }

bool launch_rdv_failed(const launch_rdv* r) { return r && atomic_load(&r->gave_up); }

void launch_rdv_stop(launch_rdv* r) {
  if (!r) return;
  if (r->started) {
    atomic_store(&r->stop, true);
    if (write(r->wake[1], "x", 1) < 0) { /* the loop also checks stop at least every second */
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 1;
    if (pthread_timedjoin_np(r->thread, NULL, &until) != 0) {
      /* never seen: the loop never blocks for more than a second; leak rather than race */
      pthread_detach(r->thread);
      launch_msg("rendezvous: its thread did not stop within 1 s");
      return;
    }
  }
  if (r->slots)
    for (int i = 0; i < r->nslots; i++)
      if (r->slots[i].state != C_FREE || r->slots[i].fd >= 0) conn_close(r, &r->slots[i]);
  if (r->lfd >= 0) close(r->lfd);
  if (r->wake[0] >= 0) close(r->wake[0]);
  if (r->wake[1] >= 0) close(r->wake[1]);
  if (r->epfd >= 0) close(r->epfd);
  mlxd_wipe(r->key, sizeof r->key);
  free(r->slots);
  free(r->free_slots);
  free(r->by_rank);
  free(r->host);
  free(r->all);
  free(r);
}

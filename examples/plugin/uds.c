/* libmlxdist-uds.so: an example backend plugin for mlxdist, over Unix-domain
 * sockets between the processes of one host. It is written against the
 * installed, frozen ABI header <mlx/c/plugin/plugin_v3.h> only and does not
 * link libmlxdist (docs/plugin-abi.md walks through it).
 *
 * Configuration (its own launch variables):
 *   MLX_RANK        this process's rank, 0 <= MLX_RANK < MLX_WORLD_SIZE
 *   MLX_WORLD_SIZE  the number of ranks
 *   MLX_UDS_DIR     a directory the ranks share, one per job: rank r listens
 *                   on MLX_UDS_DIR/uds-<r>.sock while the group starts
 * Every rank connects to each lower rank, so the ranks form a full mesh of
 * stream sockets. Each message is a header (magic, op, group, sequence
 * number, byte count) and its bytes; the receiver checks the header against
 * the op it runs, so ranks that call different ops fail with a message
 * saying so instead of mixing data.
 *
 * Algorithms (simple on purpose): all_reduce and all_gather collect every
 * rank's buffer on rank 0, which reduces or concatenates and sends the
 * result back; reduce_scatter is an all_reduce of which each rank keeps its
 * block; send/recv use the pair's socket. A rank that writes also reads what
 * the peer is writing to it meanwhile (into an inbox), so two ranks that send
 * to each other at once do not wait on each other's full socket buffers.
 *
 * Threads: one op runs at a time per group tree (a mutex), so ops called
 * from several threads at once are serialised; ops issued in different orders
 * on two ranks fail with a clear error (or time out), they never mix. Every
 * wait is bounded by the host's timeout (MLXDIST_TIMEOUT). After a failure
 * the byte streams are out of step, so the group fails every later op. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <mlx/c/plugin/plugin_v3.h>

#define EXPORT __attribute__((visibility("default")))
#define MAGIC 0x5344554du /* "MUDS" */
#define MAX_RANKS 256

enum { OP_HELLO, OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_SEND, OP_SPLIT };
static const char* const k_op_name[] = {"hello",          "all_reduce", "all_gather",
                                        "reduce_scatter", "send/recv",  "split"};

typedef struct hdr {
  uint32_t magic, op, group, pad;
  uint64_t seq, nbytes;
} hdr;

/* One peer of the mesh: its socket, and what it sent ahead of the op that wants it. */
typedef struct peer {
  int fd;  /* -1 for this rank */
  int eof; /* it closed its end (seen while reading ahead) */
  char* inbox;
  size_t len, off;
} peer;

/* What every group split from one created instance shares: the sockets. */
typedef struct mesh {
  pthread_mutex_t mu; /* one op at a time on these sockets */
  int size;           /* ranks of the created instance */
  peer* p;            /* p[r]: rank r of the created instance */
  int refs;           /* groups alive (under mu) */
  int failed;
} mesh;

typedef struct uds {
  mlxdist_v3_backend base; /* first: the core sees only this */
  mesh* m;
  int* world; /* world[r]: rank r of this group in the mesh */
  uint32_t gid;
} uds;

static const mlxdist_v3_host* g_host;

static int fail(mlxdist_v3_status* st, int32_t code, int peer, int err, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = snprintf(st->msg, sizeof st->msg, "[uds] ");
  vsnprintf(st->msg + n, sizeof st->msg - (size_t)n, fmt, ap);
  va_end(ap);
  st->code = code;
  st->has_peer = peer >= 0;
  st->peer = peer >= 0 ? peer : 0;
  st->sys_errno = err;
  return code;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wait for ev on fd until the deadline: 1 ready, 0 out of time, -1 error. */
static int wait_fd(int fd, short ev, double deadline, short* got) {
  for (;;) {
    double left = deadline - now_s();
    if (left <= 0) return 0;
    struct pollfd p = {fd, ev, 0};
    int rc = poll(&p, 1, (int)(left * 1000) + 1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return -1;
    if (rc == 0) continue; /* checked against the deadline above */
    *got = p.revents;
    return 1;
  }
}

/* ---- moving bytes ---- */

/* Read what peer q has sent so far (without waiting) into its inbox. */
static int drain(peer* q) {
  char buf[65536];
  ssize_t n = recv(q->fd, buf, sizeof buf, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  if (n <= 0) q->eof = 1; /* closed or failed: the op that reads it reports it */
  if (n <= 0) return n == 0 ? -2 : -1;
  if (q->off == q->len) q->off = q->len = 0;
  char* p = realloc(q->inbox, q->len + (size_t)n);
  if (!p) return -3;
  memcpy(p + q->len, buf, (size_t)n);
  q->inbox = p;
  q->len += (size_t)n;
  return 0;
}

/* A failed transfer: the mesh is out of step from now on. */
static int io_fail(uds* u, int peer, int rc, double timeout, const char* what,
                   mlxdist_v3_status* st) {
  u->m->failed = 1;
  if (rc == 0)
    return fail(st, MLXDIST_V3_ETIMEDOUT, peer, 0,
                "%s: rank %d did not respond within %.0f s (MLXDIST_TIMEOUT)", what, peer, timeout);
  if (rc == -2)
    return fail(st, MLXDIST_V3_EREMOTE, peer, 0, "%s: rank %d closed the connection", what, peer);
  if (rc == -3) return fail(st, MLXDIST_V3_ENOMEM, peer, 0, "%s: out of memory", what);
  return fail(st, MLXDIST_V3_EREMOTE, peer, errno, "%s: the socket to rank %d failed: %s", what,
              peer, strerror(errno));
}

/* Write n bytes to group rank r. While it waits, it reads ahead whatever any
 * peer writes to this rank, so that ranks sending to each other in a cycle
 * all make progress (a peer that closed is found by the op that reads it). */
static int put(uds* u, int r, const void* buf, size_t n, const char* what, mlxdist_v3_status* st) {
  mesh* m = u->m;
  int w = u->world[r];
  double t = g_host->timeout_s(), deadline = now_s() + t;
  const char* p = buf;
  struct pollfd pf[MAX_RANKS];
  while (n > 0) {
    double left = deadline - now_s();
    if (left <= 0) return io_fail(u, r, 0, t, what, st);
    for (int q = 0; q < m->size; q++) {
      int on = m->p[q].fd >= 0 && (q == w || !m->p[q].eof);
      pf[q] = (struct pollfd){on ? m->p[q].fd : -1, (short)(q == w ? POLLIN | POLLOUT : POLLIN), 0};
    }
    int rc = poll(pf, (nfds_t)m->size, (int)(left * 1000) + 1);
    if (rc < 0 && errno != EINTR) return io_fail(u, r, -1, t, what, st);
    for (int q = 0; rc > 0 && q < m->size; q++) {
      if (!(pf[q].revents & (POLLIN | POLLHUP | POLLERR)) || (q != w && m->p[q].eof)) continue;
      int d = drain(&m->p[q]);
      if (d < 0 && (q == w || d == -3)) return io_fail(u, r, d, t, what, st);
    }
    if (rc > 0 && (pf[w].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t k = send(m->p[w].fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return io_fail(u, r, errno == EPIPE || errno == ECONNRESET ? -2 : -1, t, what, st);
      if (k > 0) p += k, n -= (size_t)k;
    }
  }
  return 0;
}

/* Read n bytes from group rank r: its inbox first, then its socket. */
static int take(uds* u, int r, void* buf, size_t n, const char* what, mlxdist_v3_status* st) {
  peer* q = &u->m->p[u->world[r]];
  double t = g_host->timeout_s(), deadline = now_s() + t;
  char* p = buf;
  size_t k0 = q->len - q->off < n ? q->len - q->off : n;
  if (k0) memcpy(p, q->inbox + q->off, k0);
  q->off += k0;
  if (q->off == q->len) free(q->inbox), q->inbox = NULL, q->off = q->len = 0;
  p += k0, n -= k0;
  while (n > 0) {
    short got = 0;
    int rc = q->eof ? -2 : wait_fd(q->fd, POLLIN, deadline, &got);
    if (rc <= 0) return io_fail(u, r, rc, t, what, st);
    ssize_t k = recv(q->fd, p, n, MSG_DONTWAIT);
    if (k == 0) return io_fail(u, r, -2, t, what, st);
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return io_fail(u, r, -1, t, what, st);
    if (k > 0) p += k, n -= (size_t)k;
  }
  return 0;
}

/* One message: the header, then the bytes. */
static int put_msg(uds* u, int r, uint32_t op, uint64_t seq, const void* buf, size_t n,
                   const char* what, mlxdist_v3_status* st) {
  hdr h = {MAGIC, op, u->gid, 0, seq, n};
  int rc = put(u, r, &h, sizeof h, what, st);
  return rc ? rc : put(u, r, buf, n, what, st);
}

/* Receive the message the op expects: any other header is an error. */
static int take_msg(uds* u, int r, uint32_t op, uint64_t seq, void* buf, size_t n, const char* what,
                    mlxdist_v3_status* st) {
  hdr h;
  int rc = take(u, r, &h, sizeof h, what, st);
  if (rc) return rc;
  if (h.magic != MAGIC || h.op > OP_SPLIT || h.op == OP_HELLO) {
    u->m->failed = 1;
    return fail(st, MLXDIST_V3_EREMOTE, r, 0, "%s: rank %d sent bytes that are not a message", what,
                r);
  }
  if (h.op != op || h.group != u->gid || h.seq != seq || h.nbytes != n) {
    u->m->failed = 1;
    return fail(st, MLXDIST_V3_EINVAL, r, 0,
                "%s: rank %d sent %s #%llu of %llu bytes (group %u) where this rank expected "
                "%s #%llu of %zu bytes (group %u): the ranks' calls do not match",
                what, r, k_op_name[h.op], (unsigned long long)h.seq, (unsigned long long)h.nbytes,
                h.group, k_op_name[op], (unsigned long long)seq, n, u->gid);
  }
  return take(u, r, buf, n, what, st);
}

/* ---- the ops ---- */

/* Lock the mesh; fail at once if an earlier op left it out of step. */
static int enter(uds* u, const char* what, mlxdist_v3_status* st) {
  pthread_mutex_lock(&u->m->mu);
  if (!u->m->failed) return 0;
  pthread_mutex_unlock(&u->m->mu);
  return fail(st, MLXDIST_V3_EABORTED, -1, 0, "%s: the group failed earlier", what);
}

static int32_t leave(uds* u, int32_t rc) {
  pthread_mutex_unlock(&u->m->mu);
  return rc;
}

/* out = OP over ranks of in: rank 0 reduces in rank order and sends it back. */
static int reduce_all(uds* u, uint32_t tag, uint64_t seq, const void* in, void* out, size_t count,
                      mlxdist_v3_dtype dt, mlxdist_v3_op op, const char* what,
                      mlxdist_v3_status* st) {
  size_t nb = count * g_host->dtype_size(dt);
  int size = u->base.size, rc = 0;
  if (u->base.rank != 0) {
    rc = put_msg(u, 0, tag, seq, in, nb, what, st);
    return rc ? rc : take_msg(u, 0, tag, seq, out, nb, what, st);
  }
  void* tmp = malloc(nb ? nb : 1);
  if (!tmp) return fail(st, MLXDIST_V3_ENOMEM, -1, 0, "%s: out of memory (%zu bytes)", what, nb);
  if (out != in) memcpy(out, in, nb);
  for (int r = 1; r < size && rc == 0; r++) {
    rc = take_msg(u, r, tag, seq, tmp, nb, what, st);
    if (rc == 0) g_host->reduce(op, dt, out, tmp, count);
  }
  for (int r = 1; r < size && rc == 0; r++) rc = put_msg(u, r, tag, seq, out, nb, what, st);
  free(tmp);
  return rc;
}

static int32_t u_all_reduce(mlxdist_v3_backend* b, uint64_t seq, const void* in, void* out,
                            size_t count, mlxdist_v3_dtype dt, mlxdist_v3_op op,
                            mlxdist_v3_status* st) {
  uds* u = (uds*)b;
  char what[48];
  snprintf(what, sizeof what, "all_reduce #%llu", (unsigned long long)seq);
  int rc = enter(u, what, st);
  return rc ? rc : leave(u, reduce_all(u, OP_ALL_REDUCE, seq, in, out, count, dt, op, what, st));
}

static int gather_all(uds* u, uint32_t tag, uint64_t seq, const void* in, void* out, size_t nb,
                      const char* what, mlxdist_v3_status* st) {
  int size = u->base.size, rc = 0;
  char* o = out;
  if (u->base.rank != 0) {
    rc = put_msg(u, 0, tag, seq, in, nb, what, st);
    return rc ? rc : take_msg(u, 0, tag, seq, out, nb * (size_t)size, what, st);
  }
  memcpy(o, in, nb);
  for (int r = 1; r < size && rc == 0; r++)
    rc = take_msg(u, r, tag, seq, o + (size_t)r * nb, nb, what, st);
  for (int r = 1; r < size && rc == 0; r++)
    rc = put_msg(u, r, tag, seq, out, nb * (size_t)size, what, st);
  return rc;
}

static int32_t u_all_gather(mlxdist_v3_backend* b, uint64_t seq, const void* in, void* out,
                            size_t nbytes, mlxdist_v3_status* st) {
  uds* u = (uds*)b;
  char what[48];
  snprintf(what, sizeof what, "all_gather #%llu", (unsigned long long)seq);
  int rc = enter(u, what, st);
  return rc ? rc : leave(u, gather_all(u, OP_ALL_GATHER, seq, in, out, nbytes, what, st));
}

static int32_t u_reduce_scatter(mlxdist_v3_backend* b, uint64_t seq, const void* in, void* out,
                                size_t count, mlxdist_v3_dtype dt, mlxdist_v3_op op,
                                mlxdist_v3_status* st) {
  uds* u = (uds*)b;
  char what[48];
  snprintf(what, sizeof what, "reduce_scatter #%llu", (unsigned long long)seq);
  size_t es = g_host->dtype_size(dt), total = count * (size_t)b->size;
  char* all = malloc(total * es + 1);
  if (!all) return fail(st, MLXDIST_V3_ENOMEM, -1, 0, "%s: out of memory", what);
  int rc = enter(u, what, st);
  if (rc == 0)
    rc = leave(u, reduce_all(u, OP_REDUCE_SCATTER, seq, in, all, total, dt, op, what, st));
  if (rc == 0) memcpy(out, all + (size_t)b->rank * count * es, count * es);
  free(all);
  return rc;
}

static int32_t u_send(mlxdist_v3_backend* b, uint64_t seq, const void* buf, size_t nbytes,
                      int32_t dst, mlxdist_v3_status* st) {
  uds* u = (uds*)b;
  char what[64];
  snprintf(what, sizeof what, "send #%llu to rank %d", (unsigned long long)seq, dst);
  int rc = enter(u, what, st);
  return rc ? rc : leave(u, put_msg(u, dst, OP_SEND, seq, buf, nbytes, what, st));
}

static int32_t u_recv(mlxdist_v3_backend* b, uint64_t seq, void* buf, size_t nbytes, int32_t src,
                      mlxdist_v3_status* st) {
  uds* u = (uds*)b;
  char what[64];
  snprintf(what, sizeof what, "recv #%llu from rank %d", (unsigned long long)seq, src);
  int rc = enter(u, what, st);
  return rc ? rc : leave(u, take_msg(u, src, OP_SEND, seq, buf, nbytes, what, st));
}

static void u_destroy(mlxdist_v3_backend* b) {
  uds* u = (uds*)b;
  mesh* m = u->m;
  pthread_mutex_lock(&m->mu);
  int last = --m->refs == 0;
  pthread_mutex_unlock(&m->mu);
  if (last) {
    for (int r = 0; r < m->size; r++) {
      if (m->p[r].fd >= 0) close(m->p[r].fd);
      free(m->p[r].inbox);
    }
    pthread_mutex_destroy(&m->mu);
    free(m->p), free(m);
  }
  free(u->world);
  free(u);
}

static void u_describe(mlxdist_v3_backend* b, char* buf, size_t len) {
  snprintf(buf, len, "Unix-domain sockets, rank %d of %d (example plugin)", b->rank, b->size);
}

static int32_t u_split(mlxdist_v3_backend* b, uint64_t seq, int32_t color, int32_t key,
                       mlxdist_v3_backend** out, mlxdist_v3_status* st);

static const mlxdist_v3_ops k_ops = {
    .struct_size = sizeof(mlxdist_v3_ops),
    .all_reduce = u_all_reduce,
    .all_gather = u_all_gather,
    .reduce_scatter = u_reduce_scatter,
    .send = u_send,
    .recv = u_recv,
    .split = u_split,
    .destroy = u_destroy,
    .describe = u_describe,
    /* the *_ref ops of v3 are optional: without them the core stages copies */
};

static uds* new_group(mesh* m, int rank, int size, uint32_t gid) {
  uds* u = calloc(1, sizeof *u);
  int* world = calloc((size_t)size, sizeof *world);
  if (!u || !world) return free(u), free(world), NULL;
  u->base = (mlxdist_v3_backend){.ops = &k_ops,
                                 .rank = rank,
                                 .size = size,
                                 .device = MLXDIST_V3_DEVICE_CPU};
  u->m = m, u->world = world, u->gid = gid;
  return u;
}

/* Ranks of one color form a group over the same sockets, ordered by (key, rank). */
static int32_t u_split(mlxdist_v3_backend* b, uint64_t seq, int32_t color, int32_t key,
                       mlxdist_v3_backend** out, mlxdist_v3_status* st) {
  uds* u = (uds*)b;
  char what[48];
  snprintf(what, sizeof what, "split #%llu", (unsigned long long)seq);
  int32_t mine[2] = {color, key}, *all = calloc((size_t)b->size, sizeof mine);
  if (!all) return fail(st, MLXDIST_V3_ENOMEM, -1, 0, "%s: out of memory", what);
  int rc = enter(u, what, st);
  if (rc == 0) rc = leave(u, gather_all(u, OP_SPLIT, seq, mine, all, sizeof mine, what, st));
  int n = 0, me = 0;
  for (int r = 0; rc == 0 && r < b->size; r++) {
    if (all[2 * r] != color) continue;
    /* rank r goes after every member with a smaller (key, rank) */
    if (all[2 * r + 1] < key || (all[2 * r + 1] == key && r < b->rank)) me++;
    n++;
  }
  uds* c = rc == 0 ? new_group(u->m, me, n,
                               u->gid * 2654435761u + (uint32_t)seq * 31u + (uint32_t)color + 1u)
                   : NULL;
  if (rc == 0 && !c) rc = fail(st, MLXDIST_V3_ENOMEM, -1, 0, "%s: out of memory", what);
  for (int r = 0; rc == 0 && r < b->size; r++) {
    if (all[2 * r] != color) continue;
    int pos = 0;
    for (int q = 0; q < b->size; q++)
      if (all[2 * q] == color &&
          (all[2 * q + 1] < all[2 * r + 1] || (all[2 * q + 1] == all[2 * r + 1] && q < r)))
        pos++;
    c->world[pos] = u->world[r];
  }
  free(all);
  if (rc) return rc;
  pthread_mutex_lock(&u->m->mu);
  u->m->refs++;
  pthread_mutex_unlock(&u->m->mu);
  *out = &c->base;
  return 0;
}

/* ---- starting: the plugin table ---- */

/* An integer variable in [lo, hi]; EUNAVAIL when unset, EINVAL when malformed. */
static int env_int(const char* name, long lo, long hi, int* v, mlxdist_v3_status* st) {
  const char* s = getenv(name);
  if (!s || !*s)
    return fail(st, MLXDIST_V3_EUNAVAIL, -1, 0,
                "create: %s is not set (the uds backend needs MLX_RANK, MLX_WORLD_SIZE and "
                "MLX_UDS_DIR)",
                name);
  char* end;
  errno = 0;
  long x = strtol(s, &end, 10);
  if (errno || *end || end == s || x < lo || x > hi)
    return fail(st, MLXDIST_V3_EINVAL, -1, 0, "create: %s=%.40s is not an integer in [%ld, %ld]",
                name, s, lo, hi);
  *v = (int)x;
  return 0;
}

static int sock_path(struct sockaddr_un* a, const char* dir, int r, mlxdist_v3_status* st) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  int n = snprintf(a->sun_path, sizeof a->sun_path, "%s/uds-%d.sock", dir, r);
  if (n < 0 || (size_t)n >= sizeof a->sun_path)
    return fail(st, MLXDIST_V3_EINVAL, -1, 0,
                "create: MLX_UDS_DIR=%.200s is too long for a socket path (at most %zu bytes)", dir,
                sizeof a->sun_path - 16);
  return 0;
}

/* Connect every pair: to each lower rank, and accept each higher one. */
static int connect_mesh(mesh* m, int rank, const char* dir, mlxdist_v3_status* st) {
  double t = g_host->timeout_s(), deadline = now_s() + t;
  struct sockaddr_un a;
  int rc = sock_path(&a, dir, rank, st), lis = -1;
  if (rc) return rc;
  unlink(a.sun_path); /* a stale socket of an earlier job */
  lis = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lis < 0 || bind(lis, (struct sockaddr*)&a, sizeof a) || listen(lis, m->size)) {
    rc = fail(st, MLXDIST_V3_ESYS, -1, errno, "create: cannot listen on %s: %s", a.sun_path,
              strerror(errno));
    if (lis >= 0) close(lis);
    return rc;
  }
  for (int r = 0; r < rank && rc == 0; r++) { /* lower ranks: connect, say who we are */
    struct sockaddr_un to;
    sock_path(&to, dir, r, st);
    for (;;) {
      int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd >= 0 && connect(fd, (struct sockaddr*)&to, sizeof to) == 0) {
        m->p[r].fd = fd;
        break;
      }
      if (fd >= 0) close(fd);
      if (now_s() > deadline) {
        rc = fail(st, MLXDIST_V3_ETIMEDOUT, r, errno,
                  "create: rank %d did not listen on %s within %.0f s (is it running with the "
                  "same MLX_UDS_DIR?)",
                  r, to.sun_path, t);
        break;
      }
      nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    hdr h = {MAGIC, OP_HELLO, 0, 0, (uint64_t)rank, (uint64_t)m->size};
    if (rc == 0 && send(m->p[r].fd, &h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h)
      rc = fail(st, MLXDIST_V3_EREMOTE, r, errno, "create: could not greet rank %d", r);
  }
  for (int k = rank + 1; k < m->size && rc == 0; k++) { /* higher ranks: accept, check */
    short got = 0;
    hdr h;
    int w = wait_fd(lis, POLLIN, deadline, &got);
    int fd = w > 0 ? accept(lis, NULL, NULL) : -1;
    if (fd < 0) {
      rc = fail(st, MLXDIST_V3_ETIMEDOUT, -1, errno,
                "create: only %d of the %d higher ranks connected within %.0f s", k - rank - 1,
                m->size - rank - 1, t);
      break;
    }
    w = wait_fd(fd, POLLIN, deadline, &got);
    /* one send of 32 bytes on a local stream socket arrives whole; never wait past it */
    ssize_t n = w > 0 ? recv(fd, &h, sizeof h, MSG_DONTWAIT) : -1;
    if (n != (ssize_t)sizeof h || h.magic != MAGIC || h.op != OP_HELLO ||
        h.nbytes != (uint64_t)m->size || h.seq <= (uint64_t)rank || h.seq >= (uint64_t)m->size ||
        m->p[h.seq].fd >= 0) {
      close(fd);
      rc = fail(st, MLXDIST_V3_EINVAL, -1, 0,
                "create: a process connected to %s without a valid greeting (another job in "
                "the same MLX_UDS_DIR, or a different MLX_WORLD_SIZE?)",
                a.sun_path);
      break;
    }
    m->p[h.seq].fd = fd;
  }
  close(lis);
  unlink(a.sun_path);
  return rc;
}

static int32_t u_create(mlxdist_v3_bootstrap* bs, mlxdist_v3_backend** out, mlxdist_v3_status* st) {
  (void)bs; /* supports_bootstrap is false: the core always passes NULL */
  int size = 0, rank = 0;
  const char* dir = getenv("MLX_UDS_DIR");
  int rc = env_int("MLX_WORLD_SIZE", 1, MAX_RANKS, &size, st);
  if (rc == 0) rc = env_int("MLX_RANK", 0, size - 1, &rank, st);
  if (rc == 0 && (!dir || !*dir))
    rc = fail(st, MLXDIST_V3_EUNAVAIL, -1, 0,
              "create: MLX_UDS_DIR is not set (a directory the ranks share, for their sockets)");
  if (rc) return rc;
  mesh* m = calloc(1, sizeof *m);
  uds* u = m ? new_group(m, rank, size, 1) : NULL;
  if (u) m->p = calloc((size_t)size, sizeof *m->p);
  if (!u || !m->p) {
    if (u) free(u->world), free(u);
    free(m);
    return fail(st, MLXDIST_V3_ENOMEM, -1, 0, "create: out of memory");
  }
  pthread_mutex_init(&m->mu, NULL);
  m->size = size, m->refs = 1;
  for (int r = 0; r < size; r++) m->p[r].fd = -1, u->world[r] = r;
  rc = size > 1 ? connect_mesh(m, rank, dir, st) : 0;
  if (rc) {
    u_destroy(&u->base);
    return rc;
  }
  *out = &u->base;
  return 0;
}

static bool u_is_available(char* why, size_t why_len) {
  if (why && why_len) why[0] = '\0';
  return true; /* nothing beyond the C library */
}

static bool u_is_configured(bool with_bootstrap) {
  const char* v[] = {getenv("MLX_RANK"), getenv("MLX_WORLD_SIZE"), getenv("MLX_UDS_DIR")};
  return !with_bootstrap && v[0] && *v[0] && v[1] && *v[1] && v[2] && *v[2];
}

static const mlxdist_v3_plugin k_plugin = {
    .struct_size = sizeof(mlxdist_v3_plugin),
    .version = MLXDIST_PLUGIN_V3_VERSION,
    .name = "uds", /* the file is libmlxdist-uds.so */
    .is_available = u_is_available,
    .is_configured = u_is_configured,
    .supports_bootstrap = false,
    .create = u_create,
};

/* The entry point. Decline a host whose table lacks what this plugin calls. */
EXPORT const mlxdist_v3_plugin* mlxdist_plugin_v3(const mlxdist_v3_host* host) {
  size_t need = offsetof(mlxdist_v3_host, timeout_s) + sizeof host->timeout_s;
  if (!host || host->struct_size < need || !host->reduce || !host->dtype_size || !host->timeout_s)
    return NULL;
  g_host = host;
  return &k_plugin;
}

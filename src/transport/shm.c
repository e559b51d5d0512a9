/* The shared-memory transport: tag-matched messages between processes on
 * one host through one POSIX shared-memory segment.
 *
 * Segment. Rank 0 creates /dev/shm/<name> (shm_open + ftruncate + mmap);
 * the other ranks open it with a bounded retry (MLXDIST_CONNECT_TIMEOUT).
 * It holds a header (geometry, a magic word written last), one record per
 * rank (pid, state, failure message, a futex "doorbell") and one ring per
 * ordered pair (src, dst). Each rank counts itself in with an atomic
 * increment; the rank that completes the count unlinks the name, so nothing
 * is left in /dev/shm once the session is set up, whatever happens later.
 *
 * Rings. A ring is a single-producer single-consumer queue of SHM_NSLOTS
 * fixed slots of SHM_SLOT_BYTES, each with a 64-byte header (kind, tag,
 * message length, chunk length, address). The producer owns `head`, the
 * consumer owns `tail` and `acked`, each on its own cache line; they are
 * C11 atomics published with release and read with acquire, and the slot
 * contents are plain memory ordered by them. A message is a sequence of
 * chunks in consecutive slots of its ring (so chunks of different messages
 * never interleave on one ring; a zero-byte message is one empty chunk).
 *
 * Large messages (>= MLXDIST_SHM_CMA_BYTES; default 0 = off) use a single copy when cross-memory
 * attach works (probed at set-up: each rank reads a value from every peer
 * with process_vm_readv): the sender puts one "ready to send" slot holding
 * its buffer's address, the receiver reads the bytes straight from the
 * sender's memory into the receive buffer and bumps `acked`; the send
 * completes when its ticket is acked. Where CMA is refused (ptrace policy,
 * seccomp) every message takes the two-copy ring path, which pipelines
 * because producer and consumer work on different slots at the same time.
 * Measured on the 2-vCPU development VM (paravirtualised page tables):
 * process_vm_readv moves 10-16 GB/s against 30-50 GB/s for memcpy, and
 * float32 all_reduce over the two-copy rings was faster at every size
 * (1 MiB: 186 vs 278 us, 16 MiB: 14.6 vs 25.6 ms, best of runs), so the
 * single-copy path is opt-in (MLXDIST_SHM_CMA_BYTES=65536 is a good value
 * where CMA is cheap).
 *
 * Matching. The receiver drains every incoming ring whenever it makes
 * progress. The first chunk of a message is matched by (peer, tag) against
 * the posted receives of that peer, in posting order; a match gets its
 * bytes written straight into its buffer. A message without a posted
 * receive is buffered (malloc, or read at once through CMA and acked), so
 * two ranks that both send before receiving never deadlock; a later receive
 * takes it over (a partly arrived one continues in the receive buffer). A
 * size mismatch fails that receive only; the bytes are drained and dropped.
 *
 * Progress and waiting. There is no background thread: isend/irecv try to
 * move data at once and waitall drives every ring. All local state is under
 * one mutex. A waiting thread polls for MLXDIST_SPIN_US after the last
 * event (with sched_yield when there are more ranks than CPUs, so spinning
 * ranks do not starve the rank they wait for), then sleeps on its rank's
 * doorbell (a futex in the segment, at most 100 ms at a time). Whoever
 * publishes something a rank waits for (a chunk, freed slots, an ack) bumps
 * that rank's doorbell and wakes it if it sleeps (a seq_cst fence on both
 * sides closes the lost-wake-up window).
 *
 * Failure. Every 100 ms without progress the waiter checks the peers its
 * pending requests involve: a process that exited ("[shm] lost rank N
 * (process PID exited)"), a transport that was closed, or one that failed
 * (its message is shared in the segment). No progress for MLXDIST_TIMEOUT
 * seconds gives MLXD_ETIMEDOUT. Any of these fails the whole transport:
 * pending and later operations fail with the first message, and the
 * failure is published in the segment so peers waiting on this rank fail
 * promptly too. Sizes are size_t throughout (CMA reads are looped), so
 * messages above 2 GiB work. */
#include "transport/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/buffer.h"
#include "util/clock.h"
#include "util/tunables.h"

#if defined(__SANITIZE_THREAD__)
#define SHM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SHM_TSAN 1
#endif
#endif
#ifndef SHM_TSAN
#define SHM_TSAN 0
#endif

#define SHM_MAGIC 0x6d6c786473686d31ull /* "mlxdshm1" */
#define SHM_VERSION 1u
#define SHM_CL 64
#ifndef SHM_SLOT_BYTES
#define SHM_SLOT_BYTES ((size_t)64 * 1024)
#endif
#ifndef SHM_NSLOTS
#define SHM_NSLOTS 16u
#endif
#define SHM_CMA_IO_MAX ((size_t)1 << 30)
#define SHM_NAME_MAX 200
#define SHM_CHECK_S 0.1 /* liveness checks / longest single sleep */

enum { RANK_NONE = 0, RANK_ATTACHED = 1, RANK_CLOSED = 2, RANK_FAILED = 3 };
enum { CMA_UNKNOWN = 0, CMA_OK = 1, CMA_NO = 2 };
enum { SLOT_EAGER = 1, SLOT_RTS = 2 };

/* ---- shared layout ---- */

typedef struct shm_rank_rec {
  alignas(SHM_CL) _Atomic int32_t state;
  _Atomic int32_t pid;
  _Atomic int32_t cma;
  uint64_t probe_addr; /* published by the state store */
  uint64_t probe_val;
  char fail_msg[MLXD_MSG_MAX]; /* published by state = RANK_FAILED */
  alignas(SHM_CL) _Atomic uint32_t doorbell;
  alignas(SHM_CL) _Atomic uint32_t sleepers;
} shm_rank_rec;

typedef struct shm_hdr {
  _Atomic uint64_t magic; /* stored last by the creator */
  uint32_t version;
  uint32_t size;
  uint64_t slot_bytes, nslots, total;
  alignas(SHM_CL) _Atomic uint32_t attached;
  alignas(SHM_CL) _Atomic uint32_t probed;
} shm_hdr;

typedef struct shm_ring_ctl {
  alignas(SHM_CL) _Atomic uint64_t head; /* producer */
  alignas(SHM_CL) _Atomic uint64_t tail; /* consumer */
  _Atomic uint64_t acked;                /* consumer: rendezvous reads done */
} shm_ring_ctl;

typedef struct shm_slot_hdr {
  uint32_t kind;
  uint32_t pad_;
  uint64_t tag;
  uint64_t msg_len;
  uint64_t chunk_len;
  uint64_t addr;
  uint64_t pad2_[3];
} shm_slot_hdr;

_Static_assert(sizeof(shm_slot_hdr) == SHM_CL, "slot header is one cache line");

/* ---- local state ---- */

enum { REQ_SEND = 1, REQ_RECV = 2 };
enum { W_NONE = 0, W_SENDQ, W_ACKQ, W_POSTED, W_CUR };

typedef struct shm_req {
  int kind;
  int peer;
  uint64_t tag;
  char* buf;
  size_t n, off;
  bool done;
  bool rndv;
  int where;
  int code;
  char* msg;
  uint64_t ticket;
  struct shm_req* next;
} shm_req;

typedef struct shm_unexp {
  uint64_t tag;
  size_t len, got;
  char* buf;
  bool complete;
  struct shm_unexp* next;
} shm_unexp;

typedef struct shm_peer {
  /* outgoing ring (this rank -> peer) */
  shm_ring_ctl* out;
  char* out_slots;
  uint64_t out_head, out_tail_seen;
  shm_req *sq_head, *sq_tail;   /* sends not yet fully in the ring */
  shm_req *ack_head, *ack_tail; /* rendezvous sends waiting for their ack */
  uint64_t rts_sent;
  bool cma; /* the peer can read our memory */
  /* incoming ring (peer -> this rank) */
  shm_ring_ctl* in;
  char* in_slots;
  uint64_t in_tail;
  shm_req *posted_head, *posted_tail;
  shm_unexp *ux_head, *ux_tail;
  bool cur_active;
  shm_req* cur_req;
  shm_unexp* cur_ux; /* cur_req == cur_ux == NULL while active: discard */
  size_t cur_len, cur_off;
  pid_t pid;
} shm_peer;

typedef struct shm_transport {
  mlxd_transport base;
  pthread_mutex_t mu;
  char path[SHM_NAME_MAX + 2];
  void* map;
  size_t map_len;
  shm_hdr* hdr;
  shm_peer* peers;
  size_t slot_stride;
  double timeout_s, spin_s;
  size_t cma_min; /* MLXDIST_SHM_CMA_BYTES; 0: never */
  bool oversubscribed;
  bool failed;
  mlxd_status err;
  volatile uint64_t probe; /* read by peers through CMA at set-up */
  shm_req* free_reqs;
  int nfree;
} shm_transport;

/* ---- geometry ---- */

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static size_t ranks_off(void) { return round_up(sizeof(shm_hdr), 4096); }
static size_t rings_off(int size) {
  return round_up(ranks_off() + (size_t)size * sizeof(shm_rank_rec), 4096);
}
static size_t slot_stride(void) { return sizeof(shm_slot_hdr) + SHM_SLOT_BYTES; }
static size_t ring_bytes(void) {
  return round_up(sizeof(shm_ring_ctl) + SHM_NSLOTS * slot_stride(), 4096);
}
static size_t total_bytes(int size) {
  return rings_off(size) + (size_t)size * (size_t)size * ring_bytes();
}

static shm_rank_rec* rank_rec(shm_transport* t, int r) {
  return (shm_rank_rec*)((char*)t->map + ranks_off() + (size_t)r * sizeof(shm_rank_rec));
}
static shm_ring_ctl* ring_ctl(shm_transport* t, int src, int dst) {
  return (shm_ring_ctl*)((char*)t->map + rings_off(t->base.size) +
                         ((size_t)src * (size_t)t->base.size + (size_t)dst) * ring_bytes());
}
static char* ring_slots(shm_ring_ctl* c) { return (char*)c + sizeof(shm_ring_ctl); }

/* ---- small helpers ---- */

static long futex(_Atomic uint32_t* addr, int op, uint32_t val, const struct timespec* ts) {
  return syscall(SYS_futex, (uint32_t*)addr, op, val, ts, NULL, 0);
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* Wake rank r if a thread of it sleeps on its doorbell. */
static void ring_bell(shm_transport* t, int r) {
  shm_rank_rec* rec = rank_rec(t, r);
#if SHM_TSAN
  /* TSan does not model fences: an RMW orders the same way (slower). */
  if (atomic_fetch_add_explicit(&rec->sleepers, 0, memory_order_seq_cst) != 0) {
#else
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&rec->sleepers, memory_order_relaxed) != 0) {
#endif
    atomic_fetch_add_explicit(&rec->doorbell, 1, memory_order_seq_cst);
    futex(&rec->doorbell, FUTEX_WAKE, INT_MAX, NULL);
  }
}

/* Whether process pid is gone (no such process, or a zombie). */
static bool pid_dead(pid_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* p = strrchr(buf, ')');
  if (!p || p[1] != ' ') return false;
  return p[2] == 'Z' || p[2] == 'X';
}

static char* dup_printf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static char* dup_printf(const char* fmt, ...) {
  char tmp[MLXD_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  return strdup(tmp);
}

/* Fail the whole transport (first failure wins); publish it to the peers.
 * Called with mu held. */
static void shm_fail(shm_transport* t, int code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void shm_fail(shm_transport* t, int code, const char* fmt, ...) {
  if (t->failed) return;
  va_list ap;
  va_start(ap, fmt);
  mlxd_vfail(&t->err, code, fmt, ap);
  va_end(ap);
  t->failed = true;
  shm_rank_rec* me = rank_rec(t, t->base.rank);
  snprintf(me->fail_msg, sizeof me->fail_msg, "%s", t->err.msg);
  atomic_store_explicit(&me->state, RANK_FAILED, memory_order_release);
  for (int r = 0; r < t->base.size; r++)
    if (r != t->base.rank) ring_bell(t, r);
}

/* ---- requests ---- */

static shm_req* req_alloc(shm_transport* t) {
  shm_req* r = t->free_reqs;
  if (r) {
    t->free_reqs = r->next;
    t->nfree--;
  } else {
    r = malloc(sizeof *r);
    if (!r) return NULL;
  }
  memset(r, 0, sizeof *r);
  return r;
}

static void req_release(shm_transport* t, shm_req* r) {
  free(r->msg);
  if (t->nfree < 64) {
    r->next = t->free_reqs;
    t->free_reqs = r;
    t->nfree++;
  } else {
    free(r);
  }
}

static void req_error(shm_req* r, int code, char* msg) {
  r->done = true;
  r->code = code;
  free(r->msg);
  r->msg = msg;
}

static void list_push(shm_req** head, shm_req** tail, shm_req* r) {
  r->next = NULL;
  if (*tail)
    (*tail)->next = r;
  else
    *head = r;
  *tail = r;
}

static void list_remove(shm_req** head, shm_req** tail, shm_req* r) {
  shm_req* prev = NULL;
  for (shm_req* c = *head; c; prev = c, c = c->next) {
    if (c != r) continue;
    if (prev)
      prev->next = c->next;
    else
      *head = c->next;
    if (*tail == c) *tail = prev;
    c->next = NULL;
    return;
  }
}

/* Take an unfinished request out of whatever list refers to it. */
static void req_unlink(shm_transport* t, shm_req* r) {
  shm_peer* p = &t->peers[r->peer];
  switch (r->where) {
    case W_SENDQ: list_remove(&p->sq_head, &p->sq_tail, r); break;
    case W_ACKQ: list_remove(&p->ack_head, &p->ack_tail, r); break;
    case W_POSTED: list_remove(&p->posted_head, &p->posted_tail, r); break;
    case W_CUR:
      if (p->cur_req == r) p->cur_req = NULL; /* the rest of it is dropped */
      break;
    default: break;
  }
  r->where = W_NONE;
}

static char* mismatch_msg(int peer, uint64_t tag, size_t sent, size_t expected) {
  return dup_printf("[shm] size mismatch: rank %d sent a %zu-byte message (tag 0x%llx) but the "
                    "receive posted for it expects %zu bytes",
                    peer, sent, (unsigned long long)tag, expected);
}

/* ---- CMA ---- */

static int cma_read(pid_t pid, void* dst, uint64_t src, size_t n, int* err) {
  size_t done = 0;
  while (done < n) {
    size_t c = n - done < SHM_CMA_IO_MAX ? n - done : SHM_CMA_IO_MAX;
    struct iovec l = {(char*)dst + done, c};
    struct iovec r = {(void*)(uintptr_t)(src + done), c};
    ssize_t k = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (k < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return -1;
    }
    if (k == 0) {
      *err = EFAULT;
      return -1;
    }
    done += (size_t)k;
  }
  return 0;
}

/* ---- progress ---- */

static shm_slot_hdr* slot_at(shm_transport* t, char* slots, uint64_t idx) {
  return (shm_slot_hdr*)(slots + (size_t)(idx % SHM_NSLOTS) * t->slot_stride);
}

/* First chunk of a message from peer pi: bind it to a posted receive or a
 * new unexpected buffer. Returns -1 if the transport failed. */
static int start_message(shm_transport* t, int pi, const shm_slot_hdr* h) {
  shm_peer* p = &t->peers[pi];
  size_t len = (size_t)h->msg_len;
  p->cur_active = true;
  p->cur_len = len;
  p->cur_off = 0;
  p->cur_req = NULL;
  p->cur_ux = NULL;
  for (shm_req* r = p->posted_head; r; r = r->next) {
    if (r->tag != h->tag) continue;
    list_remove(&p->posted_head, &p->posted_tail, r);
    r->where = W_NONE;
    if (r->n != len) {
      req_error(r, MLXD_EINVAL, mismatch_msg(pi, h->tag, len, r->n));
    } else {
      r->where = W_CUR;
      p->cur_req = r;
    }
    return 0;
  }
  shm_unexp* u = calloc(1, sizeof *u);
  char* buf = len ? mlxd_buffer_alloc(len) : NULL;
  if (!u || (len && !buf)) {
    free(u);
    mlxd_buffer_free(buf, len);
    shm_fail(t, MLXD_ENOMEM,
             "[shm] out of memory buffering a %zu-byte message from rank %d that arrived "
             "before its receive was posted",
             len, pi);
    return -1;
  }
  u->tag = h->tag;
  u->len = len;
  u->buf = buf;
  if (p->ux_tail)
    p->ux_tail->next = u;
  else
    p->ux_head = u;
  p->ux_tail = u;
  p->cur_ux = u;
  return 0;
}

static void finish_message(shm_peer* p) {
  if (p->cur_req) {
    p->cur_req->done = true;
    p->cur_req->where = W_NONE;
  }
  if (p->cur_ux) {
    p->cur_ux->complete = true;
    p->cur_ux->got = p->cur_len;
  }
  p->cur_active = false;
  p->cur_req = NULL;
  p->cur_ux = NULL;
}

static char* cur_dest(shm_peer* p) {
  if (p->cur_req) return p->cur_req->buf;
  if (p->cur_ux) return p->cur_ux->buf;
  return NULL;
}

/* Drain the ring from peer pi. Returns events (slots consumed) or -1. */
static int progress_in(shm_transport* t, int pi) {
  shm_peer* p = &t->peers[pi];
  uint64_t head = atomic_load_explicit(&p->in->head, memory_order_acquire);
  int ev = 0;
  while (p->in_tail != head) {
    shm_slot_hdr* h = slot_at(t, p->in_slots, p->in_tail);
    if (!p->cur_active && start_message(t, pi, h) != 0) return -1;
    if (h->kind == SLOT_RTS) {
      char* dst = cur_dest(p);
      int err = 0;
      if (dst && p->cur_len && cma_read(p->pid, dst, h->addr, p->cur_len, &err) != 0) {
        shm_fail(t, MLXD_ESYS,
                 "[shm] reading a %zu-byte message from rank %d (process %d) with "
                 "process_vm_readv failed: %s",
                 p->cur_len, pi, (int)p->pid, strerror(err));
        return -1;
      }
      p->cur_off = p->cur_len;
      atomic_store_explicit(&p->in->acked,
                            atomic_load_explicit(&p->in->acked, memory_order_relaxed) + 1,
                            memory_order_release);
    } else {
      size_t c = (size_t)h->chunk_len;
      char* dst = cur_dest(p);
      if (dst && c) memcpy(dst + p->cur_off, (const char*)(h + 1), c);
      p->cur_off += c;
      if (p->cur_ux) p->cur_ux->got = p->cur_off;
    }
    if (p->cur_off >= p->cur_len) finish_message(p);
    p->in_tail++;
    atomic_store_explicit(&p->in->tail, p->in_tail, memory_order_release);
    ev++;
    if (p->in_tail == head) head = atomic_load_explicit(&p->in->head, memory_order_acquire);
  }
  if (ev) ring_bell(t, pi);
  return ev;
}

/* Push queued sends to peer pi as far as the ring has room; collect acks. */
static int progress_out(shm_transport* t, int pi) {
  shm_peer* p = &t->peers[pi];
  int ev = 0;
  if (p->ack_head) {
    uint64_t acked = atomic_load_explicit(&p->out->acked, memory_order_acquire);
    while (p->ack_head && p->ack_head->ticket <= acked) {
      shm_req* r = p->ack_head;
      p->ack_head = r->next;
      if (!p->ack_head) p->ack_tail = NULL;
      r->next = NULL;
      r->where = W_NONE;
      r->done = true;
      ev++;
    }
  }
  int pushed = 0;
  while (p->sq_head) {
    if (p->out_head - p->out_tail_seen >= SHM_NSLOTS) {
      p->out_tail_seen = atomic_load_explicit(&p->out->tail, memory_order_acquire);
      if (p->out_head - p->out_tail_seen >= SHM_NSLOTS) break;
    }
    shm_req* r = p->sq_head;
    shm_slot_hdr* h = slot_at(t, p->out_slots, p->out_head);
    h->tag = r->tag;
    h->msg_len = r->n;
    bool finished;
    if (r->rndv) {
      h->kind = SLOT_RTS;
      h->addr = (uint64_t)(uintptr_t)r->buf;
      h->chunk_len = 0;
      finished = true;
    } else {
      size_t c = r->n - r->off < SHM_SLOT_BYTES ? r->n - r->off : SHM_SLOT_BYTES;
      h->kind = SLOT_EAGER;
      h->addr = 0;
      h->chunk_len = c;
      if (c) memcpy((char*)(h + 1), r->buf + r->off, c);
      r->off += c;
      finished = r->off == r->n;
    }
    p->out_head++;
    atomic_store_explicit(&p->out->head, p->out_head, memory_order_release);
    pushed++;
    if (finished) {
      p->sq_head = r->next;
      if (!p->sq_head) p->sq_tail = NULL;
      r->next = NULL;
      if (r->rndv) {
        r->ticket = ++p->rts_sent;
        r->where = W_ACKQ;
        list_push(&p->ack_head, &p->ack_tail, r);
      } else {
        r->where = W_NONE;
        r->done = true;
      }
    }
  }
  if (pushed) ring_bell(t, pi);
  return ev + pushed;
}

static int progress_all(shm_transport* t) {
  int ev = 0;
  for (int i = 0; i < t->base.size && !t->failed; i++) {
    if (i == t->base.rank) continue;
    int a = progress_in(t, i);
    if (a < 0) break;
    int b = progress_out(t, i);
    ev += a + b;
  }
  if (ev) ring_bell(t, t->base.rank); /* other local threads may wait for these */
  return ev;
}

/* Sum of the shared counters peers move for this rank (changes = activity). */
static uint64_t activity(shm_transport* t) {
  uint64_t s = 0;
  for (int i = 0; i < t->base.size; i++) {
    if (i == t->base.rank) continue;
    shm_peer* p = &t->peers[i];
    s += atomic_load(&p->in->head) + atomic_load(&p->out->tail) + atomic_load(&p->out->acked);
    s += (uint64_t)atomic_load(&rank_rec(t, i)->state) << 40;
  }
  return s;
}

/* ---- liveness ---- */

/* Check the peers the given pending requests wait for. Returns true if the
 * transport failed. Called with mu held. */
static bool check_peers(shm_transport* t, shm_req** reqs, int n) {
  for (int i = 0; i < n && !t->failed; i++) {
    shm_req* r = reqs[i];
    if (!r || r->done) continue;
    int pi = r->peer;
    shm_rank_rec* rec = rank_rec(t, pi);
    int state = atomic_load_explicit(&rec->state, memory_order_acquire);
    if (state == RANK_FAILED) {
      shm_fail(t, MLXD_EREMOTE, "[shm] rank %d failed: %s", pi, rec->fail_msg);
    } else if (pid_dead(t->peers[pi].pid)) {
      shm_fail(t, MLXD_EREMOTE, "[shm] lost rank %d (process %d exited)", pi,
               (int)t->peers[pi].pid);
    } else if (state == RANK_CLOSED) {
      shm_fail(t, MLXD_EREMOTE,
               "[shm] lost rank %d (process %d closed its transport while rank %d still "
               "waits for it)",
               pi, (int)t->peers[pi].pid, t->base.rank);
    }
  }
  return t->failed;
}

/* ---- transport ops ---- */

static int fail_status(shm_transport* t, mlxd_status* st) {
  if (st) {
    st->code = t->err.code;
    snprintf(st->msg, sizeof st->msg, "%s", t->err.msg);
  }
  return t->err.code;
}

static int check_args(shm_transport* t, const char* what, int peer, const void* buf, size_t n,
                      mlxd_req** req, mlxd_status* st) {
  if (!req) return mlxd_fail(st, MLXD_EINVAL, "[shm] %s: req is NULL; expected a pointer", what);
  *req = NULL;
  if (peer < 0 || peer >= t->base.size || peer == t->base.rank)
    return mlxd_fail(st, MLXD_EINVAL,
                     "[shm] %s: peer %d is not valid; expected a rank in [0, %d) other than "
                     "this rank (%d)",
                     what, peer, t->base.size, t->base.rank);
  if (!buf && n)
    return mlxd_fail(st, MLXD_EINVAL, "[shm] %s: buffer is NULL for a %zu-byte message", what, n);
  return 0;
}

static int shm_isend(mlxd_transport* tt, int peer, uint64_t tag, const void* buf, size_t n,
                     mlxd_req** req, mlxd_status* st) {
  shm_transport* t = (shm_transport*)tt;
  int rc = check_args(t, "isend", peer, buf, n, req, st);
  if (rc) return rc;
  pthread_mutex_lock(&t->mu);
  if (t->failed) {
    rc = fail_status(t, st);
    pthread_mutex_unlock(&t->mu);
    return rc;
  }
  shm_req* r = req_alloc(t);
  if (!r) {
    pthread_mutex_unlock(&t->mu);
    return mlxd_fail(st, MLXD_ENOMEM, "[shm] isend: out of memory for a request");
  }
  shm_peer* p = &t->peers[peer];
  r->kind = REQ_SEND;
  r->peer = peer;
  r->tag = tag;
  r->buf = (char*)(uintptr_t)buf;
  r->n = n;
  r->rndv = p->cma && t->cma_min && n >= t->cma_min;
  r->where = W_SENDQ;
  list_push(&p->sq_head, &p->sq_tail, r);
  progress_out(t, peer);
  pthread_mutex_unlock(&t->mu);
  *req = (mlxd_req*)r;
  return 0;
}

static int shm_irecv(mlxd_transport* tt, int peer, uint64_t tag, void* buf, size_t n,
                     mlxd_req** req, mlxd_status* st) {
  shm_transport* t = (shm_transport*)tt;
  int rc = check_args(t, "irecv", peer, buf, n, req, st);
  if (rc) return rc;
  pthread_mutex_lock(&t->mu);
  if (t->failed) {
    rc = fail_status(t, st);
    pthread_mutex_unlock(&t->mu);
    return rc;
  }
  shm_req* r = req_alloc(t);
  if (!r) {
    pthread_mutex_unlock(&t->mu);
    return mlxd_fail(st, MLXD_ENOMEM, "[shm] irecv: out of memory for a request");
  }
  shm_peer* p = &t->peers[peer];
  r->kind = REQ_RECV;
  r->peer = peer;
  r->tag = tag;
  r->buf = buf;
  r->n = n;
  /* Take over a message that arrived first. */
  shm_unexp* prev = NULL;
  shm_unexp* u = p->ux_head;
  for (; u; prev = u, u = u->next)
    if (u->tag == tag) break;
  if (u) {
    if (prev)
      prev->next = u->next;
    else
      p->ux_head = u->next;
    if (p->ux_tail == u) p->ux_tail = prev;
    bool current = p->cur_ux == u;
    if (u->len != n) {
      req_error(r, MLXD_EINVAL, mismatch_msg(peer, tag, u->len, n));
      if (current) p->cur_ux = NULL; /* drop the rest */
    } else {
      if (u->got) memcpy(r->buf, u->buf, u->got);
      if (u->complete) {
        r->done = true;
      } else {
        p->cur_ux = NULL;
        p->cur_req = r;
        r->where = W_CUR;
      }
    }
    mlxd_buffer_free(u->buf, u->len);
    free(u);
  } else {
    r->where = W_POSTED;
    list_push(&p->posted_head, &p->posted_tail, r);
    progress_in(t, peer);
  }
  pthread_mutex_unlock(&t->mu);
  *req = (mlxd_req*)r;
  return 0;
}

/* Sleep on this rank's doorbell unless something moved since `snap`.
 * Called without mu. */
static void block_wait(shm_transport* t, uint64_t snap, double max_s) {
  shm_rank_rec* me = rank_rec(t, t->base.rank);
  uint32_t v = atomic_load(&me->doorbell);
  atomic_fetch_add(&me->sleepers, 1); /* seq_cst, then seq_cst loads in activity() */
  if (activity(t) == snap) {
    if (max_s > SHM_CHECK_S) max_s = SHM_CHECK_S;
    if (max_s < 1e-4) max_s = 1e-4;
    struct timespec ts = {(time_t)max_s, (long)((max_s - (double)(time_t)max_s) * 1e9)};
    futex(&me->doorbell, FUTEX_WAIT, v, &ts);
  }
  atomic_fetch_sub(&me->sleepers, 1);
}

static int shm_waitall(mlxd_transport* tt, mlxd_req** rr, int n, mlxd_status* st) {
  shm_transport* t = (shm_transport*)tt;
  shm_req** reqs = (shm_req**)rr;
  if (n < 0 || (n > 0 && !reqs))
    return mlxd_fail(st, MLXD_EINVAL, "[shm] waitall: %d requests at %p; expected n >= 0 and a "
                     "request array", n, (void*)rr);
  pthread_mutex_lock(&t->mu);
  double last = mlxd_now(), last_check = last;
  for (;;) {
    int ev = t->failed ? 0 : progress_all(t);
    bool pending = false;
    for (int i = 0; i < n && !pending; i++)
      if (reqs[i] && !reqs[i]->done) pending = true;
    if (!pending || t->failed) break;
    double now = mlxd_now();
    if (ev) {
      last = last_check = now;
      continue;
    }
    if (now - last >= t->timeout_s) {
      int waiting_for = -1;
      for (int i = 0; i < n && waiting_for < 0; i++)
        if (reqs[i] && !reqs[i]->done) waiting_for = reqs[i]->peer;
      shm_fail(t, MLXD_ETIMEDOUT,
               "[shm] timed out after %g s waiting for rank %d (rank %d made no progress "
               "for MLXDIST_TIMEOUT seconds)",
               t->timeout_s, waiting_for, t->base.rank);
      break;
    }
    if (now - last_check >= SHM_CHECK_S) {
      last_check = now;
      if (check_peers(t, reqs, n)) break;
    }
    if (now - last < t->spin_s) {
      pthread_mutex_unlock(&t->mu);
      if (t->oversubscribed)
        sched_yield();
      else
        cpu_relax();
      pthread_mutex_lock(&t->mu);
      continue;
    }
    uint64_t snap = activity(t);
    double left = t->timeout_s - (now - last);
    double to_check = SHM_CHECK_S - (now - last_check);
    pthread_mutex_unlock(&t->mu);
    block_wait(t, snap, left < to_check ? left : to_check);
    pthread_mutex_lock(&t->mu);
  }
  int rc = 0;
  for (int i = 0; i < n; i++) {
    shm_req* r = reqs[i];
    if (!r) continue;
    if (!rc && r->done && r->code) {
      rc = r->code;
      if (st) {
        st->code = r->code;
        snprintf(st->msg, sizeof st->msg, "%s", r->msg ? r->msg : "[shm] request failed");
      }
    }
  }
  if (!rc && t->failed) {
    for (int i = 0; i < n && !rc; i++)
      if (reqs[i] && !reqs[i]->done) rc = fail_status(t, st);
  }
  for (int i = 0; i < n; i++) {
    shm_req* r = reqs[i];
    if (!r) continue;
    if (!r->done) req_unlink(t, r);
    req_release(t, r);
    reqs[i] = NULL;
  }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

static void free_req_list(shm_transport* t, shm_req* r) {
  while (r) {
    shm_req* nx = r->next;
    req_release(t, r);
    r = nx;
  }
}

static void shm_destroy(mlxd_transport* tt) {
  shm_transport* t = (shm_transport*)tt;
  if (!t) return;
  if (t->map) {
    shm_rank_rec* me = rank_rec(t, t->base.rank);
    int s = RANK_ATTACHED;
    atomic_compare_exchange_strong(&me->state, &s, RANK_CLOSED);
    for (int r = 0; r < t->base.size; r++)
      if (r != t->base.rank) ring_bell(t, r);
  }
  if (t->peers) {
    for (int i = 0; i < t->base.size; i++) {
      shm_peer* p = &t->peers[i];
      free_req_list(t, p->sq_head);
      free_req_list(t, p->ack_head);
      free_req_list(t, p->posted_head);
      for (shm_unexp* u = p->ux_head; u;) {
        shm_unexp* nx = u->next;
        mlxd_buffer_free(u->buf, u->len);
        free(u);
        u = nx;
      }
    }
  }
  while (t->free_reqs) {
    shm_req* nx = t->free_reqs->next;
    free(t->free_reqs);
    t->free_reqs = nx;
  }
  if (t->map) munmap(t->map, t->map_len);
  free(t->peers);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

static const mlxd_transport_ops k_shm_ops = {
    .name = "shm",
    .isend = shm_isend,
    .irecv = shm_irecv,
    .waitall = shm_waitall,
    .destroy = shm_destroy,
};

/* ---- set-up ---- */

static bool valid_name(const char* s) {
  size_t n = strlen(s);
  if (n == 0 || n > SHM_NAME_MAX) return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return s[0] != '.';
}

/* Wait until *counter reaches want (bounded; watching the attached peers). */
static int wait_count(shm_transport* t, _Atomic uint32_t* counter, uint32_t want,
                      double deadline, const char* what, mlxd_status* st) {
  long us = 20;
  double last_check = mlxd_now();
  while (atomic_load_explicit(counter, memory_order_acquire) < want) {
    double now = mlxd_now();
    if (now >= deadline) {
      char missing[160] = "";
      size_t len = 0;
      for (int r = 0; r < t->base.size && len < sizeof missing - 12; r++)
        if (atomic_load(&rank_rec(t, r)->state) == RANK_NONE)
          len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? ", " : "", r);
      return mlxd_fail(st, MLXD_ETIMEDOUT,
                       "[shm] rank %d timed out after %g s (MLXDIST_CONNECT_TIMEOUT) waiting "
                       "for every rank to %s shared memory %s%s%s",
                       t->base.rank, mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT), what, t->path,
                       len ? "; missing ranks: " : "", missing);
    }
    if (now - last_check >= SHM_CHECK_S) {
      last_check = now;
      for (int r = 0; r < t->base.size; r++) {
        shm_rank_rec* rec = rank_rec(t, r);
        pid_t pid = atomic_load(&rec->pid);
        int state = atomic_load_explicit(&rec->state, memory_order_acquire);
        if (r == t->base.rank || pid <= 0) continue;
        if (state == RANK_FAILED)
          return mlxd_fail(st, MLXD_EREMOTE, "[shm] rank %d failed while joining %s: %s", r,
                           t->path, rec->fail_msg);
        if (pid_dead(pid))
          return mlxd_fail(st, MLXD_EREMOTE,
                           "[shm] lost rank %d (process %d exited) while joining %s", r,
                           (int)pid, t->path);
      }
    }
    sleep_us(us);
    if (us < 2000) us *= 2;
  }
  return 0;
}

static int open_segment(shm_transport* t, size_t total, double deadline, mlxd_status* st) {
  int fd = -1;
  if (t->base.rank == 0) {
    fd = shm_open(t->path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      int e = errno;
      return mlxd_fail(st, MLXD_ESYS,
                       "[shm] rank 0 could not create shared memory %s: %s%s", t->path,
                       strerror(e),
                       e == EEXIST ? " (the session name must be unique; expected a fresh name)"
                                   : "");
    }
    if (ftruncate(fd, (off_t)total) != 0) {
      int e = errno;
      close(fd);
      shm_unlink(t->path);
      return mlxd_fail(st, MLXD_ESYS, "[shm] could not size shared memory %s to %zu bytes: %s",
                       t->path, total, strerror(e));
    }
  } else {
    long us = 50;
    for (;;) {
      fd = shm_open(t->path, O_RDWR | O_CLOEXEC, 0);
      if (fd >= 0) {
        struct stat sb;
        if (fstat(fd, &sb) == 0 && (size_t)sb.st_size == total) break;
        if (fstat(fd, &sb) == 0 && sb.st_size != 0 && (size_t)sb.st_size != total) {
          close(fd);
          return mlxd_fail(st, MLXD_EINVAL,
                           "[shm] shared memory %s has %lld bytes but rank %d expected %zu "
                           "(do all ranks agree on the group size %d?)",
                           t->path, (long long)sb.st_size, t->base.rank, total, t->base.size);
        }
        close(fd);
        fd = -1;
      } else if (errno != ENOENT) {
        int e = errno;
        return mlxd_fail(st, MLXD_ESYS, "[shm] rank %d could not open shared memory %s: %s",
                         t->base.rank, t->path, strerror(e));
      }
      if (mlxd_now() >= deadline)
        return mlxd_fail(st, MLXD_ETIMEDOUT,
                         "[shm] rank %d could not open shared memory %s created by rank 0 "
                         "within %g s (MLXDIST_CONNECT_TIMEOUT)",
                         t->base.rank, t->path, mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT));
      sleep_us(us);
      if (us < 5000) us *= 2;
    }
  }
  void* m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (m == MAP_FAILED) {
    if (t->base.rank == 0) shm_unlink(t->path);
    return mlxd_fail(st, MLXD_ESYS, "[shm] could not map %zu bytes of shared memory %s: %s",
                     total, t->path, strerror(e));
  }
  t->map = m;
  t->map_len = total;
  t->hdr = (shm_hdr*)m;
  if (t->base.rank == 0) {
    t->hdr->version = SHM_VERSION;
    t->hdr->size = (uint32_t)t->base.size;
    t->hdr->slot_bytes = SHM_SLOT_BYTES;
    t->hdr->nslots = SHM_NSLOTS;
    t->hdr->total = total;
    atomic_store_explicit(&t->hdr->magic, SHM_MAGIC, memory_order_release);
  } else {
    long us = 20;
    while (atomic_load_explicit(&t->hdr->magic, memory_order_acquire) != SHM_MAGIC) {
      if (mlxd_now() >= deadline)
        return mlxd_fail(st, MLXD_ETIMEDOUT,
                         "[shm] shared memory %s was never initialised by rank 0 within %g s "
                         "(MLXDIST_CONNECT_TIMEOUT)",
                         t->path, mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT));
      sleep_us(us);
      if (us < 2000) us *= 2;
    }
    if (t->hdr->version != SHM_VERSION || t->hdr->size != (uint32_t)t->base.size ||
        t->hdr->slot_bytes != SHM_SLOT_BYTES || t->hdr->nslots != SHM_NSLOTS ||
        t->hdr->total != total)
      return mlxd_fail(st, MLXD_EINVAL,
                       "[shm] shared memory %s was made for %u ranks (layout version %u) but "
                       "rank %d expected %d ranks (version %u)",
                       t->path, t->hdr->size, t->hdr->version, t->base.rank, t->base.size,
                       SHM_VERSION);
  }
  return 0;
}

mlxd_transport* mlxd_shm_transport_new(int rank, int size, const char* name, mlxd_status* st) {
  mlxd_status local;
  if (!st) st = &local;
  if (size < 1 || size > 4096 || rank < 0 || rank >= size) {
    mlxd_fail(st, MLXD_EINVAL,
              "[shm] rank %d / size %d is not valid; expected 1 <= size <= 4096 and "
              "0 <= rank < size",
              rank, size);
    return NULL;
  }
  if (!name || !valid_name(name)) {
    mlxd_fail(st, MLXD_EINVAL,
              "[shm] session name \"%s\" is not valid; expected 1 to %d letters, digits, "
              "'-', '_' or '.' (not starting with '.')",
              name ? name : "(null)", SHM_NAME_MAX);
    return NULL;
  }
  shm_transport* t = calloc(1, sizeof *t);
  if (!t) {
    mlxd_fail(st, MLXD_ENOMEM, "[shm] out of memory creating the transport");
    return NULL;
  }
  t->base.ops = &k_shm_ops;
  t->base.rank = rank;
  t->base.size = size;
  pthread_mutex_init(&t->mu, NULL);
  snprintf(t->path, sizeof t->path, "/%s", name);
  t->slot_stride = slot_stride();
  t->timeout_s = mlxd_tunable_double(MLXD_T_TIMEOUT);
  if (!(t->timeout_s > 0)) t->timeout_s = 60;
  t->spin_s = mlxd_tunable_double(MLXD_T_SPIN_US) * 1e-6;
  if (!(t->spin_s >= 0)) t->spin_s = 50e-6;
  long cma_min = mlxd_tunable_long(MLXD_T_SHM_CMA_BYTES);
  t->cma_min = cma_min > 0 ? (size_t)cma_min : 0;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  t->oversubscribed = ncpu > 0 && size > ncpu;
  t->peers = calloc((size_t)size, sizeof *t->peers);
  if (!t->peers) {
    mlxd_fail(st, MLXD_ENOMEM, "[shm] out of memory creating the transport");
    shm_destroy(&t->base);
    return NULL;
  }
  double deadline = mlxd_now() + mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT);
  size_t total = total_bytes(size);
  bool unlinked = false;
  if (open_segment(t, total, deadline, st) != 0) goto fail;

  /* Count in; the last rank to arrive unlinks the name. */
  shm_rank_rec* me = rank_rec(t, rank);
  t->probe = ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)t ^ 0x9e3779b97f4a7c15ull;
  me->probe_addr = (uint64_t)(uintptr_t)&t->probe;
  me->probe_val = t->probe;
  if (atomic_load(&me->state) != RANK_NONE) {
    mlxd_fail(st, MLXD_EINVAL,
              "[shm] rank %d of shared memory %s was already taken by process %d; expected "
              "every rank exactly once",
              rank, t->path, (int)atomic_load(&me->pid));
    goto fail;
  }
  atomic_store(&me->pid, (int32_t)getpid());
  atomic_store_explicit(&me->state, RANK_ATTACHED, memory_order_release);
  if (atomic_fetch_add(&t->hdr->attached, 1) + 1 == (uint32_t)size) {
    shm_unlink(t->path);
    unlinked = true;
  }
  if (wait_count(t, &t->hdr->attached, (uint32_t)size, deadline, "map", st) != 0) goto fail;
  unlinked = true; /* someone did it */

  /* Probe cross-memory attach from this rank to every peer. */
  bool cma = true;
  for (int r = 0; r < size && cma; r++) {
    if (r == rank) continue;
    shm_rank_rec* rec = rank_rec(t, r);
    uint64_t v = 0;
    int err = 0;
    if (cma_read((pid_t)atomic_load(&rec->pid), &v, rec->probe_addr, sizeof v, &err) != 0 ||
        v != rec->probe_val)
      cma = false;
  }
  atomic_store(&me->cma, cma ? CMA_OK : CMA_NO);
  atomic_fetch_add(&t->hdr->probed, 1);
  if (wait_count(t, &t->hdr->probed, (uint32_t)size, deadline, "probe", st) != 0) goto fail;

  for (int r = 0; r < size; r++) {
    if (r == rank) continue;
    shm_peer* p = &t->peers[r];
    shm_rank_rec* rec = rank_rec(t, r);
    p->pid = (pid_t)atomic_load(&rec->pid);
    p->cma = atomic_load(&rec->cma) == CMA_OK;
    p->out = ring_ctl(t, rank, r);
    p->out_slots = ring_slots(p->out);
    p->in = ring_ctl(t, r, rank);
    p->in_slots = ring_slots(p->in);
  }
  return &t->base;

fail:
  if (!unlinked) shm_unlink(t->path);
  if (t->map) {
    shm_rank_rec* mine = rank_rec(t, rank);
    if (atomic_load(&mine->pid) == (int32_t)getpid()) {
      snprintf(mine->fail_msg, sizeof mine->fail_msg, "%s", st->msg);
      atomic_store_explicit(&mine->state, RANK_FAILED, memory_order_release);
    }
    munmap(t->map, t->map_len);
    t->map = NULL;
  }
  shm_destroy(&t->base);
  return NULL;
}

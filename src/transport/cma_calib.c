/* The single-copy threshold's calibration (cma_calib.h). */
#include "transport/cma_calib.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "transport/engine.h" /* mlxd_cpu_relax */
#include "transport/spin.h"   /* mlxd_usable_cpus */
#include "util/clock.h"

const size_t mlxd_cma_sizes[MLXD_CMA_NSIZES] = {(size_t)16 << 10, (size_t)64 << 10,
                                                (size_t)256 << 10, (size_t)1 << 20};

static void say(char* why, size_t n, const char* s) {
  if (why && n) snprintf(why, n, "%s", s);
}

/* ---- the rule ---- */

static bool time_ok(double s) { return isfinite(s) && s > 0; }

size_t mlxd_cma_decide(const size_t* sizes, const double* two_s, const double* one_s, int n) {
  if (n <= 0 || !sizes || !two_s || !one_s) return 0;
  for (int i = 0; i < n; i++) {
    if (!time_ok(two_s[i]) || !time_ok(one_s[i]) || sizes[i] == 0) return 0;
    if (i > 0 && sizes[i] <= sizes[i - 1]) return 0;
  }
  size_t from = 0;
  for (int i = n - 1; i >= 0; i--) {
    if (!(one_s[i] <= (1.0 - MLXD_CMA_MARGIN) * two_s[i])) break;
    from = sizes[i];
  }
  return from;
}

/* ---- the measurement ---- */

/* One process_vm_readv of n bytes from this process's own src into dst
 * (looped over short reads): 0, or the errno. */
static int self_read(pid_t me, void* dst, const void* src, size_t n) {
  size_t done = 0;
  while (done < n) {
    struct iovec l = {(char*)dst + done, n - done};
    struct iovec r = {(char*)(uintptr_t)src + done, n - done};
    ssize_t k = process_vm_readv(me, &l, 1, &r, 1, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return errno;
    if (k == 0) return EFAULT;
    done += (size_t)k;
  }
  return 0;
}

/* ---- the measurement: two threads exchange messages ---- */

/* The exchange a collective makes (each rank sends to a peer while it
 * receives from one), between this thread (side 0) and a helper (side 1)
 * on another CPU: both ways of moving the bytes, as the ranks would, so
 * that the lanes pay what they pay between two processes, a slot's lines
 * moving between the cores and a handshake per slot, besides their two
 * copies. Lane k is written by side k and read by side 1 - k. */
typedef struct x_lane {
  char* slots;
  _Alignas(64) _Atomic uint64_t head; /* slots side k published */
  _Alignas(64) _Atomic uint64_t tail; /* slots side 1 - k copied out */
} x_lane;

typedef struct xchg {
  x_lane lane[2];
  char* src[2];                      /* side k's message */
  char* dst[2];                      /* where side k puts the other's */
  pid_t me;                          /* side 0 reads through process_vm_readv of this pid */
  size_t n;                          /* this round's size (set before go moves) */
  double deadline;                   /* every spin gives up past it */
  _Alignas(64) _Atomic uint32_t go;  /* the round number: the helper starts a new one */
  _Alignas(64) _Atomic uint32_t fin; /* the last round the helper finished */
  _Atomic bool stop;                 /* the helper returns */
  int err;                           /* side 0's process_vm_readv errno */
} xchg;

/* True every 256th call while nothing moves once stop is set or the
 * deadline passed; a pause otherwise. */
static bool x_give_up(const xchg* x, unsigned* idle) {
  if ((++*idle & 255) == 0 &&
      (atomic_load_explicit(&x->stop, memory_order_acquire) || mlxd_now() > x->deadline))
    return true;
  mlxd_cpu_relax();
  return false;
}

/* Side k's part of a lane round: stream its own message through its lane
 * while it drains the other's, chunk by chunk. false: given up. */
static bool x_side(xchg* x, int k) {
  const size_t n = x->n;
  x_lane* out = &x->lane[k];
  x_lane* in = &x->lane[1 - k];
  uint64_t h = atomic_load_explicit(&out->head, memory_order_relaxed);
  uint64_t t = atomic_load_explicit(&in->tail, memory_order_relaxed);
  size_t sent = 0, got = 0;
  unsigned idle = 0;
  while (sent < n || got < n) {
    bool moved = false;
    if (got < n && atomic_load_explicit(&in->head, memory_order_acquire) != t) {
      size_t c = n - got < MLXD_CMA_SLOT_BYTES ? n - got : MLXD_CMA_SLOT_BYTES;
      memcpy(x->dst[k] + got, in->slots + (t % MLXD_CMA_NSLOTS) * MLXD_CMA_SLOT_BYTES, c);
      got += c;
      atomic_store_explicit(&in->tail, ++t, memory_order_release);
      moved = true;
    }
    if (sent < n && h - atomic_load_explicit(&out->tail, memory_order_acquire) < MLXD_CMA_NSLOTS) {
      size_t c = n - sent < MLXD_CMA_SLOT_BYTES ? n - sent : MLXD_CMA_SLOT_BYTES;
      memcpy(out->slots + (h % MLXD_CMA_NSLOTS) * MLXD_CMA_SLOT_BYTES, x->src[k] + sent, c);
      sent += c;
      atomic_store_explicit(&out->head, ++h, memory_order_release);
      moved = true;
    }
    if (!moved && x_give_up(x, &idle)) return false;
  }
  return true;
}

static void* x_helper(void* arg) {
  xchg* x = arg;
  uint32_t seen = 0;
  for (;;) {
    uint32_t g;
    unsigned idle = 0;
    while ((g = atomic_load_explicit(&x->go, memory_order_acquire)) == seen)
      if (x_give_up(x, &idle)) return NULL;
    seen = g;
    if (!x_side(x, 1)) return NULL;
    atomic_store_explicit(&x->fin, g, memory_order_release);
  }
}

/* One round: n bytes each way; its seconds, or -1 (given up, refused).
 * The single copy is timed on this side alone: two ranks' reads run side
 * by side, each pinning the other's pages under the other's locks, which
 * two threads of one process, sharing one address space and its page
 * tables' locks, would not show. */
static double x_round(xchg* x, size_t n, bool cma) {
  x->n = n;
  const double t0 = mlxd_now();
  if (cma) {
    x->err = self_read(x->me, x->dst[0], x->src[1], n);
    return x->err ? -1 : mlxd_now() - t0;
  }
  uint32_t g = atomic_load_explicit(&x->go, memory_order_relaxed) + 1;
  atomic_store_explicit(&x->go, g, memory_order_release);
  if (!x_side(x, 0)) return -1;
  unsigned idle = 0;
  while (atomic_load_explicit(&x->fin, memory_order_acquire) != g)
    if (x_give_up(x, &idle)) return -1;
  return mlxd_now() - t0;
}

/* Writes n bytes of buf in steps of 1 MiB (the first touch of each page),
 * stopping once deadline has passed: false then. */
static bool warm(char* buf, size_t n, int byte, double deadline) {
  for (size_t off = 0; off < n; off += (size_t)1 << 20) {
    if (mlxd_now() > deadline) return false;
    size_t c = n - off < ((size_t)1 << 20) ? n - off : (size_t)1 << 20;
    memset(buf + off, byte, c);
  }
  return true;
}

size_t mlxd_cma_measure(mlxd_cma_table* t, double budget_s) {
  memset(t, 0, sizeof *t);
  const double start = mlxd_now(), deadline = start + budget_s;
  const size_t big = mlxd_cma_sizes[MLXD_CMA_NSIZES - 1];
  const size_t lane_n = MLXD_CMA_NSLOTS * MLXD_CMA_SLOT_BYTES;
  const size_t all = 4 * big + 2 * lane_n; /* src and dst of each side, a lane each */
  xchg x;
  memset(&x, 0, sizeof x);
  x.me = getpid();
  x.deadline = deadline;
  char* mem = MAP_FAILED;
  bool helper = false;
  pthread_t th;
  /* refused outright (seccomp, a kernel without it): nothing to time */
  uint64_t a = 0x6d6c7864636d6131ull, b = 0;
  int e = self_read(x.me, &b, &a, sizeof a);
  if (e == 0 && b != a) e = EFAULT;
  if (e != 0) {
    t->err = e;
    goto out;
  }
  /* one CPU: the two sides would take turns, which no pair of ranks on
   * their own CPUs does; no answer (not cached either) */
  if (mlxd_usable_cpus() < 2) {
    t->one_cpu = true;
    goto out;
  }
  /* populated by the kernel at once: half the cost of faulting each page in here (2-vCPU VM) */
  mem = mmap(NULL, all, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (mem == MAP_FAILED) {
    t->err = ENOMEM;
    goto out;
  }
  for (int k = 0; k < 2; k++) {
    x.src[k] = mem + (size_t)k * big;
    x.dst[k] = mem + (size_t)(2 + k) * big;
    x.lane[k].slots = mem + 4 * big + (size_t)k * lane_n;
  }
  if (!warm(mem, all, 0x5a, deadline)) {
    t->over = true;
    goto out;
  }
  if (pthread_create(&th, NULL, x_helper, &x) != 0) {
    t->err = EAGAIN;
    goto out;
  }
  helper = true;
  for (int rep = 0; rep < MLXD_CMA_REPS; rep++) {
    for (int i = 0; i < MLXD_CMA_NSIZES; i++) {
      const size_t n = mlxd_cma_sizes[i];
      double two = 0, one = 0;
      /* alternate which way goes first, so neither always finds the caches
       * the other left; the first pass starts each way with an untimed
       * round (the pages' first pinning, the helper's first wake) */
      for (int k = 0; k < 2; k++) {
        bool cma = (k + rep) % 2 != 0;
        double s = rep == 0 ? x_round(&x, n, cma) : 0;
        if (s >= 0) s = x_round(&x, n, cma);
        if (s < 0) {
          e = x.err;
          if (e) {
            t->err = e;
            t->n = 0;
            t->reps = 0;
          } else {
            t->over = t->reps == 0;
          }
          goto out;
        }
        *(cma ? &one : &two) = s;
      }
      if (rep == 0 || two < t->two_s[i]) t->two_s[i] = two;
      if (rep == 0 || one < t->one_s[i]) t->one_s[i] = one;
      if (rep == 0) t->n = i + 1;
    }
    t->reps = rep + 1;
  }
out:
  if (helper) {
    atomic_store_explicit(&x.stop, true, memory_order_release);
    pthread_join(th, NULL);
  }
  if (mem != MAP_FAILED) munmap(mem, all);
  t->took_s = mlxd_now() - start;
  if (t->err || t->reps == 0) return 0;
  return mlxd_cma_decide(mlxd_cma_sizes, t->two_s, t->one_s, MLXD_CMA_NSIZES);
}

/* ---- the cache file ---- */

static bool boot_id_ok(const char* s, size_t n) {
  if (n != MLXD_CMA_BOOT_ID_LEN) return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? c != '-' : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool mlxd_cma_boot_id(char* out) {
  out[0] = '\0';
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  char buf[64];
  ssize_t k = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (k < MLXD_CMA_BOOT_ID_LEN) return false;
  size_t n = (size_t)k;
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) n--;
  if (!boot_id_ok(buf, n)) return false;
  memcpy(out, buf, n);
  out[n] = '\0';
  return true;
}

void mlxd_cma_cache_path(char* out, size_t n) {
  snprintf(out, n, "/dev/shm/.mlxdist-cma-%lu", (unsigned long)getuid());
}

int mlxd_cma_cache_format(char* out, size_t n, const char* boot_id, size_t bytes) {
  int k = snprintf(out, n, "mlxdist-cma %d %s %zu\n", MLXD_CMA_CACHE_VERSION, boot_id, bytes);
  return k < 0 || (size_t)k >= n ? -1 : k;
}

/* A decimal field of 1 to 19 digits (no sign, no leading zero but "0")
 * at *p, ending at a space or the newline: its value, *p moved past it. */
static bool take_number(const char** p, const char* end, unsigned long long* v) {
  const char* s = *p;
  unsigned long long x = 0;
  int digits = 0;
  while (s < end && *s >= '0' && *s <= '9') {
    if (++digits > 19) return false;
    x = x * 10 + (unsigned long long)(*s - '0');
    s++;
  }
  if (digits == 0 || (digits > 1 && **p == '0')) return false;
  *p = s;
  *v = x;
  return true;
}

int mlxd_cma_cache_parse(const char* text, size_t len, const char* boot_id, size_t* bytes,
                         char* why, size_t why_n) {
  static const char head[] = "mlxdist-cma ";
  const size_t hn = sizeof head - 1;
  if (!text || len > MLXD_CMA_CACHE_MAX) return say(why, why_n, "too long"), -1;
  if (len < hn || memcmp(text, head, hn) != 0) return say(why, why_n, "not a cache file"), -1;
  if (memchr(text, '\0', len)) return say(why, why_n, "a NUL byte"), -1;
  const char *p = text + hn, *end = text + len;
  unsigned long long version = 0, v = 0;
  if (!take_number(&p, end, &version) || p >= end || *p != ' ')
    return say(why, why_n, "no version"), -1;
  if (version != MLXD_CMA_CACHE_VERSION) return say(why, why_n, "another version"), -1;
  p++;
  const char* id = p;
  while (p < end && *p != ' ') p++;
  if (p >= end || !boot_id_ok(id, (size_t)(p - id))) return say(why, why_n, "no boot id"), -1;
  if (!boot_id || strlen(boot_id) != (size_t)(p - id) || memcmp(id, boot_id, (size_t)(p - id)))
    return say(why, why_n, "another boot's"), -1;
  p++;
  if (!take_number(&p, end, &v)) return say(why, why_n, "no threshold"), -1;
  if (p + 1 != end || *p != '\n') return say(why, why_n, "more after the threshold"), -1;
  bool known = v == 0;
  for (int i = 0; i < MLXD_CMA_NSIZES; i++) known = known || v == mlxd_cma_sizes[i];
  if (!known) return say(why, why_n, "a threshold that is not 0 or a measured size"), -1;
  *bytes = (size_t)v;
  return 0;
}

int mlxd_cma_cache_read(const char* path, const char* boot_id, size_t* bytes, char* why,
                        size_t why_n) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return say(why, why_n, errno == ENOENT ? "none" : strerror(errno)), -1;
  struct stat sb;
  int rc = -1;
  char buf[MLXD_CMA_CACHE_MAX + 1];
  if (fstat(fd, &sb) != 0) {
    say(why, why_n, strerror(errno));
  } else if (!S_ISREG(sb.st_mode)) {
    say(why, why_n, "not a regular file");
  } else if (sb.st_uid != getuid()) {
    say(why, why_n, "another user's");
  } else if (sb.st_mode & (S_IWGRP | S_IWOTH)) {
    say(why, why_n, "writable by others");
  } else if (sb.st_size > MLXD_CMA_CACHE_MAX) {
    say(why, why_n, "too long");
  } else {
    size_t got = 0;
    for (;;) { /* to the end (or past the limit: then too long) */
      ssize_t k = read(fd, buf + got, sizeof buf - got);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      got += (size_t)k;
      if (got == sizeof buf) break;
    }
    rc = mlxd_cma_cache_parse(buf, got, boot_id, bytes, why, why_n);
  }
  close(fd);
  return rc;
}

int mlxd_cma_cache_write(const char* path, const char* boot_id, size_t* bytes) {
  char text[MLXD_CMA_CACHE_MAX], tmp[256];
  int len = mlxd_cma_cache_format(text, sizeof text, boot_id, *bytes);
  if (len < 0) return -1;
  int k = snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
  if (k < 0 || (size_t)k >= sizeof tmp) return -1;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  bool ok = fchmod(fd, 0600) == 0 && write(fd, text, (size_t)len) == (ssize_t)len;
  ok = close(fd) == 0 && ok;
  int rc = -1;
  if (ok) {
    if (link(tmp, path) == 0) {
      rc = 0;
    } else if (errno == EEXIST) {
      size_t theirs = 0;
      if (mlxd_cma_cache_read(path, boot_id, &theirs, NULL, 0) == 0) {
        *bytes = theirs; /* another process of this boot was first: agree with it */
        rc = 1;
      } else if (rename(tmp, path) == 0) { /* a stale or broken one: replace it */
        rc = 0;
      }
    } else if (rename(tmp, path) == 0) { /* a file system without hard links */
      rc = 0;
    }
  }
  unlink(tmp); /* after link (or a failed rename) it is a second name; after rename, gone */
  return rc;
}

/* ---- once per process ---- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static mlxd_cma_choice g_choice;
static atomic_bool g_ran;

/* The lock that lets one process of the user measure at a time
 * (path.lock, flock): its descriptor, or -1 where it cannot be had (then
 * this process measures without it). */
static int lock_open(const char* path) {
  char lp[160];
  int k = snprintf(lp, sizeof lp, "%s.lock", path);
  if (k < 0 || (size_t)k >= sizeof lp) return -1;
  int fd = open(lp, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0600);
  if (fd < 0) return -1;
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != getuid()) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Measures, and keeps the answer when the measurement was whole. */
static void measure_and_keep(mlxd_cma_choice* c, bool have_boot, const char* boot) {
  c->bytes = mlxd_cma_measure(&c->table, MLXD_CMA_BUDGET_S);
  c->source = MLXD_CMA_FROM_MEASURED;
  /* a refusal or a cut measurement says something of this process or this moment only */
  if (!have_boot || c->table.err || c->table.reps == 0) return;
  size_t v = c->bytes;
  int w = mlxd_cma_cache_write(c->path, boot, &v);
  if (w == 1) {
    c->bytes = v;
    c->source = MLXD_CMA_FROM_CACHE;
  }
  c->cached = w == 0;
}

static void calibrate_once(void) {
  mlxd_cma_choice* c = &g_choice;
  char boot[MLXD_CMA_BOOT_ID_LEN + 1];
  mlxd_cma_cache_path(c->path, sizeof c->path);
  bool have_boot = mlxd_cma_boot_id(boot);
  size_t v = 0;
  if (have_boot && mlxd_cma_cache_read(c->path, boot, &v, NULL, 0) == 0) {
    c->bytes = v;
    c->source = MLXD_CMA_FROM_CACHE;
    atomic_store(&g_ran, true);
    return;
  }
  /* One measures at a time: the ranks of a job that start together would
   * otherwise all measure at once (each mapping 9 MiB, all timing a
   * machine the others keep busy). The others wait for its answer, at most
   * MLXD_CMA_WAIT_S, then measure themselves. */
  int lk = have_boot ? lock_open(c->path) : -1;
  bool locked = lk >= 0 && flock(lk, LOCK_EX | LOCK_NB) == 0;
  const double until = mlxd_now() + MLXD_CMA_WAIT_S;
  while (lk >= 0 && !locked && mlxd_now() < until) {
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
    if (mlxd_cma_cache_read(c->path, boot, &v, NULL, 0) == 0) break;
    locked = flock(lk, LOCK_EX | LOCK_NB) == 0;
  }
  if (have_boot && mlxd_cma_cache_read(c->path, boot, &v, NULL, 0) == 0) {
    c->bytes = v; /* written while this process waited */
    c->source = MLXD_CMA_FROM_CACHE;
  } else {
    measure_and_keep(c, have_boot, boot);
  }
  if (lk >= 0) close(lk); /* and with it the lock */
  atomic_store(&g_ran, true);
}

const mlxd_cma_choice* mlxd_cma_calibrated(void) {
  pthread_once(&g_once, calibrate_once);
  return &g_choice;
}

bool mlxd_cma_calibration_ran(void) { return atomic_load(&g_ran); }

/* The operation record (oprec.h): the history, the last MLXD_OPREC_N ops of
 * this process, written with a few relaxed atomic stores per call (no
 * lock), read seqlock-style, formatted and written by the reader. */
#include "core/oprec.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <time.h>
#include "core/array_impl.h"
#include "core/watchdog.h"
#include "util/status.h"
#include "util/tunables.h"

/* What a reader copies out of a slot. */
typedef struct ent {
  uint64_t h;
  unsigned group;
  uint64_t seq;
  const char* op;
  int dtype;
  size_t bytes;
  int peer;
  int state; /* mlxd_oprec_state */
  int code;
  double t_queued, t_run, t_end; /* rec_now(); 0 = not yet */
} ent;

/* A slot. begin() fills it seqlock-style: every field atomic (relaxed), the
 * tag (handle << 3 | phase) published last; a reader copies the fields
 * between two reads of the tag and keeps the copy only when the tag did not
 * move. running() and end() write one 64-bit stamp each, with one plain
 * store: the low 24 bits of the handle, the result code and the time in
 * milliseconds (stamp(), below), so a stamp a late writer leaves in a slot
 * that a newer op took over names the other op and is ignored by readers.
 * No lock and no read-modify-write after begin()'s handle: the stream
 * workers run at idle priority (stream.c), a lock one of them held while
 * preempted would stall the caller's next op, and a locked instruction per
 * phase cost ~20 ns of every small op (measured: 62 ns for the three calls
 * with compare-and-swap phases, 25 ns with stamps). */
enum { PH_WRITING = 0, PH_QUEUED };
typedef struct slot {
  _Atomic uint64_t tag;
  _Atomic unsigned group;
  _Atomic uint64_t seq;
  _Atomic(const char*) op;
  _Atomic int dtype, peer;
  _Atomic size_t bytes;
  _Atomic double t_queued;
  _Atomic uint64_t run, end; /* stamps; 0: none yet */
} slot;

/* The record's clock: CLOCK_MONOTONIC_COARSE (a few ns; ticks of 1-4 ms,
 * plenty for a record printed in tenths of a second). mlxd_now() costs
 * ~60-80 ns on a VM's kvm-clock, three times per op. */
static double rec_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A stamp: handle's low 24 bits, code (0..255), milliseconds of rec_now()
 * modulo 2^32 (a reader takes differences modulo 2^32 from its own clock:
 * right for any op younger than 24 days). A handle 2^24 ops newer could
 * alias: a writer stalled for 16 million ops of its process. */
#define STAMP_H(h) ((h)&0xffffffu)
static uint64_t stamp(uint64_t h, int code) {
  uint32_t ms = (uint32_t)(uint64_t)(rec_now() * 1000.0);
  uint64_t c = code >= 0 && code <= 255 ? (uint64_t)code : 255;
  return (uint64_t)STAMP_H(h) << 40 | c << 32 | ms;
}
static bool stamp_of(uint64_t s, uint64_t h) { return s != 0 && s >> 40 == STAMP_H(h); }
/* The stamp's time as a rec_now() value, given a reference time near it. */
static double stamp_time(uint64_t s, double ref) {
  uint32_t ref_ms = (uint32_t)(uint64_t)(ref * 1000.0);
  uint32_t back = ref_ms - (uint32_t)s; /* modulo 2^32 */
  /* a stamp written after the reader took ref (a few ms at most) is "now" */
  if (back > UINT32_MAX / 2) back = 0;
  return ref - (double)back * 1e-3;
}

#define TAG(h, ph) (((h) << 3) | (uint64_t)(ph))
#define RLX memory_order_relaxed

/* The history: op h (its handle) in slot h % MLXD_OPREC_N, which the op
 * MLXD_OPREC_N handles later takes over. */
static slot g_history[MLXD_OPREC_N];
static _Atomic uint64_t g_next = 1;
/* The identity in the heading: the largest group seen (the first of that
 * size); changed under g_id_mu (only while groups are being made). */
static pthread_mutex_t g_id_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic unsigned g_id_group;
static _Atomic int g_rank = -1, g_size;
static _Atomic uint64_t g_colls; /* collectives entered on that group (highest seq + 1) */
static atomic_bool g_fail_shown; /* a failure's record was printed; cleared by a success */

uint64_t mlxd_oprec_begin(unsigned group, int rank, int size, uint64_t seq, const char* op,
                          int dtype, size_t bytes, int peer) {
  double now = rec_now();
  uint64_t h = atomic_fetch_add_explicit(&g_next, 1, RLX);
  slot* e = &g_history[h % MLXD_OPREC_N];
  atomic_store_explicit(&e->tag, TAG(h, PH_WRITING), RLX);
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&e->group, group, RLX);
  atomic_store_explicit(&e->seq, seq, RLX);
  atomic_store_explicit(&e->op, op, RLX);
  atomic_store_explicit(&e->dtype, dtype, RLX);
  atomic_store_explicit(&e->peer, peer, RLX);
  atomic_store_explicit(&e->bytes, bytes, RLX);
  atomic_store_explicit(&e->t_queued, now, RLX);
  atomic_store_explicit(&e->tag, TAG(h, PH_QUEUED), memory_order_release);
  if (size > atomic_load_explicit(&g_size, RLX)) {
    pthread_mutex_lock(&g_id_mu);
    if (size > atomic_load_explicit(&g_size, RLX)) {
      atomic_store(&g_id_group, group);
      atomic_store(&g_rank, rank);
      atomic_store(&g_colls, 0);
      atomic_store(&g_size, size);
    }
    pthread_mutex_unlock(&g_id_mu);
  }
  /* A group's ops begin under their stream's lock (ops.c): one writer per
   * group and stream. Two streams of one group queueing collectives at once
   * (their order across ranks is the application's to keep) may leave this
   * count a number behind until the next one; it is the heading's figure. */
  if (peer < 0 && group == atomic_load_explicit(&g_id_group, RLX) &&
      seq + 1 > atomic_load_explicit(&g_colls, RLX))
    atomic_store_explicit(&g_colls, seq + 1, RLX);
  return h;
}

/* Whether slot h still holds op h (else a newer op took it: nothing to do). */
static slot* own_slot(uint64_t h) {
  slot* e = &g_history[h % MLXD_OPREC_N];
  return atomic_load_explicit(&e->tag, RLX) >> 3 == h ? e : NULL;
}

void mlxd_oprec_running(uint64_t h) {
  slot* e = own_slot(h);
  if (e) atomic_store_explicit(&e->run, stamp(h, 0), memory_order_release);
}

void mlxd_oprec_end(uint64_t h, int code) {
  if (code == 0 && atomic_load_explicit(&g_fail_shown, RLX))
    atomic_store_explicit(&g_fail_shown, false, RLX);
  slot* e = own_slot(h);
  if (e) atomic_store_explicit(&e->end, stamp(h, code), memory_order_release);
}

/* Copy slot h's entry into *out; false when it holds another op or kept
 * changing. now: the reader's rec_now(), to place the stamps in time. */
static bool read_slot(uint64_t h, ent* out, double now) {
  const slot* e = &g_history[h % MLXD_OPREC_N];
  for (int tries = 0; tries < 8; tries++) {
    uint64_t t1 = atomic_load_explicit(&e->tag, memory_order_acquire);
    if (t1 >> 3 != h) return false;
    if ((t1 & 7) == PH_WRITING) continue;
    out->h = h;
    out->group = atomic_load_explicit(&e->group, RLX);
    out->seq = atomic_load_explicit(&e->seq, RLX);
    out->op = atomic_load_explicit(&e->op, RLX);
    out->dtype = atomic_load_explicit(&e->dtype, RLX);
    out->peer = atomic_load_explicit(&e->peer, RLX);
    out->bytes = atomic_load_explicit(&e->bytes, RLX);
    out->t_queued = atomic_load_explicit(&e->t_queued, RLX);
    uint64_t run = atomic_load_explicit(&e->run, memory_order_acquire);
    uint64_t end = atomic_load_explicit(&e->end, memory_order_acquire);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&e->tag, RLX) != t1) continue;
    if (out->op == NULL) return false;
    bool ran = stamp_of(run, h), ended = stamp_of(end, h);
    out->code = ended ? (int)(end >> 32 & 0xff) : 0;
    out->t_end = ended ? stamp_time(end, now) : 0;
    /* ended without a run stamp: dropped before it ran (zero time running) */
    out->t_run = ran ? stamp_time(run, now) : ended ? out->t_end : 0;
    /* stamps keep whole milliseconds: never before the (exact) queue time */
    if ((ran || ended) && out->t_run < out->t_queued) out->t_run = out->t_queued;
    if (ended && out->t_end < out->t_run) out->t_end = out->t_run;
    out->state = ended ? (out->code ? MLXD_OPREC_FAILED : MLXD_OPREC_DONE)
                 : ran ? MLXD_OPREC_RUNNING
                       : MLXD_OPREC_QUEUED;
    return true;
  }
  return false;
}

/* ---- formatting (on a snapshot) ---- */

typedef struct snap {
  ent e[MLXD_OPREC_N]; /* oldest first */
  int n;
  int rank, size;
  uint64_t colls;
  unsigned groups; /* how many groups appear (> 1: lines name the group) */
} snap;

static void take(snap* s, double now) {
  uint64_t last = atomic_load_explicit(&g_next, memory_order_acquire) - 1;
  uint64_t first = last >= MLXD_OPREC_N ? last - MLXD_OPREC_N + 1 : 1;
  s->n = 0;
  for (uint64_t h = first; h <= last && h > 0; h++)
    if (read_slot(h, &s->e[s->n], now)) s->n++;
  s->rank = atomic_load(&g_rank);
  s->size = atomic_load(&g_size);
  s->colls = atomic_load(&g_colls);
  s->groups = 0;
  for (int i = 0; i < s->n; i++) {
    bool seen = false;
    for (int j = 0; j < i; j++) seen = seen || s->e[j].group == s->e[i].group;
    if (!seen) s->groups++;
  }
}

/* The note from a snapshot: the oldest op not done, else the last one. */
static void note_of(const snap* s, double now, char* out, size_t n) {
  if (n == 0) return;
  for (int i = 0; i < s->n; i++) {
    const ent* e = &s->e[i];
    if (e->state == MLXD_OPREC_RUNNING) {
      snprintf(out, n, "in %s #%llu for %.1f s", e->op, (unsigned long long)e->seq, now - e->t_run);
      return;
    }
    if (e->state == MLXD_OPREC_QUEUED) {
      snprintf(out, n, "queued %s #%llu for %.1f s", e->op, (unsigned long long)e->seq,
               now - e->t_queued);
      return;
    }
  }
  if (s->n == 0) {
    snprintf(out, n, "idle");
    return;
  }
  const ent* e = &s->e[s->n - 1];
  snprintf(out, n, "%s %s #%llu, %.1f s ago", e->state == MLXD_OPREC_FAILED ? "failed" : "after",
           e->op, (unsigned long long)e->seq, now - e->t_end);
}

void mlxd_oprec_note(char* out, size_t n) {
  snap s;
  double now = rec_now();
  take(&s, now);
  note_of(&s, now, out, n);
}

static const char* code_word(int code) {
  switch (code) {
    case MLXD_EINVAL: return "invalid";
    case MLXD_ETIMEDOUT: return "timed out";
    case MLXD_EREMOTE: return "peer lost";
    case MLXD_ESYS: return "system error";
    case MLXD_ENOMEM: return "out of memory";
    case MLXD_EUNAVAIL: return "unavailable";
    case MLXD_EABORTED: return "aborted";
    case MLXD_ECALLBACK: return "callback failed";
    default: return "failed";
  }
}

typedef struct outbuf {
  char b[MLXD_OPREC_N * 160 + 512];
  size_t len;
} outbuf;

__attribute__((format(printf, 2, 3))) static void put(outbuf* o, const char* fmt, ...) {
  if (o->len >= sizeof o->b) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(o->b + o->len, sizeof o->b - o->len, fmt, ap);
  va_end(ap);
  if (k < 0) return;
  o->len += (size_t)k;
  if (o->len >= sizeof o->b) o->len = sizeof o->b - 1;
}

static void entry_line(outbuf* o, const snap* s, const ent* e, double now) {
  put(o, "[mlxdist]   ");
  if (s->groups > 1) put(o, "g%u ", e->group);
  put(o, "%s #%llu", e->op, (unsigned long long)e->seq);
  if (e->peer >= 0) put(o, " %s %d", strcmp(e->op, "send") == 0 ? "to" : "from", e->peer);
  if (e->dtype >= 0) put(o, " %s", mlxd_dtype_name((mlx_dtype)e->dtype));
  put(o, " %zu B: ", e->bytes);
  switch (e->state) {
    case MLXD_OPREC_QUEUED: put(o, "queued for %.1f s\n", now - e->t_queued); break;
    case MLXD_OPREC_RUNNING:
      put(o, "running for %.1f s (queued %.1f s before)\n", now - e->t_run, e->t_run - e->t_queued);
      break;
    default:
      put(o, "%s%s%s after %.3f s, %.1f s ago\n", e->state == MLXD_OPREC_DONE ? "done" : "failed",
          e->state == MLXD_OPREC_DONE ? "" : ": ",
          e->state == MLXD_OPREC_DONE ? "" : code_word(e->code), e->t_end - e->t_run,
          now - e->t_end);
  }
}

static void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= (size_t)w;
  }
}

static char g_host[64];
static pthread_once_t g_host_once = PTHREAD_ONCE_INIT;

/* The host name, one word (the launcher's table reads it). */
static void fill_host(void) {
  if (gethostname(g_host, sizeof g_host) != 0) g_host[0] = 0;
  g_host[sizeof g_host - 1] = 0;
  for (char* p = g_host; *p; p++)
    if (*p <= ' ' || *p > '~') *p = '?';
  if (!g_host[0]) snprintf(g_host, sizeof g_host, "?");
}

void mlxd_oprec_dump(int fd, const char* why) {
  pthread_once(&g_host_once, fill_host);
  snap s;
  double now = rec_now();
  take(&s, now);
  char note[96];
  note_of(&s, now, note, sizeof note);
  outbuf o;
  o.len = 0;
  put(&o, "[mlxdist] record rank %d/%d pid %ld host %s (%s): %s; colls %llu\n", s.rank, s.size,
      (long)getpid(), g_host, why ? why : "request", note, (unsigned long long)s.colls);
  if (s.n == 0) put(&o, "[mlxdist]   (no operation yet)\n");
  for (int i = 0; i < s.n; i++) entry_line(&o, &s, &s.e[i], now);
  write_all(fd, o.b, o.len);
}

void mlxd_oprec_dump_failure(void) {
  if (!atomic_exchange(&g_fail_shown, true)) mlxd_oprec_dump(2, "failure");
}

/* ---- SIGUSR1 (MLXDIST_DUMP_SIGNAL=1) ---- */

/* Set by the handler, taken by the watchdog thread: a lock-free atomic (safe
 * in a handler, C17 7.14.1.1) rather than a volatile sig_atomic_t, which
 * is not meant to be shared between threads. */
static atomic_int g_sig_flag;
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the signal flag must be lock-free");

static void on_sigusr1(int sig) {
  (void)sig;
  atomic_store(&g_sig_flag, 1); /* all a handler may do here; the watchdog tick prints */
}

static void sig_tick(void* ctx, double now) {
  (void)ctx, (void)now;
  if (!atomic_exchange(&g_sig_flag, 0)) return;
  mlxd_oprec_dump(2, "signal");
}

static void signal_setup_once(void) {
  if (mlxd_tunable_long(MLXD_T_DUMP_SIGNAL) == 0) return;
  struct sigaction old;
  if (sigaction(SIGUSR1, NULL, &old) != 0) return;
  if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
    fprintf(stderr,
            "[mlxdist] warning: MLXDIST_DUMP_SIGNAL=1 but the application handles SIGUSR1 "
            "itself; the operation record is not printed on that signal\n");
    return;
  }
  if (mlxd_watchdog_add(sig_tick, NULL, 0.2) == 0) return; /* it printed why */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigusr1;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, NULL);
}

void mlxd_oprec_signal_setup(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, signal_setup_once);
}

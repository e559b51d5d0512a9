/* The shared-memory transport's segment: creating / joining it, checking
 * the peers' processes, the failure records ranks publish in it, and
 * cross-memory reads (design notes at the top of shm.c). */
#include "transport/cma_calib.h"
#include "transport/shm.h"
#include "transport/shm_impl.h"
#include "transport/spin.h"

#include <dirent.h>

#include "core/oprec.h"
#include "core/watchdog.h"
#include "util/ztable.h"

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* The inode of this process's pid namespace, 0 where it cannot be read:
 * pids in a pair's name mean something only to a process of that namespace. */
static uint64_t own_pidns(void) {
  struct stat sb;
  return stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

/* Whether process pid is gone (no such process, or a zombie). */
bool mlxd_shm_pid_dead(pid_t pid) {
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

/* Rank r's published failure into st, reported by r unless r relays one
 * itself (mlxd_fail_rec_read validates it). Returns the code. */
int mlxd_shm_fail_read(shm_transport* t, int r, mlxd_status* st) {
  return mlxd_fail_rec_read(&rank_rec(t, r)->fail, MLXD_LAYER_SHM, t->name_limit, shm_name(t, r),
                            st);
}

/* ---- heartbeats (liveness.h) ---- */

static void shm_beat_tick(void* ctx, double now) {
  (void)now;
  shm_transport* t = ctx;
  char note[MLXD_NOTE_MAX] = {0};
  mlxd_oprec_note(note, sizeof note);
  note[sizeof note - 1] = '\0';
  shm_rank_rec* me = rank_rec(t, t->base.rank);
  for (size_t i = 0; i < MLXD_NOTE_MAX / 8; i++) {
    uint64_t w;
    memcpy(&w, note + 8 * i, 8);
    atomic_store_explicit(&me->note[i], w, memory_order_relaxed);
  }
  atomic_fetch_add_explicit(&me->beat, 1, memory_order_release);
}

void mlxd_shm_live_start(shm_transport* t) {
  if (t->base.size > 1) t->watch = mlxd_watchdog_add(shm_beat_tick, t, t->live.beat_s);
}

void mlxd_shm_live_stop(shm_transport* t) {
  mlxd_watchdog_remove(t->watch);
  t->watch = 0;
}

void mlxd_shm_note_read(shm_transport* t, int r, char* out, size_t n) {
  unsigned char raw[MLXD_NOTE_MAX];
  shm_rank_rec* rec = rank_rec(t, r);
  for (size_t i = 0; i < MLXD_NOTE_MAX / 8; i++) {
    uint64_t w = atomic_load_explicit(&rec->note[i], memory_order_relaxed);
    memcpy(raw + 8 * i, &w, 8);
  }
  mlxd_live_note_clean(out, n, raw, sizeof raw);
}

/* ---- CMA ---- */

/* The calibration times the lane path this transport has (cma_calib.h). */
_Static_assert(MLXD_CMA_SLOT_BYTES == SHM_SLOT_BYTES && MLXD_CMA_NSLOTS == SHM_NSLOTS,
               "cma_calib.h's lane is not the shared-memory transport's");

int mlxd_shm_cma_read(pid_t pid, void* dst, uint64_t src, size_t n, int* err) {
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

/* Whether a rank published a failure since *seen (the failure counter
 * moved): then st is the first such rank's status. One load otherwise. */
static bool join_failed(shm_transport* t, uint32_t* seen, mlxd_status* st) {
  uint32_t nf = atomic_load_explicit(&t->hdr->nfailed, memory_order_acquire);
  if (nf == *seen) return false;
  *seen = nf;
  for (int r = 0; r < t->base.size; r++)
    if (r != t->base.rank &&
        atomic_load_explicit(&rank_rec(t, r)->state, memory_order_acquire) == RANK_FAILED) {
      mlxd_shm_fail_read(t, r, st);
      return true;
    }
  return false;
}

/* Whether one of the SHM_JOIN_WATCH ranks after this one that counted in
 * (within SHM_JOIN_SCAN records) has exited: then st says so. */
static bool join_watch_dead(shm_transport* t, mlxd_status* st) {
  int size = t->base.size, found = 0;
  for (int k = 1; k <= SHM_JOIN_SCAN && k < size && found < SHM_JOIN_WATCH; k++) {
    int r = (t->base.rank + k) % size;
    pid_t pid = atomic_load(&rank_rec(t, r)->pid);
    if (pid <= 0) continue; /* not there yet: the join's deadline bounds it */
    found++;
    if (!mlxd_shm_pid_dead(pid)) continue;
    char addr[24];
    snprintf(addr, sizeof addr, "pid %d", (int)pid);
    mlxd_match_lost(st, MLXD_LAYER_SHM, shm_name(t, r), addr,
                    ": its process exited while joining shared memory", NULL, 0);
    return true;
  }
  return false;
}

/* Wait until *counter reaches want (bounded), asleep on it as a futex: the
 * rank that completes the count wakes the others, and so does a rank that
 * fails (it publishes its failure first). Every wake-up looks at the
 * failure counter (one load; the ranks' states only when it moved); every
 * t->eng.check_s this rank also watches the few ranks after it
 * (join_watch_dead): a wait of N ranks costs O(1) per check, and the job's
 * waiters together look at each rank about SHM_JOIN_WATCH times. */
static int wait_count(shm_transport* t, _Atomic uint32_t* counter, uint32_t want, double deadline,
                      const char* what, mlxd_status* st) {
  double last_check = mlxd_now();
  uint32_t seen_failed = 0;
  for (;;) {
    uint32_t c = atomic_load_explicit(counter, memory_order_acquire);
    if (c >= want) return 0;
    if (join_failed(t, &seen_failed, st)) return st->code;
    double now = mlxd_now();
    if (now >= deadline) {
      char missing[160] = "";
      size_t len = 0;
      for (int r = 0; r < t->base.size && len < sizeof missing - 12; r++)
        if (atomic_load(&rank_rec(t, r)->state) == RANK_NONE)
          len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? ", " : "", r);
      return mlxd_fail_at(st, MLXD_ETIMEDOUT, MLXD_LAYER_SHM,
                          "rank %d timed out after %g s (MLXDIST_CONNECT_TIMEOUT) waiting for "
                          "every rank to %s shared memory %s%s%s",
                          shm_name(t, t->base.rank), mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT),
                          what, t->path, len ? "; missing ranks: " : "", missing);
    }
    if (now - last_check >= t->eng.check_s) {
      last_check = now;
      if (join_watch_dead(t, st)) return st->code;
    }
    double left = deadline - now, nap = t->eng.check_s - (now - last_check);
    if (nap > left) nap = left;
    if (nap < 1e-4) nap = 1e-4;
    struct timespec ts = {(time_t)nap, (long)((nap - (double)(time_t)nap) * 1e9)};
    syscall(SYS_futex, (uint32_t*)counter, FUTEX_WAIT, c, &ts, NULL, 0);
  }
}

/* Count this rank in at *counter (of want): the last wakes the waiters.
 * Returns whether this rank was the last. */
static bool count_in(_Atomic uint32_t* counter, uint32_t want) {
  if (atomic_fetch_add(counter, 1) + 1 != want) return false;
  syscall(SYS_futex, (uint32_t*)counter, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
  return true;
}

/* Create the host segment or open it. Whichever rank gets there first
 * creates it (O_EXCL picks one) and initialises it; the others open it at
 * once: before, only rank 0 created it and every rank that arrived first
 * slept and retried shm_open until it did (at 256 ranks on 2 cores ~30
 * sleeps, each a context switch and a failed open, per rank). An opened
 * segment must be this user's, mode 0600, and of the group's size (or not
 * sized yet: its creator is a few system calls from done, so that short
 * wait sleeps), and carry the magic its creator stores last. */
static int open_segment(shm_transport* t, size_t total, double deadline, mlxd_status* st) {
  int fd = -1;
  bool creator = false;
  long us = 20;
  for (;;) {
    fd = shm_open(t->path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) {
      creator = true;
      if (ftruncate(fd, (off_t)total) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(t->path);
        mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_SHM, "could not size shared memory %s to %zu bytes",
                     t->path, total);
        mlxd_status_set_sys(st, "ftruncate", e);
        return st->code;
      }
      break;
    }
    if (errno != EEXIST) {
      int e = errno;
      mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_SHM, "rank %d could not create shared memory %s",
                   shm_name(t, t->base.rank), t->path);
      mlxd_status_set_sys(st, "shm_open", e);
      return st->code;
    }
    fd = shm_open(t->path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0 && errno != ENOENT) {
      int e = errno;
      mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_SHM, "rank %d could not open shared memory %s",
                   shm_name(t, t->base.rank), t->path);
      mlxd_status_set_sys(st, "shm_open", e);
      return st->code;
    }
    if (fd >= 0) { /* else removed between the two calls (a rank failed): make it anew */
      struct stat sb;
      if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_SHM, "rank %d could not inspect shared memory %s",
                     shm_name(t, t->base.rank), t->path);
        mlxd_status_set_sys(st, "fstat", e);
        return st->code;
      }
      if (sb.st_uid != geteuid() || (sb.st_mode & 0777) != 0600) {
        close(fd);
        return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_SHM,
                            "shared memory %s is not this job's (owner uid %d, mode %03o; "
                            "expected uid %d, mode 600): refusing it",
                            t->path, (int)sb.st_uid, (unsigned)(sb.st_mode & 0777), (int)geteuid());
      }
      if ((size_t)sb.st_size == total) break;
      close(fd);
      fd = -1;
      if (sb.st_size != 0)
        return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_SHM,
                            "shared memory %s has %lld bytes but rank %d expected %zu "
                            "(do all ranks agree on the group size %d?)",
                            t->path, (long long)sb.st_size, shm_name(t, t->base.rank), total,
                            t->base.size);
    }
    if (mlxd_now() >= deadline)
      return mlxd_fail_at(st, MLXD_ETIMEDOUT, MLXD_LAYER_SHM,
                          "rank %d could not open shared memory %s within %g s "
                          "(MLXDIST_CONNECT_TIMEOUT): its creator never sized it",
                          shm_name(t, t->base.rank), t->path,
                          mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT));
    sleep_us(us);
    if (us < 2000) us *= 2;
  }
  void* m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (m == MAP_FAILED) {
    if (creator) shm_unlink(t->path);
    mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_SHM, "could not map %zu bytes of shared memory %s",
                 total, t->path);
    mlxd_status_set_sys(st, "mmap", e);
    return st->code;
  }
  t->map = m;
  t->map_len = total;
  t->hdr = (shm_hdr*)m;
  if (creator) {
    t->hdr->version = SHM_VERSION;
    t->hdr->size = (uint32_t)t->base.size;
    t->hdr->slot_bytes = SHM_SLOT_BYTES;
    t->hdr->nslots = SHM_NSLOTS;
    t->hdr->total = total;
    atomic_store_explicit(&t->hdr->magic, SHM_MAGIC, memory_order_release);
  } else {
    us = 20;
    while (atomic_load_explicit(&t->hdr->magic, memory_order_acquire) != SHM_MAGIC) {
      if (mlxd_now() >= deadline)
        return mlxd_fail_at(st, MLXD_ETIMEDOUT, MLXD_LAYER_SHM,
                            "shared memory %s was never initialised by its creator within %g s "
                            "(MLXDIST_CONNECT_TIMEOUT)",
                            t->path, mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT));
      sleep_us(us);
      if (us < 2000) us *= 2;
    }
    if (t->hdr->version != SHM_VERSION || t->hdr->size != (uint32_t)t->base.size ||
        t->hdr->slot_bytes != SHM_SLOT_BYTES || t->hdr->nslots != SHM_NSLOTS ||
        t->hdr->total != total)
      return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_SHM,
                          "shared memory %s was made for %u ranks (layout version %u) but rank "
                          "%d expected %d ranks (version %u)",
                          t->path, t->hdr->size, t->hdr->version, shm_name(t, t->base.rank),
                          t->base.size, SHM_VERSION);
  }
  return 0;
}

/* ---- stale pair names ----
 *
 * A pair's name lives from its creator's shm_open until the second rank
 * maps it (or a rank's destroy removes it: mlxd_shm_pair_release_all). If
 * both ranks die in between (killed), nobody of the session is left to
 * remove it. So the first session a process starts as rank 0 removes, once,
 * every name in /dev/shm of a pair (the '~' suffix of pair_name) that is
 * this user's 0600 file, whose two processes are both gone, and that is
 * older than SHM_SWEEP_AGE_TIMEOUTS x MLXDIST_CONNECT_TIMEOUT, and whose
 * ranks were both in this process's pid namespace (the name says which: a
 * live pair in another namespace sharing /dev/shm, e.g. containers with
 * --ipc=host, looks gone from here, so it is never touched; nor is a pair
 * whose two ranks were in different namespaces, named with 0). A leaked
 * name lasts at most until the next job on the host. */
/* A decimal field of a name in /dev/shm (anyone may create one): digits
 * only, no sign, at most 10 of them, value <= max; *p moves past it. */
static bool name_num(const char** p, long long max, long long* out) {
  const char* s = *p;
  long long v = 0;
  int n = 0;
  for (; *s >= '0' && *s <= '9'; s++, n++) {
    if (n == 10) return false;
    v = v * 10 + (*s - '0');
  }
  if (n == 0 || v > max) return false;
  *p = s;
  *out = v;
  return true;
}

/* "~<lo>-<hi>~<pid lo>-<pid hi>~<pid namespace, hex>" at the end of name. */
static bool parse_pair_suffix(const char* name, pid_t* a, pid_t* b, uint64_t* ns) {
  const char* s = strchr(name, '~');
  if (!s || s == name) return false;
  long long lo, hi, pa, pb;
  s++;
  if (!name_num(&s, INT32_MAX, &lo) || *s++ != '-' || !name_num(&s, INT32_MAX, &hi) ||
      *s++ != '~' || !name_num(&s, INT32_MAX, &pa) || *s++ != '-' ||
      !name_num(&s, INT32_MAX, &pb) || *s++ != '~')
    return false;
  uint64_t v = 0;
  int n = 0;
  for (; *s; s++, n++) {
    int d = (*s >= '0' && *s <= '9') ? *s - '0' : (*s >= 'a' && *s <= 'f') ? *s - 'a' + 10 : -1;
    if (d < 0 || n == 16) return false;
    v = v << 4 | (uint64_t)d;
  }
  if (n == 0 || hi <= lo || pa <= 0 || pb <= 0) return false;
  *a = (pid_t)pa;
  *b = (pid_t)pb;
  *ns = v;
  return true;
}

static void sweep_stale_pairs(void) {
  DIR* d = opendir("/dev/shm");
  if (!d) return; /* nothing to sweep where there is no /dev/shm to read */
  double age = SHM_SWEEP_AGE_TIMEOUTS * mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  uid_t me = geteuid();
  uint64_t pidns = own_pidns();
  if (!pidns) {
    closedir(d);
    return; /* whose pids the names hold cannot be told */
  }
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    pid_t a, b;
    uint64_t ns;
    if (!parse_pair_suffix(e->d_name, &a, &b, &ns) || ns == 0 || ns != pidns) continue;
    struct stat sb;
    if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(sb.st_mode) || sb.st_uid != me || (sb.st_mode & 0777) != 0600) continue;
    if ((double)(now.tv_sec - sb.st_ctim.tv_sec) < age) continue;
    if (!mlxd_shm_pid_dead(a) || !mlxd_shm_pid_dead(b)) continue;
    char path[NAME_MAX + 2];
    snprintf(path, sizeof path, "/%s", e->d_name);
    shm_unlink(path);
  }
  closedir(d);
}

static pthread_once_t g_sweep_once = PTHREAD_ONCE_INIT;

static mlxd_transport* join(int rank, int size, const char* name, const int* names, int name_limit,
                            int machine_ranks, const void* boot_mine, void* boot_all,
                            mlxd_status* st);

mlxd_transport* mlxd_shm_transport_new(int rank, int size, const char* name, mlxd_status* st) {
  return join(rank, size, name, NULL, size, size, NULL, NULL, st);
}

mlxd_transport* mlxd_shm_transport_new_named(int rank, int size, const char* name, const int* names,
                                             int name_limit, int machine_ranks, mlxd_status* st) {
  return join(rank, size, name, names, name_limit, machine_ranks, NULL, NULL, st);
}

mlxd_transport* mlxd_shm_transport_join(int rank, int size, const char* name, const void* mine,
                                        void* all, mlxd_status* st) {
  return join(rank, size, name, NULL, size, size, mine, all, st);
}

static mlxd_transport* join(int rank, int size, const char* name, const int* names, int name_limit,
                            int machine_ranks, const void* boot_mine, void* boot_all,
                            mlxd_status* st) {
  mlxd_status local;
  if (!st) st = &local;
  if (size < 1 || size > 4096 || rank < 0 || rank >= size) {
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_SHM,
                 "rank %d / size %d is not valid; expected 1 <= size <= 4096 and 0 <= rank < "
                 "size",
                 rank, size);
    return NULL;
  }
  if (!name || !valid_name(name)) {
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_SHM,
                 "session name \"%s\" is not valid; expected 1 to %d letters, digits, '-', '_' "
                 "or '.' (not starting with '.')",
                 name ? name : "(null)", SHM_NAME_MAX);
    return NULL;
  }
  shm_transport* t = calloc(1, sizeof *t);
  if (!t) {
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_SHM, "out of memory creating the transport");
    return NULL;
  }
  t->base.ops = &mlxd_shm_ops;
  t->base.pipeline_chunk = SHM_PIPELINE_CHUNK;
  t->base.rank = rank;
  t->base.size = size;
  t->name_limit = size;
  atomic_init(&t->mu.v, 0);
  mlxd_shm_engine_init(t);
  if (names) {
    t->names = malloc((size_t)size * sizeof *t->names);
    if (!t->names) {
      mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_SHM, "out of memory creating the transport");
      mlxd_shm_destroy(&t->base);
      return NULL;
    }
    memcpy(t->names, names, (size_t)size * sizeof *t->names);
    t->name_limit = name_limit;
    t->eng.me = shm_name(t, rank);
  }
  snprintf(t->path, sizeof t->path, "/%s", name);
  mlxd_live_cfg_load(&t->live);
  const int here = machine_ranks > size ? machine_ranks : size; /* ranks on this host */
  mlxd_spin_rule spin = mlxd_spin_rule_for(here);
  t->eng.spin_s = spin.spin_s;
  t->oversubscribed = spin.yield;
  t->eng.yield = spin.yield;
  t->eng.check_s = here > SHM_CROWDED_FACTOR * spin.cpus ? SHM_CHECK_CROWDED_S : SHM_CHECK_S;
  /* The ranks of a host need not agree on cma_min (two that calibrated at
   * once may not; MLXDIST_SHM_CMA_BYTES may differ between them): each
   * message's path is its sender's choice, said in its slot (SLOT_RTS or
   * data), and a receiver takes either whatever its own threshold. A sender
   * picks the single copy only where its peer probed it (pair_probe, made
   * only by a rank with a threshold) and found it allowed, so a receiver
   * without one is never asked to read. A difference costs speed in one
   * direction, never correctness; whole_min (the one rule the ranks must
   * share) does not depend on it. A group of one never sends: no
   * calibration. */
  t->cma_min = size > 1 ? mlxd_shm_cma_bytes_for(spin.crowded) : 0;
  t->cma_p2p_min = size > 1 ? mlxd_shm_cma_p2p_bytes_for(spin.crowded) : 0;
  /* a page of entries is touched only when a peer on it is first used */
  t->peers = mlxd_ztable_new((size_t)size, sizeof *t->peers);
  t->active = calloc((size_t)size, sizeof *t->active);
  if (!t->peers || !t->active) {
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_SHM, "out of memory creating the transport");
    mlxd_shm_destroy(&t->base);
    return NULL;
  }
  if (rank == 0) pthread_once(&g_sweep_once, sweep_stale_pairs);
  double deadline = mlxd_now() + mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT);
  size_t total = total_bytes(size);
  bool unlinked = false;
  if (open_segment(t, total, deadline, st) != 0) goto fail;

  /* Count in; the last rank to arrive unlinks the name. */
  shm_rank_rec* me = rank_rec(t, rank);
  t->probe = ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)t ^ 0x9e3779b97f4a7c15ull;
  me->probe_addr = (uint64_t)(uintptr_t)&t->probe;
  me->probe_val = t->probe;
  me->pidns = t->pidns = own_pidns();
  if (atomic_load(&me->state) != RANK_NONE) {
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_SHM,
                 "rank %d of shared memory %s was already taken by process %d; expected every "
                 "rank exactly once",
                 rank, t->path, (int)atomic_load(&me->pid));
    goto fail;
  }
  atomic_store(&me->pid, (int32_t)getpid());
  /* Published by the count-in below, like the record; read after it. */
  if (!spin.crowded) atomic_store(&t->hdr->roomy, 1);
  if (boot_mine) /* published by the state store and the count-in */
    memcpy(boot_rec(t, rank), boot_mine, MLXD_SHM_BOOT_BYTES);
  atomic_store_explicit(&me->state, RANK_ATTACHED, memory_order_release);
  if (count_in(&t->hdr->attached, (uint32_t)size)) {
    shm_unlink(t->path);
    unlinked = true;
  }
  if (wait_count(t, &t->hdr->attached, (uint32_t)size, deadline, "map", st) != 0) goto fail;
  unlinked = true; /* someone did it */
  /* every rank wrote its record before it counted in; the count's acquire load saw it */
  if (boot_all) memcpy(boot_all, boot_rec(t, 0), (size_t)size * MLXD_SHM_BOOT_BYTES);
  /* Whole blocks only if every rank is crowded: one answer for all. */
  t->base.whole_min = atomic_load(&t->hdr->roomy) ? 0 : MLXD_SHM_WHOLE_CROWDED_BYTES;

  /* Cross-memory attach is probed per pair when it is first mapped
   * (mlxd_shm_pair_attach), and only by a rank that may use it. A peer's
   * record is read when the pair is first used (mlxd_shm_peer_ident). */
  mlxd_shm_live_start(t);
  return &t->base;

fail:
  if (!unlinked) shm_unlink(t->path);
  if (t->map) {
    shm_rank_rec* mine = rank_rec(t, rank);
    if (atomic_load(&mine->pid) == (int32_t)getpid()) {
      mlxd_fail_rec_fill(&mine->fail, st);
      atomic_store_explicit(&mine->state, RANK_FAILED, memory_order_release);
      atomic_fetch_add(&t->hdr->nfailed, 1);
      /* ranks still joining sleep on the count: they relay this at once */
      syscall(SYS_futex, (uint32_t*)&t->hdr->attached, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
    munmap(t->map, t->map_len);
    t->map = NULL;
  }
  mlxd_shm_destroy(&t->base);
  return NULL;
}

/* ---- pairs: lanes made on first contact ---- */

void mlxd_shm_peer_ident_slow(shm_transport* t, int pi) {
  shm_peer* p = &t->peers[pi];
  shm_rank_rec* rec = rank_rec(t, pi);
  p->pid = (pid_t)atomic_load(&rec->pid);
  /* published before its count-in, which this rank's join acquired */
  p->pidns = rec->pidns;
  snprintf(p->addr, sizeof p->addr, "pid %d", (int)p->pid);
  p->known = true;
}

/* The pair's segment name: the session's + "~<lo>-<hi>~<pid lo>-<pid hi>"
 * (session ranks, their processes; '~' is in no session name, so the
 * suffix reads back unambiguously: sweep_stale_pairs). As unguessable as
 * the session's name (64 random bits from rank 0). */
static void pair_name(const shm_transport* t, int pi, char* out, size_t n) {
  int me = t->base.rank;
  int lo = me < pi ? me : pi, hi = me < pi ? pi : me;
  pid_t plo = me < pi ? getpid() : t->peers[pi].pid, phi = me < pi ? t->peers[pi].pid : getpid();
  /* both ranks' pid namespace when it is one (both compute the same name), else 0: never swept */
  uint64_t ns = t->pidns == t->peers[pi].pidns ? t->pidns : 0;
  snprintf(out, n, "%s~%d-%d~%d-%d~%llx", t->path, lo, hi, (int)plo, (int)phi,
           (unsigned long long)ns);
}

/* This rank's view of whether it can read pi's memory through CMA (its
 * probe value), said in the pair's header for pi's sends. */
static void pair_probe(shm_transport* t, int pi, shm_pair_hdr* h, bool low) {
  if (!t->cma_min && !t->cma_p2p_min)
    return; /* this rank never reads through CMA: its peer need not know */
  shm_rank_rec* rec = rank_rec(t, pi);
  uint64_t v = 0;
  int err = 0;
  bool ok = mlxd_shm_cma_read(t->peers[pi].pid, &v, rec->probe_addr, sizeof v, &err) == 0 &&
            v == rec->probe_val;
  atomic_store_explicit(&h->reads[low ? 0 : 1], ok ? CMA_OK : CMA_NO, memory_order_release);
}

/* Whether peer pi gave up (published a failure) or exited; if so st says
 * so (what: what this rank was doing). */
static bool pair_peer_gone(shm_transport* t, int pi, const char* what, mlxd_status* st) {
  shm_rank_rec* rec = rank_rec(t, pi);
  if (atomic_load_explicit(&rec->state, memory_order_acquire) == RANK_FAILED) {
    mlxd_shm_fail_read(t, pi, st);
    return true;
  }
  if (!mlxd_shm_pid_dead(t->peers[pi].pid)) return false;
  char why[SHM_PAIR_NAME_MAX + 64];
  snprintf(why, sizeof why, ": its process exited while %s", what);
  mlxd_match_lost(st, MLXD_LAYER_SHM, shm_name(t, pi), t->peers[pi].addr, why, NULL, 0);
  return true;
}

/* Sleep a little while a pair's creator finishes, with t->mu dropped when
 * drop (transport.h: ops never sleep under it); false (st set) once pi is
 * gone or the deadline passed. With drop, the caller re-checks what another
 * thread may have done meanwhile (pair_recheck). */
static bool pair_wait_step(shm_transport* t, int pi, const char* name, double deadline, long* us,
                           bool drop, mlxd_status* st) {
  if (pair_peer_gone(t, pi, "making the shared memory of this pair", st)) {
    /* nobody else will ever use the name of a pair with a dead rank */
    if (mlxd_shm_pid_dead(t->peers[pi].pid)) shm_unlink(name);
    return false;
  }
  if (mlxd_now() >= deadline) {
    mlxd_fail_at(st, MLXD_ETIMEDOUT, MLXD_LAYER_SHM,
                 "rank %d made shared memory %s for its pair with rank %d but did not finish "
                 "it within %g s (MLXDIST_CONNECT_TIMEOUT)",
                 shm_name(t, pi), name, shm_name(t, t->base.rank),
                 mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT));
    mlxd_status_set_peer(st, shm_name(t, pi), t->peers[pi].addr);
    return false;
  }
  if (drop) shm_lock_release(&t->mu);
  sleep_us(*us);
  if (drop) shm_lock_acquire(&t->mu);
  if (*us < 2000) *us *= 2;
  return true;
}

/* After a sleep with t->mu dropped: 1 if the transport failed meanwhile
 * (abort, or another thread's failure: st is it), 2 if another thread
 * mapped the pair meanwhile (another op to pi, or progress reading pi's
 * hello), 0 if this thread goes on. */
static int pair_recheck(shm_transport* t, int pi, mlxd_status* st) {
  if (t->eng.err.code) {
    *st = t->eng.err;
    return 1;
  }
  return t->peers[pi].mapped ? 2 : 0;
}

static int pair_sys_fail(shm_transport* t, int pi, const char* call, int e, const char* what,
                         const char* name, mlxd_status* st) {
  mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_SHM,
               "rank %d could not %s shared memory %s for its pair "
               "with rank %d",
               shm_name(t, t->base.rank), what, name, shm_name(t, pi));
  mlxd_status_set_sys(st, call, e);
  mlxd_status_set_peer(st, shm_name(t, pi), t->peers[pi].addr);
  return st->code;
}

int mlxd_shm_pair_attach(shm_transport* t, int pi, bool drop, mlxd_status* st) {
  shm_peer* p = &t->peers[pi];
  if (p->mapped) return 0;
  mlxd_shm_peer_ident(t, pi);
  char name[SHM_PAIR_NAME_MAX];
  pair_name(t, pi, name, sizeof name);
  const size_t total = pair_bytes();
  const uint32_t lo = (uint32_t)(t->base.rank < pi ? t->base.rank : pi);
  const uint32_t hi = (uint32_t)(t->base.rank < pi ? pi : t->base.rank);
  double deadline = mlxd_now() + mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT);
  long us = 20;
  bool creator = false;
  int fd = -1;
  /* Both ranks may start at once: O_EXCL makes exactly one the creator. */
  for (;;) {
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) {
      creator = true;
      if (ftruncate(fd, (off_t)total) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        return pair_sys_fail(t, pi, "ftruncate", e, "size", name, st);
      }
      break;
    }
    if (errno != EEXIST) return pair_sys_fail(t, pi, "shm_open", errno, "create", name, st);
    fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
      if (errno != ENOENT) return pair_sys_fail(t, pi, "shm_open", errno, "open", name, st);
      continue; /* removed between the two calls (its creator closed): make it anew */
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
      int e = errno;
      close(fd);
      return pair_sys_fail(t, pi, "fstat", e, "inspect", name, st);
    }
    /* Only this user's 0600 segment of the right size is a pair's. */
    if (sb.st_uid != geteuid() || (sb.st_mode & 0777) != 0600 ||
        (sb.st_size != 0 && (size_t)sb.st_size != total)) {
      close(fd);
      mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_SHM,
                   "shared memory %s for the pair of ranks %d and %d is not theirs (owner uid "
                   "%d, mode %03o, %lld bytes; expected uid %d, mode 600, %zu bytes): refusing "
                   "it",
                   name, shm_name(t, t->base.rank), shm_name(t, pi), (int)sb.st_uid,
                   (unsigned)(sb.st_mode & 0777), (long long)sb.st_size, (int)geteuid(), total);
      mlxd_status_set_peer(st, shm_name(t, pi), t->peers[pi].addr);
      return st->code;
    }
    if ((size_t)sb.st_size == total) break;
    close(fd); /* its creator has not sized it yet */
    fd = -1;
    if (!pair_wait_step(t, pi, name, deadline, &us, drop, st)) return st->code;
    if (drop) {
      int again = pair_recheck(t, pi, st);
      if (again) return again == 1 ? st->code : 0;
    }
  }
  void* m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (m == MAP_FAILED) {
    if (creator) shm_unlink(name);
    return pair_sys_fail(t, pi, "mmap", e, "map", name, st);
  }
  shm_pair_hdr* h = m;
  if (creator) {
    h->version = SHM_VERSION;
    h->lo = lo;
    h->hi = hi;
    h->slot_bytes = SHM_SLOT_BYTES;
    h->nslots = SHM_NSLOTS;
    h->total = total;
    atomic_store_explicit(&h->magic, SHM_PAIR_MAGIC, memory_order_release);
  } else {
    while (atomic_load_explicit(&h->magic, memory_order_acquire) != SHM_PAIR_MAGIC) {
      if (!pair_wait_step(t, pi, name, deadline, &us, drop, st)) {
        munmap(m, total);
        return st->code;
      }
      int again = drop ? pair_recheck(t, pi, st) : 0;
      if (again) {
        munmap(m, total); /* not counted in: the thread that mapped it did */
        return again == 1 ? st->code : 0;
      }
    }
    if (h->version != SHM_VERSION || h->lo != lo || h->hi != hi ||
        h->slot_bytes != SHM_SLOT_BYTES || h->nslots != SHM_NSLOTS || h->total != total) {
      mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_SHM,
                   "shared memory %s was made for ranks %u and %u (layout version %u) but rank "
                   "%d expected ranks %u and %u (version %u)",
                   name, h->lo, h->hi, h->version, shm_name(t, t->base.rank), lo, hi, SHM_VERSION);
      mlxd_status_set_peer(st, shm_name(t, pi), t->peers[pi].addr);
      munmap(m, total);
      return st->code;
    }
  }
  bool low = (uint32_t)t->base.rank == lo;
  int out = low ? 0 : 1, in = low ? 1 : 0; /* lane 0: lo -> hi, lane 1: hi -> lo */
  p->pair_map = m;
  p->out = pair_ctl(m, out);
  p->in = pair_ctl(m, in);
  p->out_hdrs = pair_hdrs(m, out);
  p->in_hdrs = pair_hdrs(m, in);
  p->out_slots = pair_data(m, out);
  p->in_slots = pair_data(m, in);
  p->peer_reads = &h->reads[low ? 1 : 0];
  pair_probe(t, pi, h, low);
  p->mapped = true;
  t->active[t->nactive++] = pi;
  if (atomic_fetch_add(&h->attached, 1) + 1 == 2) {
    shm_unlink(name);
    p->unlinked = true;
  }
  if (creator) {
    /* Tell pi (it maps the pair at its next progress, so what this rank
     * sends is drained as before, receive or not). */
    size_t w = (size_t)t->base.rank / 64;
    atomic_fetch_or(&hello_bits(t, pi)[w], (uint64_t)1 << (t->base.rank % 64));
    atomic_fetch_add(&rank_rec(t, pi)->hello, 1);
    shm_rank_rec* rec = rank_rec(t, pi);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&rec->sleepers) != 0) {
      atomic_fetch_add(&rec->doorbell, 1);
      syscall(SYS_futex, (uint32_t*)&rec->doorbell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
  }
  return 0;
}

int mlxd_shm_pair_hellos(shm_transport* t) {
  shm_rank_rec* me = rank_rec(t, t->base.rank);
  uint32_t h = atomic_load_explicit(&me->hello, memory_order_acquire);
  if (h == t->hello_seen) return 0;
  t->hello_seen = h;
  _Atomic uint64_t* bits = hello_bits(t, t->base.rank);
  for (size_t w = 0; w < hello_words(t->base.size); w++) {
    uint64_t v = atomic_exchange(&bits[w], 0);
    while (v) {
      int b = __builtin_ctzll(v);
      v &= v - 1;
      int pi = (int)(w * 64) + b;
      if (pi >= t->base.size || pi == t->base.rank || t->peers[pi].mapped) continue;
      mlxd_status s;
      /* pi made the pair and wrote its magic before it set this bit: no
       * wait, so mu stays held (progress is mid-pass) */
      if (mlxd_shm_pair_attach(t, pi, false, &s) != 0) {
        /* this bit and those not yet handled go back, so the failure wakes those peers
         * and the end removes their pairs' names (pair_release_all reads them) */
        atomic_fetch_or(&bits[w], v | (uint64_t)1 << b);
        mlxd_shm_fail(t, &s);
        return -1;
      }
    }
  }
  return 0;
}

/* A pair's name stays until both ranks counted in. At the end a rank removes
 * the names of pairs a peer made that it never mapped (its hello bits: the
 * creator sets them right after making the pair), and of pairs it made whose
 * peer is gone or closed; a live peer removes the rest itself (it sets its
 * state to closed before it reads its bits, this rank sets the bit before it
 * reads the state: one of them sees the other). */
static void pair_release(shm_transport* t, int pi) {
  _Atomic uint64_t* bits = hello_bits(t, t->base.rank);
  shm_peer* p = &t->peers[pi];
  bool told = atomic_load(&bits[pi / 64]) & ((uint64_t)1 << (pi % 64));
  if (p->mapped && !p->unlinked) {
    int s = atomic_load(&rank_rec(t, pi)->state);
    told = told || s != RANK_ATTACHED || mlxd_shm_pid_dead(p->pid);
  }
  if (p->mapped) {
    munmap(p->pair_map, pair_bytes());
    p->pair_map = NULL;
    p->mapped = false;
  }
  if (told && !p->unlinked) {
    char name[SHM_PAIR_NAME_MAX];
    mlxd_shm_peer_ident(t, pi); /* a pair made by pi that this rank never mapped */
    pair_name(t, pi, name, sizeof name);
    shm_unlink(name);
    p->unlinked = true;
  }
}

/* The pairs this rank mapped (t->active), then those its hello bits name
 * and it never mapped; no other peer has a pair with it, so the rest of
 * the peer table and the other ranks' records are never touched. */
void mlxd_shm_pair_release_all(shm_transport* t) {
  if (!t->peers || !t->map) return;
  for (int k = 0; k < t->nactive; k++) pair_release(t, t->active[k]);
  t->nactive = 0;
  _Atomic uint64_t* bits = hello_bits(t, t->base.rank);
  for (size_t w = 0; w < hello_words(t->base.size); w++) {
    uint64_t v = atomic_load(&bits[w]);
    while (v) {
      int pi = (int)(w * 64) + __builtin_ctzll(v);
      v &= v - 1;
      if (pi < t->base.size && pi != t->base.rank && !t->peers[pi].unlinked) pair_release(t, pi);
    }
  }
}

/* ---- the transport lock's slow half (shm_impl.h) ---- */

/* The contended half of shm_lock_acquire (shm_impl.h): mark the lock
 * contended and sleep until a release hands it over. */
void mlxd_shm_lock_slow(shm_lock* l, uint32_t seen) {
  for (int i = 0; i < 100 && seen != 0; i++) { /* a holder leaves within a few steps */
    mlxd_cpu_relax();
    seen = 0;
    if (atomic_compare_exchange_weak_explicit(&l->v, &seen, 1, memory_order_acquire,
                                              memory_order_relaxed))
      return;
  }
  if (seen != 2) seen = atomic_exchange_explicit(&l->v, 2, memory_order_acquire);
  while (seen != 0) {
    syscall(SYS_futex, (uint32_t*)&l->v, FUTEX_WAIT_PRIVATE, 2u, NULL, NULL, 0);
    seen = atomic_exchange_explicit(&l->v, 2, memory_order_acquire);
  }
}

void mlxd_shm_lock_wake(shm_lock* l) {
  syscall(SYS_futex, (uint32_t*)&l->v, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* ---- liveness of a wait ---- */

/* Liveness apart from progress (liveness.h), checked every t->eng.check_s of
 * a wait without progress: a peer of a pending request whose heartbeat
 * counter did not move for MLXDIST_TIMEOUT (counted from the wait's start
 * at the earliest) is dead; no progress since `last` for
 * MLXDIST_WARN_AFTER warns once, for MLXDIST_OP_TIMEOUT fails. Returns
 * true if the transport failed. mu held. */
bool mlxd_shm_live_check(shm_transport* t, shm_req** reqs, int n, double start, double last,
                         double now, bool* warned) {
  shm_req* w = NULL;
  char note[MLXD_NOTE_MAX];
  for (int i = 0; i < n; i++) {
    shm_req* r = reqs[i];
    if (!r || r->q.m.complete) continue;
    if (!w) w = r;
    shm_peer* p = &t->peers[r->q.m.peer];
    uint64_t b = atomic_load_explicit(&rank_rec(t, r->q.m.peer)->beat, memory_order_acquire);
    if (b != p->beat_seen) {
      p->beat_seen = b;
      p->heard = now;
    }
    double heard = p->heard > start ? p->heard : start;
    if (now - heard >= t->live.dead_s) {
      mlxd_status s;
      mlxd_shm_note_read(t, r->q.m.peer, note, sizeof note);
      mlxd_live_dead(&s, MLXD_LAYER_SHM, shm_name(t, r->q.m.peer), p->addr, now - heard, note);
      mlxd_shm_fail(t, &s);
      return true;
    }
  }
  if (!w) return false;
  shm_peer* p = &t->peers[w->q.m.peer];
  if (now - last >= t->live.op_s) {
    mlxd_status s;
    mlxd_shm_note_read(t, w->q.m.peer, note, sizeof note);
    mlxd_live_op_timeout(&s, MLXD_LAYER_SHM, shm_name(t, w->q.m.peer), p->addr, t->live.op_s,
                         w->q.kind == REQ_SEND, w->q.m.n, w->q.m.tag, note);
    mlxd_shm_fail(t, &s);
    return true;
  }
  if (!*warned && t->live.warn_s > 0 && now - last >= t->live.warn_s) {
    *warned = true;
    double heard = p->heard > start ? p->heard : start;
    mlxd_shm_note_read(t, w->q.m.peer, note, sizeof note);
    mlxd_live_warn(MLXD_LAYER_SHM, shm_name(t, t->base.rank), shm_name(t, w->q.m.peer), p->addr,
                   now - last, w->q.m.tag, now - heard, note);
  }
  return false;
}

/* test_shm's single-copy sections (test_shm.h): which path a message of
 * the single-copy threshold takes by default on a crowded host and on one
 * that is not (cma_*), and whole blocks where every rank is crowded
 * (whole_*). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "algo/algo.h"
#include "ranks.h"
#include "test_shm.h"
#include "testutil.h"
#include "transport/shm.h"
#include "transport/shm_impl.h"
#include "transport/spin.h"

/* ---- cma_crowded, cma_quiet, cma_off: the single copy by default ----
 * Two ranks; after a word from rank 1 to rank 0, rank 0 sends rank 1 a
 * message of MLXD_SHM_CMA_CROWDED_BYTES, then one of a byte less. Which
 * path each took shows in the pair's segment: the lane path writes and
 * reads its data slots (every slot of the lane, the message being 32 times
 * a lane), the single copy touches only the pair's first page (its slot
 * headers), so the pages of the pair mapped into a rank (Rss in
 * /proc/self/smaps) tell them apart.
 * cma_crowded: both ranks pinned to one CPU, MLXDIST_SHM_CMA_BYTES unset:
 * the first message in one copy, the second on the lanes. cma_off: the
 * same with MLXDIST_SHM_CMA_BYTES=0: both on the lanes. cma_quiet: two
 * CPUs, unset: the machine's calibration decides (cma_calib.h): both on the
 * lanes where it chose 0, both in one copy where it chose a size. Those two
 * are a collective's (tag kind MLXD_TAG_COLL); a third, point to point
 * (MLXD_TAG_P2P) and a byte less than the threshold, takes the lanes in
 * every mode (cma_quiet: whatever the calibration chose). Each rank also
 * tries process_vm_readv on its peer itself: where the kernel refuses it
 * the transport takes the lanes whatever its rule, and the test says so
 * and skips (77). */

typedef struct cma_seen {
  int read_err;  /* its own process_vm_readv of its peer: 0 ok, an errno, -1 a wrong value */
  size_t rss[3]; /* bytes of the pair's segment mapped after the first / second / third message */
  int done;      /* the rank got that far */
} cma_seen;

static cma_seen* g_cma; /* one per rank, shared by the forked ranks (main maps it) */

/* Each rank's word, at the same address in every rank (they are forks of
 * one process): a peer's is read through CMA and compared with what it
 * must hold. */
static volatile uint64_t g_cma_word;

static uint64_t cma_word_of(pid_t pid) { return 0x6d6c7864636d6100ull ^ (uint64_t)pid; }

/* This process's own process_vm_readv of rank peer's word: 0 ok, the errno
 * of a refusal, or -1 (a short read or a wrong value). */
static int cma_read_peer(int peer) {
  uint64_t v = 0;
  struct iovec local = {&v, sizeof v};
  struct iovec remote = {(void*)(uintptr_t)&g_cma_word, sizeof v};
  ssize_t got = process_vm_readv(g_pids[peer], &local, 1, &remote, 1, 0);
  if (got == (ssize_t)sizeof v) return v == cma_word_of(g_pids[peer]) ? 0 : -1;
  return got < 0 ? errno : -1;
}

/* What cma_read_peer's answer err says, for a message. */
static const char* cma_read_text(int err) {
  return err == 0 ? "ok" : err == -1 ? "wrong value" : strerror(err);
}

/* Bytes of the mappings of /dev/shm/<prefix>... resident in this process. */
static size_t shm_rss(const char* prefix) {
  FILE* f = fopen("/proc/self/smaps", "r");
  T_REQUIREF(f != NULL, "open /proc/self/smaps: %s", strerror(errno));
  char line[1024], want[400];
  snprintf(want, sizeof want, "/dev/shm/%s", prefix);
  bool in = false;
  int found = 0;
  size_t kb_total = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long a, b;
    if (sscanf(line, "%lx-%lx ", &a, &b) == 2) { /* a mapping's first line */
      in = strstr(line, want) != NULL;
      found += in;
      continue;
    }
    size_t kb;
    if (in && sscanf(line, "Rss: %zu kB", &kb) == 1) kb_total += kb;
  }
  fclose(f);
  T_REQUIREF(found == 1, "%d mappings of /dev/shm/%s* (expected the pair's one)", found, prefix);
  return kb_total * 1024;
}

static int rank_cma(int rank, int size, const char* name, void* arg) {
  (void)arg;
  T_ASSERT(size == 2);
  int peer = 1 - rank;
  g_cma_word = cma_word_of(getpid());
  mlxd_transport* t = join(rank, size, name); /* every rank's pid is in g_pids from here on */
  g_cma[rank].read_err = cma_read_peer(peer);
  char pair[300];
  snprintf(pair, sizeof pair, "%s~0-1~", name);
  /* First a word from rank 1: the pair is then mapped on both sides, and
   * rank 1's probe of rank 0 (made when it maps the pair) is in the pair's
   * header before rank 0 sends (a send that makes the pair finds no probe
   * yet and takes the lanes). A word travels in its slot's header. */
  mlxd_status st0;
  mlxd_status_clear(&st0);
  mlxd_req* q0 = NULL;
  uint64_t hi = rank == 1 ? 0x1234 : 0;
  T_REQUIREF((rank == 1 ? t->ops->isend(t, 0, 69, NULL, &hi, sizeof hi, &q0, &st0)
                        : t->ops->irecv(t, 1, 69, NULL, &hi, sizeof hi, &q0, &st0)) == 0,
             "%s", st0.msg);
  T_REQUIREF(wait1(t, q0, &st0) == 0, "the first word: %s", st0.msg);
  T_REQUIREF(hi == 0x1234, "the first word is %llx", (unsigned long long)hi);
  const size_t n = MLXD_SHM_CMA_CROWDED_BYTES;
  unsigned char* buf = malloc(n);
  T_REQUIREF(buf != NULL, "malloc %zu", n);
  for (int k = 0; k < 3; k++) {
    /* the threshold, then a byte less; then a byte less again, point to
     * point (one way: the lanes wherever the host is not crowded) */
    size_t len = n - (size_t)(k ? 1 : 0);
    uint64_t tag =
        k < 2 ? mlxd_tag(MLXD_TAG_COLL, 70 + (uint64_t)k, 0) : mlxd_tag(MLXD_TAG_P2P, 72, 0);
    mlxd_status st;
    mlxd_status_clear(&st);
    mlxd_req* q = NULL;
    if (rank == 0) {
      fill(buf, len, 0, 1, tag);
      T_REQUIREF(t->ops->isend(t, 1, tag, NULL, buf, len, &q, &st) == 0, "%s", st.msg);
    } else {
      memset(buf, 0, len);
      T_REQUIREF(t->ops->irecv(t, 0, tag, NULL, buf, len, &q, &st) == 0, "%s", st.msg);
    }
    T_REQUIREF(wait1(t, q, &st) == 0, "the %zu-byte message: %s", len, st.msg);
    if (rank == 1) {
      size_t bad = first_bad(buf, len, 0, 1, tag);
      T_REQUIREF(bad == (size_t)-1, "the %zu-byte message is wrong at byte %zu", len, bad);
    }
    g_cma[rank].rss[k] = shm_rss(pair);
  }
  g_cma[rank].done = 1;
  free(buf);
  t->ops->destroy(t);
  return 0;
}

/* Pin this process (and the ranks it forks) to the first CPU it may run on:
 * two ranks on one CPU are a crowded host. */
static void pin_one_cpu(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  T_REQUIREF(sched_getaffinity(0, sizeof set, &set) == 0, "sched_getaffinity: %s", strerror(errno));
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &set)) cpu++;
  T_REQUIRE(cpu < CPU_SETSIZE);
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  T_REQUIREF(sched_setaffinity(0, sizeof set, &set) == 0, "sched_setaffinity to CPU %d: %s", cpu,
             strerror(errno));
}

static int usable_cpus(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  T_REQUIREF(sched_getaffinity(0, sizeof set, &set) == 0, "sched_getaffinity: %s", strerror(errno));
  return CPU_COUNT(&set);
}

/* The path a message took, from the pair's pages a rank had mapped after
 * it: 1 single copy (no data slot touched), 0 lanes (a lane's worth of
 * slots), -1 neither. */
static int cma_path(size_t rss) {
  if (rss < SHM_SLOT_BYTES) return 1;
  if (rss >= (size_t)SHM_NSLOTS * SHM_SLOT_BYTES) return 0;
  return -1;
}

/* Whether shared memory may be mapped in pages larger than 4 KiB here
 * (shmem transparent huge pages, their multi-size forms, or a huge= mount
 * of /dev/shm): then one first touch maps a whole large page and the
 * mapped bytes cannot tell the single copy from the lanes. why: the
 * setting that says so. */
static bool shmem_large_pages(char* why, size_t n) {
  char path[512], line[512];
  const char* top = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
  bool top_on = false;
  FILE* f = fopen(top, "r");
  if (f) {
    if (fgets(line, sizeof line, f) && !strstr(line, "[never]") && !strstr(line, "[deny]")) {
      top_on = true;
      snprintf(why, n, "%s is %.100s", top, line);
    }
    fclose(f);
  }
  if (top_on) return true;
  DIR* d = opendir("/sys/kernel/mm/transparent_hugepage");
  if (d) {
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
      if (strncmp(e->d_name, "hugepages-", 10) != 0) continue;
      snprintf(path, sizeof path, "/sys/kernel/mm/transparent_hugepage/%.100s/shmem_enabled",
               e->d_name);
      FILE* g = fopen(path, "r");
      if (!g) continue;
      bool on = fgets(line, sizeof line, g) && !strstr(line, "[never]") &&
                !strstr(line, "[inherit]"); /* inherit: the top-level value, never here */
      fclose(g);
      if (on) {
        snprintf(why, n, "%.300s is %.100s", path, line);
        closedir(d);
        return true;
      }
    }
    closedir(d);
  }
  FILE* m = fopen("/proc/mounts", "r");
  if (m) {
    while (fgets(line, sizeof line, m)) {
      char dev[128], dir[256], type[64], opts[256];
      if (sscanf(line, "%127s %255s %63s %255s", dev, dir, type, opts) != 4) continue;
      if (strcmp(dir, "/dev/shm") != 0) continue;
      char* h = strstr(opts, "huge=");
      if (h && strncmp(h, "huge=never", 10) != 0) {
        snprintf(why, n, "/dev/shm is mounted with %.100s", h);
        fclose(m);
        return true;
      }
    }
    fclose(m);
  }
  return false;
}

int run_cma(const char* what, int n) {
  T_REQUIREF(n == 2, "%s runs with 2 ranks", what);
  const size_t n1 = MLXD_SHM_CMA_CROWDED_BYTES;
  bool crowded = strcmp(what, "cma_quiet") != 0;
  char why[512];
  if (shmem_large_pages(why, sizeof why)) {
    printf("%s: %s: the pair's mapped bytes cannot show which path a message took; skipped\n", what,
           why);
    return 77;
  }
  if (strcmp(what, "cma_off") == 0)
    setenv("MLXDIST_SHM_CMA_BYTES", "0", 1);
  else
    unsetenv("MLXDIST_SHM_CMA_BYTES");
  if (crowded) {
    pin_one_cpu();
  } else if (usable_cpus() < 2) {
    printf(
        "%s: this process may run on %d CPU, and 2 ranks on it are a crowded host: cannot "
        "test the host that is not; skipped\n",
        what, usable_cpus());
    return 77;
  }
  /* Not crowded, the threshold is this machine's calibration: decided here,
   * before the ranks fork, so both inherit the one answer (0 where the
   * single copy did not win, as on this project's VM: then both messages
   * take the lanes; else a size far below the first message's: both take
   * the single copy). */
  size_t quiet_min = crowded ? 0 : mlxd_shm_cma_bytes_for(false);
  T_REQUIREF(quiet_min < n1 - 1, "the calibrated threshold %zu", quiet_min);
  g_cma = mmap(NULL, 2 * sizeof *g_cma, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  T_REQUIRE(g_cma != MAP_FAILED);
  t_ranks_opts o = {.timeout_s = 100, .what = what};
  int bad = t_run_ranks(2, rank_cma, NULL, &o, NULL);
  if (bad) T_FAIL("%s: %d rank%s failed", what, bad, bad == 1 ? "" : "s");
  T_REQUIRE(g_cma[0].done && g_cma[1].done);
  for (int r = 0; r < 2; r++)
    printf(
        "%s: rank %d (usable CPUs %d) has %zu bytes of the pair mapped after %zu bytes, %zu "
        "after %zu bytes; process_vm_readv of its peer: %s\n",
        what, r, usable_cpus(), g_cma[r].rss[0], n1, g_cma[r].rss[1], n1 - 1,
        cma_read_text(g_cma[r].read_err));
  /* the second message takes the lanes (except where this machine's
   * calibration put the threshold below it): the measure sees them */
  for (int r = 0; r < 2 && !quiet_min; r++)
    T_REQUIREF(cma_path(g_cma[r].rss[1]) == 0,
               "%s: rank %d has only %zu bytes of the pair mapped after a %zu-byte message on the "
               "lanes (expected at least a lane's %zu)",
               what, r, g_cma[r].rss[1], n1 - 1, (size_t)SHM_NSLOTS * SHM_SLOT_BYTES);
  /* rank 1 receives: its own read of rank 0 is the one the single copy needs */
  if (g_cma[1].read_err != 0) {
    for (int r = 0; r < 2; r++)
      T_REQUIREF(cma_path(g_cma[r].rss[0]) == 0, "%s: rank %d: %zu bytes of the pair mapped", what,
                 r, g_cma[r].rss[0]);
    printf(
        "%s: cross-memory attach is refused here (rank 1's process_vm_readv of rank 0: %s): "
        "every message takes the lanes, so which path the rule picks cannot be seen; "
        "skipped\n",
        what, cma_read_text(g_cma[1].read_err));
    return 77;
  }
  /* point to point takes the lanes below the crowded rule's size and
   * wherever the host is not crowded, whatever the calibration chose */
  for (int r = 0; r < 2; r++)
    T_REQUIREF(cma_path(g_cma[r].rss[2]) == 0,
               "%s: rank %d has only %zu bytes of the pair mapped after a %zu-byte point-to-point "
               "message (expected the lanes: at least a lane's %zu)",
               what, r, g_cma[r].rss[2], n1 - 1, (size_t)SHM_NSLOTS * SHM_SLOT_BYTES);
  int want = strcmp(what, "cma_crowded") == 0 || quiet_min ? 1 : 0;
  for (int r = 0; r < 2; r++)
    for (int k = 0; k < (quiet_min ? 2 : 1); k++) /* the calibrated threshold: both messages */
      T_REQUIREF(cma_path(g_cma[r].rss[k]) == want,
                 "%s: rank %d has %zu bytes of the pair mapped after the %zu-byte message: it "
                 "took the %s (expected the %s)",
                 what, r, g_cma[r].rss[k], n1 - (size_t)k,
                 cma_path(g_cma[r].rss[k]) == 1   ? "single copy"
                 : cma_path(g_cma[r].rss[k]) == 0 ? "lanes"
                                                  : "part of a lane",
                 want ? "single copy" : "lanes");
  printf("%s with 2 ranks: ok (the %zu-byte message took the %s; threshold %zu)\n", what, n1,
         want ? "single copy" : "lanes", quiet_min);
  return 0;
}

/* ---- whole_crowded, whole_split: whole blocks where every rank is crowded ----
 * mlxd_transport.whole_min is one answer for the group: MLXD_SHM_WHOLE_
 * CROWDED_BYTES when every rank is crowded, 0 when any is not.
 * whole_split (2 ranks): rank 0 pinned to one CPU (crowded), rank 1 on two
 * (not): both read 0. whole_crowded (3 or more ranks, all pinned to one
 * CPU): both read the threshold; an all_gather of blocks of that size gives
 * the right result and moves every block in one copy (no pair's data slot
 * touched: the cma_* sections' measure), one of a byte less per block takes
 * the lanes (a pair with a lane's worth of slots mapped). 77: cross-memory
 * attach refused, shared memory mapped in large pages, or (whole_split)
 * fewer than 2 CPUs. */

typedef struct whole_seen {
  size_t whole_min;  /* the rank's transport's */
  int read_err;      /* its process_vm_readv of every peer: 0 ok, else an errno or -1 */
  size_t rss_max[2]; /* the most bytes of one of its pairs mapped after each all_gather */
  int done;
} whole_seen;

static whole_seen* g_whole; /* one per rank, shared by the forked ranks */

static void whole_fill(unsigned char* b, size_t n, int owner, uint64_t salt) {
  for (size_t i = 0; i < n; i++)
    b[i] = (unsigned char)((i * 131u) ^ ((i >> 8) * 7u) ^ ((i >> 16) * 13u) ^ (size_t)(owner * 37) ^
                           salt);
}

static int rank_whole(int rank, int size, const char* name, void* arg) {
  bool split = arg != NULL;
  if (split && rank == 0) pin_one_cpu();
  g_cma_word = cma_word_of(getpid());
  mlxd_transport* t = join(rank, size, name);
  g_whole[rank].whole_min = t->whole_min;
  if (split) {
    g_whole[rank].done = 1;
    t->ops->destroy(t);
    return 0;
  }
  /* Every pair made (and probed) with a word each way before the blocks:
   * a send that makes its pair finds no probe yet and takes the lanes. */
  for (int p = 0; p < size; p++) {
    if (p == rank) continue;
    int err = cma_read_peer(p);
    if (err) g_whole[rank].read_err = err;
    uint64_t out = (uint64_t)rank, in = 0;
    mlxd_req* q[2] = {NULL, NULL};
    mlxd_status st;
    mlxd_status_clear(&st);
    T_REQUIREF(t->ops->isend(t, p, 60, NULL, &out, sizeof out, &q[0], &st) == 0, "%s", st.msg);
    T_REQUIREF(t->ops->irecv(t, p, 60, NULL, &in, sizeof in, &q[1], &st) == 0, "%s", st.msg);
    T_REQUIREF(t->ops->waitall(t, q, 2, &st) == 0, "the word with rank %d: %s", p, st.msg);
    T_REQUIREF(in == (uint64_t)p, "the word from rank %d is %llu", p, (unsigned long long)in);
  }
  const size_t n = MLXD_SHM_WHOLE_CROWDED_BYTES;
  unsigned char* in = malloc(n);
  unsigned char* out = malloc(n * (size_t)size);
  unsigned char* want = malloc(n);
  T_REQUIREF(in && out && want, "malloc %zu x %d", n, size);
  for (int k = 0; k < 2; k++) {
    size_t len = n - (size_t)k; /* the threshold, then a byte less */
    whole_fill(in, len, rank, (uint64_t)k);
    memset(out, 0, len * (size_t)size);
    mlxd_status st;
    mlxd_status_clear(&st);
    T_REQUIREF(mlxd_algo_all_gather(t, 1 + (uint64_t)k, NULL, in, out, len, &st) == 0,
               "all_gather of %zu-byte blocks: %s", len, st.msg);
    for (int o = 0; o < size; o++) {
      whole_fill(want, len, o, (uint64_t)k);
      T_REQUIREF(memcmp(out + (size_t)o * len, want, len) == 0,
                 "all_gather of %zu-byte blocks: rank %d's block is wrong", len, o);
    }
    for (int p = 0; p < size; p++) {
      if (p == rank) continue;
      char pair[300];
      snprintf(pair, sizeof pair, "%s~%d-%d~", name, rank < p ? rank : p, rank < p ? p : rank);
      size_t rss = shm_rss(pair);
      if (rss > g_whole[rank].rss_max[k]) g_whole[rank].rss_max[k] = rss;
    }
  }
  free(in);
  free(out);
  free(want);
  g_whole[rank].done = 1;
  t->ops->destroy(t);
  return 0;
}

int run_whole(const char* what, int n) {
  bool split = strcmp(what, "whole_split") == 0;
  T_REQUIREF(split ? n == 2 : n >= 3, "%s runs with %s ranks", what, split ? "2" : "3 or more");
  char why[512];
  unsetenv("MLXDIST_SHM_CMA_BYTES");
  if (split) {
    if (usable_cpus() < 2) {
      printf("%s: this process may run on %d CPU: every rank is crowded; skipped\n", what,
             usable_cpus());
      return 77;
    }
  } else {
    if (shmem_large_pages(why, sizeof why)) {
      printf("%s: %s: the pairs' mapped bytes cannot show which path a block took; skipped\n", what,
             why);
      return 77;
    }
    pin_one_cpu();
  }
  g_whole = mmap(NULL, (size_t)n * sizeof *g_whole, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  T_REQUIRE(g_whole != MAP_FAILED);
  t_ranks_opts o = {.timeout_s = 100, .what = what};
  int bad = t_run_ranks(n, rank_whole, split ? (void*)what : NULL, &o, NULL);
  if (bad) T_FAIL("%s: %d rank%s failed", what, bad, bad == 1 ? "" : "s");
  size_t expect = split ? 0 : MLXD_SHM_WHOLE_CROWDED_BYTES;
  for (int r = 0; r < n; r++) {
    T_REQUIRE(g_whole[r].done);
    T_REQUIREF(g_whole[r].whole_min == expect,
               "%s: rank %d's whole-block threshold is %zu (expected %zu: %s)", what, r,
               g_whole[r].whole_min, expect,
               split ? "rank 1 is not crowded" : "every rank is crowded");
  }
  if (split) {
    printf("%s with 2 ranks: ok (rank 0 crowded, rank 1 not: neither sends whole blocks)\n", what);
    return 0;
  }
  for (int r = 0; r < n; r++) {
    printf("%s: rank %d: most bytes of a pair mapped %zu after %zu-byte blocks, %zu after %zu\n",
           what, r, g_whole[r].rss_max[0], expect, g_whole[r].rss_max[1], expect - 1);
    if (g_whole[r].read_err != 0) {
      printf("%s: cross-memory attach refused here (rank %d: %s): skipped\n", what, r,
             cma_read_text(g_whole[r].read_err));
      return 77;
    }
  }
  bool ring_seen = false;
  for (int r = 0; r < n; r++) {
    T_REQUIREF(cma_path(g_whole[r].rss_max[0]) == 1,
               "%s: rank %d has %zu bytes of a pair mapped after blocks of %zu bytes (expected "
               "no data slot: every block in one copy)",
               what, r, g_whole[r].rss_max[0], expect);
    ring_seen |= cma_path(g_whole[r].rss_max[1]) == 0;
  }
  T_REQUIREF(ring_seen,
             "%s: no pair has a lane's worth mapped after blocks of %zu bytes "
             "(expected the ring algorithm's chunks)",
             what, expect - 1);
  printf("%s with %d ranks: ok (blocks of %zu bytes whole in one copy, %zu on the lanes)\n", what,
         n, expect, expect - 1);
  return 0;
}

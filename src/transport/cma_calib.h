/* Private: the calibration of the shared-memory transport's single-copy
 * threshold for collectives on a host that is not crowded (spin.h
 * mlxd_shm_cma_bytes_for).
 *
 * In a collective each rank sends while it receives: over the lanes every
 * rank copies each byte twice (its message in, its peer's out) and a
 * slot's lines move between the cores; one process_vm_readv copies once,
 * but pins pages, which costs more or less by machine (its page tables
 * above all): on the AMD EPYC VM the rule was first tuned on the single
 * copy never won, on an Intel Xeon it wins from 16 KiB. So the machine
 * decides: once per boot, the first process that needs the answer times
 * the exchange both ways between two of its threads on two CPUs, as two
 * ranks make it (mlxd_cma_measure), picks the threshold (mlxd_cma_decide)
 * and leaves it in a small file keyed by the boot id (mlxd_cma_cache_*),
 * which the other ranks of the host read instead of measuring again.
 * (Point-to-point messages go one way: there the lanes' two copies run on
 * two cores at once, one each, and they keep the lanes: spin.h.)
 * docs/performance.md, "Single copy: calibrated where the host is not
 * crowded", says why and what it measured. */
#ifndef MLXD_CMA_CALIB_H
#define MLXD_CMA_CALIB_H

#include <stdbool.h>
#include <stddef.h>

/* The sizes measured, ascending: 16 KiB, 64 KiB, 256 KiB, 1 MiB. A threshold
 * the calibration picks (or a cache file may hold) is 0 or one of them. */
#define MLXD_CMA_NSIZES 4
extern const size_t mlxd_cma_sizes[MLXD_CMA_NSIZES];

/* The single copy wins at a size when it takes at most (1 - this) of the
 * two copies' time: 10 % faster, more than the spread of a best-of run. */
#define MLXD_CMA_MARGIN 0.10

/* The whole measurement's bound, buffers, warm-up and the helper thread
 * included: every spin gives up once this much time has passed (a round
 * moves at most 1 MiB each way; the buffers are unmapped after). */
#define MLXD_CMA_BUDGET_S 0.010

/* How long a process waits for another of the user's that is measuring
 * (holds the cache's lock, path.lock) to leave its answer, before it
 * measures itself. */
#define MLXD_CMA_WAIT_S 0.1

/* Passes over the sizes; each size's time is the best of the passes made. */
#define MLXD_CMA_REPS 3

/* The lanes measured: chunks of a lane's slot size through a lane's worth
 * of shared memory, one lane each way (shm_impl.h SHM_SLOT_BYTES,
 * SHM_NSLOTS; shm_setup.c checks they agree). */
#define MLXD_CMA_SLOT_BYTES ((size_t)64 * 1024)
#define MLXD_CMA_NSLOTS 16u

/* The cache file's format version (the file's first line names it). */
#define MLXD_CMA_CACHE_VERSION 2 /* 2: the exchange, 16 KiB-1 MiB */
/* A cache file is at most this many bytes (a longer one is not valid). */
#define MLXD_CMA_CACHE_MAX 256
/* A boot id: /proc/sys/kernel/random/boot_id, 36 characters. */
#define MLXD_CMA_BOOT_ID_LEN 36

/* One calibration's timings. */
typedef struct mlxd_cma_table {
  int n;                         /* sizes measured both ways (a prefix of mlxd_cma_sizes) */
  int reps;                      /* complete passes over the sizes */
  double two_s[MLXD_CMA_NSIZES]; /* best seconds for the exchange of the size over lanes */
  double one_s[MLXD_CMA_NSIZES]; /* best seconds for it by process_vm_readv, each side one */
  int err;                       /* process_vm_readv's errno when refused (then n is 0), else 0 */
  bool over;                     /* the budget ran out before the first pass finished */
  bool one_cpu;                  /* this thread may run on one CPU only: not measured */
  double took_s;                 /* the whole measurement, buffers and warm-up included */
} mlxd_cma_table;

/* The decision rule (pure): the smallest sizes[i] from which the single
 * copy wins (one_s <= (1 - MLXD_CMA_MARGIN) * two_s) at sizes[i] and at
 * every larger size of the table; 0 (off) where it does not win at the
 * largest. sizes must be ascending and every time finite and > 0, else 0;
 * n <= 0 gives 0. */
size_t mlxd_cma_decide(const size_t* sizes, const double* two_s, const double* one_s, int n);

/* Times, in this process, an exchange of each size between this thread
 * and a helper thread (made here, joined before it returns) over two
 * lanes' worth of shared anonymous memory, slot by slot both ways at once,
 * against each side's one process_vm_readv of the other's message from
 * this process's own pid (the same page pinning as a read of a peer); on
 * warm buffers, best of MLXD_CMA_REPS passes after an untimed round of
 * each, every spin giving up once budget_s has passed. Returns the
 * threshold (mlxd_cma_decide) when at least one pass over every size
 * finished, else 0: refused (t->err: EPERM, ENOSYS under a seccomp
 * filter...; EAGAIN: no thread), over budget (t->over), this thread held
 * to one CPU (t->one_cpu), or buffers not mapped (t->err ENOMEM). Blocks
 * for about budget_s at most (plus one step). */
size_t mlxd_cma_measure(mlxd_cma_table* t, double budget_s);

/* The cache file's text for boot_id and threshold bytes (one line:
 * "mlxdist-cma <version> <boot id> <bytes>\n"). Returns its length, or -1
 * if out (n bytes) is too small. */
int mlxd_cma_cache_format(char* out, size_t n, const char* boot_id, size_t bytes);

/* Parses a cache file's text (len bytes; need not be NUL-terminated) and
 * validates every field: the exact format above, this version, the boot
 * id equal to boot_id, the threshold 0 or one of mlxd_cma_sizes. Returns 0
 * and *bytes, or -1 (a reason in why, if given). Pure. */
int mlxd_cma_cache_parse(const char* text, size_t len, const char* boot_id, size_t* bytes,
                         char* why, size_t why_n);

/* Reads the cache file at path: a regular file (not followed through a
 * link), owned by this user, writable by no one else, at most
 * MLXD_CMA_CACHE_MAX bytes, then mlxd_cma_cache_parse. Never waits (a FIFO
 * is refused). Returns 0 and *bytes, or -1 (why, if given). */
int mlxd_cma_cache_read(const char* path, const char* boot_id, size_t* bytes, char* why,
                        size_t why_n);

/* Writes the cache file at path (mode 0600): to a temporary file beside
 * it, then link(2) to path, so that readers see a whole file or none and
 * the first of two calibrations at once wins; where path holds a file
 * that is not valid (mlxd_cma_cache_read: another boot's, garbage), the
 * temporary file replaces it (rename(2)). Returns 0 when path holds our
 * value, 1 when it holds a valid one another process wrote first (then
 * *bytes is that one), -1 when nothing could be written (*bytes
 * unchanged). */
int mlxd_cma_cache_write(const char* path, const char* boot_id, size_t* bytes);

/* This boot's id into out (MLXD_CMA_BOOT_ID_LEN + 1 bytes): true, or
 * false where it cannot be read or is not 36 hex digits and dashes. */
bool mlxd_cma_boot_id(char* out);

/* The cache file's path for this user: /dev/shm/.mlxdist-cma-<uid> (a
 * name no shared-memory session can have: those never start with '.'). */
void mlxd_cma_cache_path(char* out, size_t n);

/* Where the non-crowded threshold of this process came from. */
typedef enum mlxd_cma_source {
  MLXD_CMA_FROM_CACHE = 1,   /* this boot's cache file (another process calibrated) */
  MLXD_CMA_FROM_MEASURED = 2 /* this process calibrated (table; cached says whether it was kept) */
} mlxd_cma_source;

typedef struct mlxd_cma_choice {
  size_t bytes; /* the threshold: 0 (off) or one of mlxd_cma_sizes */
  mlxd_cma_source source;
  bool cached;          /* MEASURED: the file now holds this value (else: not written) */
  mlxd_cma_table table; /* MEASURED: what was measured */
  char path[128];       /* the cache file */
} mlxd_cma_choice;

/* The calibrated threshold of this process, decided on first call and the
 * same afterwards (and in children forked after it): this boot's cache
 * file when it holds a valid value, else a measurement (mlxd_cma_measure,
 * MLXD_CMA_BUDGET_S), kept in the cache file when it finished and was not
 * refused. One process of the user measures at a time (an flock on the
 * cache's path + ".lock"); another waits for its answer, at most
 * MLXD_CMA_WAIT_S, then measures itself. Thread-safe; the first call
 * blocks for the measurement (about MLXD_CMA_BUDGET_S, plus the wait),
 * later ones return at once. Cannot fail (an unusable cache
 * costs a measurement; a refusal or an unfinished one answers 0). */
const mlxd_cma_choice* mlxd_cma_calibrated(void);

/* Whether this process has decided mlxd_cma_calibrated's answer yet (read
 * the cache or measured): tests of the rules that must not. */
bool mlxd_cma_calibration_ran(void);

#endif

/* Transport selection for a ring group (MLXDIST_TRANSPORT).
 *
 * The first group of ranks that mlxdist-launch started on one host
 * (MLXDIST_SHM_SESSION) gathers the records below through that shared-memory
 * session instead, and keeps it without ever making a TCP transport when
 * every rank is on one host and the setting is not tcp
 * (mlxd_ring_select_local, at the end). Every other group of two or more
 * ranks first gets a TCP transport (net/mesh.c).
 * Over it, the algorithm layer's all_gather (a fixed threshold, so every
 * rank takes the same algorithm; sequence numbers the group's operations do
 * not reach) gathers a 64-byte record per rank: this rank's
 * MLXDIST_TRANSPORT setting, the settings that choose algorithms, and a hash
 * of its host identity (host name, the kernel boot id from
 * /proc/sys/kernel/random/boot_id and the inodes of its network and IPC
 * namespaces, /proc/self/ns/net and /proc/self/ns/ipc, so processes in
 * different namespaces count as different hosts). Rank 0's record also
 * carries a fresh shared-memory session name ("mlxdist-<pid>-<16 hex>").
 * The full 336-byte records are gathered only to say what differs between
 * hosts (MLXDIST_TRANSPORT=shm across hosts).
 *
 * Every rank sees the same records, so every rank makes the same decision:
 *   tcp                      keep TCP;
 *   auto/shm, one host       every rank joins the shared-memory session,
 *                            then a second tiny all_gather over TCP (a status
 *                            byte per rank; every rank's reason in a third
 *                            only when one failed) tells every rank whether
 *                            all joined: if so the group uses shm and the
 *                            TCP transport is destroyed (its sockets are
 *                            freed; every rank has received everything it
 *                            expects on them, which the TCP transport treats
 *                            as a normal shutdown); if not, auto keeps TCP
 *                            (logged with MLX_RING_VERBOSE) and shm fails
 *                            with the rank and its reason;
 *   auto, several hosts      per peer: the ranks of each host join a
 *                            shared-memory session of that host's ranks
 *                            only (rank 0's name + "-h<first rank>"), and
 *                            after the same status exchange the router
 *                            (transport/router.h) gives a rank with company
 *                            on its host shm to its host's ranks and this
 *                            TCP mesh to the others; a rank alone on
 *                            its host keeps plain TCP; if any session could
 *                            not start, every rank keeps TCP (logged);
 *                            shm fails naming the ranks elsewhere.
 * A host is what the record says (boot id, namespaces, host name), or
 * MLXDIST_HOST_ID when set: ranks with the same id count as one host. With
 * MLX_RING_VERBOSE=1 every rank prints one line of what it chose:
 * "[ring] rank 2: transports: shm with ranks 3; tcp with ranks 0,1".
 * Ranks with different MLXDIST_TRANSPORT settings fail with both values.
 * Errors are structured (MLXD_LAYER_BOOTSTRAP, or the transport's own,
 * passed on untouched); ring.c renders them at its boundary. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "algo/algo.h"
#include "backends/ring/ring_internal.h"
#include "transport/router.h"
#include "transport/shm.h"
#include "transport/spin.h"
#include "transport/tcp.h"
#include "util/tunables.h"

static const char* const k_mode_names[] = {"auto", "tcp", "shm"};

const char* mlxd_ring_mode_name(int mode) {
  return mode >= 0 && mode <= MLXD_RING_T_SHM ? k_mode_names[mode] : "?";
}

int mlxd_ring_transport_mode(int* mode, mlxd_status* st) {
  const char* v = mlxd_tunable_str(MLXD_T_TRANSPORT);
  for (int m = 0; m <= MLXD_RING_T_SHM; m++)
    if (v && strcasecmp(v, k_mode_names[m]) == 0) {
      *mode = m;
      return 0;
    }
  return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                      "MLXDIST_TRANSPORT='%s' is not valid; expected auto, tcp or shm",
                      v ? v : "(null)");
}

/* ---- the boot exchange over a fresh transport ---- */

#define ID_BYTES 336
#define ID_MAGIC 0x4D585248u /* "MXRH" */
#define ID_VERSION 2u
/* layout: 0 magic, 4 version, 6 mode, 8 rank, 12 size, 16 netns (u64), 24 ipcns (u64),
 * 32 boot id (48), 80 host name (128), 208 session name (96, rank 0's only), 304 the
 * machine (u64: a hash of the boot id, also with MLXDIST_HOST_ID), 312 MLXDIST_ALGO (u8:
 * auto 0, flat 1, hier 2), 316 MLXDIST_HIER_SEGMENT (u32), 320 MLXDIST_SMALL_BYTES (u32)
 * 313 MLXDIST_SMALL_ALGO (u8: auto 0, direct 1, logn 2) (the four choose algorithms:
 * every rank must have the same), 314 and 324.. zero */
#define ID_MACHINE 304
#define ID_ALGO 312
#define ID_SEGMENT 316
#define ID_SMALL 320
#define ID_SMALL_ALGO 313
#define ID_HOST_FIRST 16
#define ID_HOST_END 208
#define ID_SESSION 208
#define ID_SESSION_MAX 96
#define STATUS_BYTES 160
/* What travels: a compact record per rank (REC_BYTES), made from the full one
 * above. layout: 0 magic, 4 version, 6 mode, 8 rank, 12 size, 16 the host (u64:
 * FNV-1a of the full record's bytes 16..207, i.e. MLXDIST_HOST_ID, or boot id,
 * namespaces and host name), 24 the machine (u64, as ID_MACHINE), 32 MLXDIST_ALGO
 * (u8), 33 MLXDIST_SMALL_ALGO (u8), 36 MLXDIST_HIER_SEGMENT (u32), 40 MLXDIST_SMALL_BYTES (u32), 44 rank 0's
 * session (u32 pid, u64 random: "mlxdist-<pid>-<16 hex>"; zero elsewhere), 56 the
 * job (u64: FNV-1a of the job token and the secret's key, only through the launcher's
 * shared-memory session, where no handshake proves them; zero over TCP). The full
 * records travel only to explain different hosts (an error). */
#define REC_BYTES 64
#define REC_MAGIC 0x4D585243u /* "MXRC" */
#define REC_VERSION 3u
#define REC_HOST 16
#define REC_MACHINE 24
#define REC_ALGO 32
#define REC_SEGMENT 36
#define REC_SMALL 40
#define REC_SMALL_ALGO 33
#define REC_SESSION_PID 44
#define REC_SESSION_RAND 48
#define REC_JOB 56

static void put_u(unsigned char* p, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; i--) {
    p[i] = (unsigned char)v;
    v >>= 8;
  }
}
static uint64_t get_u(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v = (v << 8) | p[i];
  return v;
}

/* The exchanges' sequence numbers: the top of the tags' sequence space
 * (MLXD_TAG_SEQ_BITS), which the group's own operations (numbered from 0)
 * reach only after 2^17 - 8 of them, long after these have completed on
 * every rank. */
#define SELECT_SEQ ((1ull << MLXD_TAG_SEQ_BITS) - 8)
/* All-gather n bytes per rank over the algorithm layer (step: which
 * exchange): the same algorithm on every rank whatever its environment (the
 * exchange checks that the settings agree), log-depth at large groups, so a
 * rank talks to O(log N) peers, not N - 1. */
static int boot_exchange(mlxd_transport* t, unsigned step, const unsigned char* in,
                         unsigned char* out, size_t n, mlxd_status* st) {
  return mlxd_algo_all_gather_setup(t, SELECT_SEQ + step, in, out, n, st);
}

/* FNV-1a of n bytes, continuing from h (start: FNV_OFFSET): the router's. */
#define FNV_OFFSET MLXD_ROUTE_HASH_START
static uint64_t fnv1a(uint64_t h, const unsigned char* p, size_t n) {
  return mlxd_route_hash(h, p, n);
}

static uint64_t random64(void) {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) == (ssize_t)sizeof v) return v;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40) ^
         (uint64_t)(uintptr_t)&ts;
}

#define HOST_ID_MARK MLXD_ROUTE_HOST_ID_MARK
_Static_assert(ID_HOST_END - ID_HOST_FIRST == MLXD_ROUTE_HOST_BYTES,
               "a record's host bytes are the router's host record");

static void make_id(unsigned char* id, int rank, int size, int mode, const char* host_id,
                    uint64_t session_rand) {
  memset(id, 0, ID_BYTES);
  put_u(id, ID_MAGIC, 4);
  put_u(id + 4, ID_VERSION, 2);
  put_u(id + 6, (uint64_t)mode, 2);
  put_u(id + 8, (uint64_t)rank, 4);
  put_u(id + 12, (uint64_t)size, 4);
  /* which ranks share this machine's CPUs */
  put_u(id + ID_MACHINE, mlxd_route_machine_key(), 8);
  put_u(id + ID_ALGO, (uint64_t)mlxd_tunable_long(MLXD_T_ALGO), 1);
  put_u(id + ID_SEGMENT, (uint64_t)mlxd_tunable_long(MLXD_T_HIER_SEGMENT), 4);
  put_u(id + ID_SMALL, (uint64_t)mlxd_tunable_long(MLXD_T_SMALL_BYTES), 4);
  put_u(id + ID_SMALL_ALGO, (uint64_t)mlxd_tunable_long(MLXD_T_SMALL_ALGO), 1);
  mlxd_route_host_record(id + ID_HOST_FIRST, host_id); /* 16..207: the host */
  if (rank == 0)
    snprintf((char*)id + ID_SESSION, ID_SESSION_MAX, "mlxdist-%ld-%016llx", (long)getpid(),
             (unsigned long long)session_rand);
}

/* The compact record of a full one (layout at REC_BYTES). */
static void make_rec(unsigned char* rec, const unsigned char* id, int rank, uint64_t session_rand) {
  memset(rec, 0, REC_BYTES);
  put_u(rec, REC_MAGIC, 4);
  put_u(rec + 4, REC_VERSION, 2);
  memcpy(rec + 6, id + 6, 10); /* mode, rank, size */
  put_u(rec + REC_HOST, fnv1a(FNV_OFFSET, id + ID_HOST_FIRST, ID_HOST_END - ID_HOST_FIRST), 8);
  memcpy(rec + REC_MACHINE, id + ID_MACHINE, 8);
  memcpy(rec + REC_ALGO, id + ID_ALGO, 1);
  memcpy(rec + REC_SMALL_ALGO, id + ID_SMALL_ALGO, 1);
  memcpy(rec + REC_SEGMENT, id + ID_SEGMENT, 4);
  memcpy(rec + REC_SMALL, id + ID_SMALL, 4);
  if (rank == 0) {
    put_u(rec + REC_SESSION_PID, (uint64_t)getpid() & 0xffffffffu, 4);
    put_u(rec + REC_SESSION_RAND, session_rand, 8);
  }
}

/* What differs between two host records, for messages. */
static void host_diff(const unsigned char* a, const unsigned char* b, char* out, size_t n) {
  bool ida = strcmp((const char*)a + 32, HOST_ID_MARK) == 0;
  bool idb = strcmp((const char*)b + 32, HOST_ID_MARK) == 0;
  if (ida || idb)
    snprintf(out, n, "MLXDIST_HOST_ID '%.50s' vs '%.50s'", ida ? (const char*)a + 80 : "(unset)",
             idb ? (const char*)b + 80 : "(unset)");
  else if (strncmp((const char*)a + 80, (const char*)b + 80, 128) != 0)
    snprintf(out, n, "host name '%.60s' vs '%.60s'", (const char*)a + 80, (const char*)b + 80);
  else if (memcmp(a + 32, b + 32, 48) != 0)
    snprintf(out, n, "same host name '%.60s' but a different kernel boot id", (const char*)a + 80);
  else if (memcmp(a + 16, b + 16, 8) != 0)
    snprintf(out, n, "network namespace %llu vs %llu", (unsigned long long)get_u(a + 16, 8),
             (unsigned long long)get_u(b + 16, 8));
  else
    snprintf(out, n, "IPC namespace %llu vs %llu", (unsigned long long)get_u(a + 24, 8),
             (unsigned long long)get_u(b + 24, 8));
}

/* "1, 2, 5" (at most the first 16, then ", ..."). */
static void rank_list(const int* ranks, int m, char* out, size_t n) {
  size_t o = 0;
  out[0] = '\0';
  for (int i = 0; i < m && o < n; i++) {
    int w = i < 16 ? snprintf(out + o, n - o, "%s%d", i ? ", " : "", ranks[i])
                   : snprintf(out + o, n - o, ", ...");
    if (w < 0) break;
    o += (size_t)w;
    if (i >= 16) break;
  }
}

/* The line of docs/ring.md that says what this rank chose:
 * "rank R: transports: shm with ranks 1,3; tcp with ranks 2,4,5" (the
 * router's, mlxd_route_log). on[p] is true for the peers reached over shm. */
void mlxd_ring_log_transports(int rank, int size, const bool* on) {
  if (!mlxd_net_verbose()) return;
  mlxd_route_kind* kind_of = malloc((size_t)size * sizeof *kind_of);
  if (!kind_of) return;
  for (int p = 0; p < size; p++) kind_of[p] = on[p] ? MLXD_ROUTE_SHM : MLXD_ROUTE_TCP;
  mlxd_route_log("ring", rank, size, kind_of);
  free(kind_of);
}

/* Every rank's compact record (ids) checked: well-formed, and the same
 * MLXDIST_TRANSPORT (mode) and algorithm settings as this rank's (mine, the
 * full record). 0, or the first problem in st (naming the rank). */
static int check_records(const unsigned char* ids, const unsigned char* mine, int rank, int size,
                         int mode, mlxd_status* st) {
  for (int p = 0; p < size; p++) {
    const unsigned char* id = ids + (size_t)p * REC_BYTES;
    if (get_u(id, 4) != REC_MAGIC || get_u(id + 4, 2) != REC_VERSION ||
        get_u(id + 8, 4) != (uint64_t)p || get_u(id + 12, 4) != (uint64_t)size ||
        get_u(id + 6, 2) > MLXD_RING_T_SHM || get_u(id + REC_ALGO, 1) > 2 ||
        get_u(id + REC_SMALL_ALGO, 1) > 2) {
      int rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                            "rank %d sent a malformed host record while choosing the transport "
                            "(is every rank running the same mlxdist version?)",
                            p);
      mlxd_status_set_peer(st, p, NULL);
      return rc;
    }
    int pm = (int)get_u(id + 6, 2);
    if (pm != mode) {
      int rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                            "ranks disagree on MLXDIST_TRANSPORT: rank %d has %s, rank %d has "
                            "%s; expected the same value on every rank",
                            rank, mlxd_ring_mode_name(mode), p, mlxd_ring_mode_name(pm));
      mlxd_status_set_peer(st, p, NULL);
      return rc;
    }
    /* the two-level and log-depth collectives run only if every rank takes
     * them (values range-checked above) */
    static const struct {
      int at, mine_at;
      const char* name;
      const char* values[3];
    } choices[] = {
        {REC_ALGO, ID_ALGO, "MLXDIST_ALGO", {"auto", "flat", "hier"}},
        {REC_SMALL_ALGO, ID_SMALL_ALGO, "MLXDIST_SMALL_ALGO", {"auto", "direct", "logn"}}};
    for (size_t k = 0; k < sizeof choices / sizeof choices[0]; k++) {
      unsigned pv = (unsigned)get_u(id + choices[k].at, 1);
      unsigned mv = (unsigned)get_u(mine + choices[k].mine_at, 1);
      if (pv == mv) continue;
      int rc =
          mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                       "ranks disagree on %s: rank %d has %s, rank %d has %s; expected the same "
                       "value on every rank",
                       choices[k].name, rank, choices[k].values[mv], p, choices[k].values[pv]);
      mlxd_status_set_peer(st, p, NULL);
      return rc;
    }
    /* so must the sizes that pick an algorithm, or ranks would run different ones */
    static const struct {
      int at;
      const char* name;
      int mine_at;
    } sizes[] = {{REC_SEGMENT, "MLXDIST_HIER_SEGMENT", ID_SEGMENT},
                 {REC_SMALL, "MLXDIST_SMALL_BYTES", ID_SMALL}};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
      uint64_t pv = get_u(id + sizes[k].at, 4), mv = get_u(mine + sizes[k].mine_at, 4);
      if (pv == mv) continue;
      int rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                            "ranks disagree on %s: rank %d has %" PRIu64 ", rank %d has %" PRIu64
                            "; expected the same value on every rank",
                            sizes[k].name, rank, mv, p, pv);
      mlxd_status_set_peer(st, p, NULL);
      return rc;
    }
  }
  return 0;
}

int mlxd_ring_select_transport(mlxd_transport** tp, int* host_of, char* session_out,
                               mlxd_status* st) {
  mlxd_transport* tcp = *tp;
  const int rank = tcp->rank, size = tcp->size;
  int mode = MLXD_RING_T_AUTO;
  const char* host_id = NULL;
  if (mlxd_ring_transport_mode(&mode, st) || mlxd_route_host_id(&host_id, st)) return st->code;

  unsigned char* ids = calloc((size_t)size, REC_BYTES);
  unsigned char* ok_all = calloc((size_t)size, 1); /* every rank's status byte */
  unsigned char* stat_all = NULL; /* every rank's status and reason: only to say why */
  int* other = calloc((size_t)size, sizeof *other);
  uint64_t* hosts = calloc((size_t)size, sizeof *hosts); /* each rank's host key */
  int* members = calloc((size_t)size, sizeof *members);  /* this host's ranks */
  bool* on_shm = calloc((size_t)size, sizeof *on_shm);
  unsigned char mine[ID_BYTES], my_rec[REC_BYTES], my_status[STATUS_BYTES];
  unsigned char* full = NULL; /* every rank's full record: only to explain different hosts */
  mlxd_transport* shm = NULL;
  int rc = 0;
  if (!ids || !ok_all || !other || !hosts || !members || !on_shm) {
    rc =
        mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory choosing the transport");
    goto done;
  }
  uint64_t session_rand = rank == 0 ? random64() : 0;
  make_id(mine, rank, size, mode, host_id, session_rand);
  make_rec(my_rec, mine, rank, session_rand);
  if ((rc = boot_exchange(tcp, 1, my_rec, ids, REC_BYTES, st))) goto done;

  if ((rc = check_records(ids, mine, rank, size, mode, st))) goto done;
  for (int p = 0; p < size; p++) {
    host_of[p] = p;
    for (int q = 0; q < p; q++)
      if (memcmp(ids + (size_t)p * REC_BYTES + REC_HOST, ids + (size_t)q * REC_BYTES + REC_HOST,
                 8) == 0) {
        host_of[p] = q;
        break;
      }
  }
  char session[ID_SESSION_MAX + 16];
  snprintf(session, ID_SESSION_MAX, "mlxdist-%lu-%016llx",
           (unsigned long)get_u(ids + REC_SESSION_PID, 4),
           (unsigned long long)get_u(ids + REC_SESSION_RAND, 8));
  snprintf(session_out, MLXD_RING_SESSION_MAX, "%s", session);
  int machine = 0; /* the group's ranks on this machine, whatever MLXDIST_HOST_ID says */
  for (int p = 0; p < size; p++)
    machine += get_u(ids + (size_t)p * REC_BYTES + REC_MACHINE, 8) == get_u(mine + ID_MACHINE, 8);
  { /* How the TCP transport waits (spin.h) depends on how crowded this machine's CPUs
     * are: the ranks on this machine (its boot id), not on this host, which may be one of
     * several namespaces or MLXDIST_HOST_ID ids on one machine (6 ranks as 3 hosts of 2 on 2
     * CPUs spun as if each had the CPUs to itself: a 6-rank all_sum took 4 ms, not 0.2). */
    mlxd_spin_rule rule = mlxd_tcp_set_local_ranks(tcp, machine);
    mlxd_net_log("rank %d: %d rank%s on this machine, %d CPU%s: TCP waits %s", rank, machine,
                 machine == 1 ? "" : "s", rule.cpus, rule.cpus == 1 ? "" : "s",
                 rule.yield ? "yield between polls (crowded)" : "poll without yielding");
  }
  if (mode == MLXD_RING_T_TCP) {
    mlxd_net_log("rank %d of %d: transport tcp (MLXDIST_TRANSPORT=tcp)", rank, size);
    mlxd_ring_log_transports(rank, size, on_shm);
    goto done;
  }
  /* The router's facts: every rank's host (shm's can-connect test), tcp
   * for the rest. Who shares a host with rank 0 (for MLXDIST_TRANSPORT=shm's
   * message), and with this rank (its shared-memory session). */
  for (int p = 0; p < size; p++) hosts[p] = get_u(ids + (size_t)p * REC_BYTES + REC_HOST, 8);
  mlxd_route_facts facts = {.rank = rank, .size = size, .host = hosts};
  facts.allow[MLXD_ROUTE_SHM] = facts.allow[MLXD_ROUTE_TCP] = true;
  int m = 0, me = -1;
  for (int p = 1; p < size; p++)
    if (hosts[p] != hosts[0]) other[m++] = p;
  int nloc = mlxd_route_shm_members(&facts, members, &me);
  if (m > 0 && mode == MLXD_RING_T_SHM) {
    char list[160], why[200];
    rank_list(other, m, list, sizeof list);
    /* every rank is here (the records said so): gather the full ones to say why */
    full = calloc((size_t)size, ID_BYTES);
    if (!full) {
      rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP,
                        "out of memory choosing the transport");
      goto done;
    }
    if ((rc = boot_exchange(tcp, 3, mine, full, ID_BYTES, st))) goto done;
    host_diff(full, full + (size_t)other[0] * ID_BYTES, why, sizeof why);
    rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                      "MLXDIST_TRANSPORT=shm needs every rank on one host, but rank%s %s "
                      "%s on a different host than rank 0 (rank %d: %s); use "
                      "MLXDIST_TRANSPORT=auto or tcp",
                      m > 1 ? "s" : "", list, m > 1 ? "are" : "is", other[0], why);
    goto done;
  }

  /* Every rank with company on its host joins that host's session: rank
   * 0's name, suffixed with the host's first rank when the group spans
   * hosts (its ranks are numbered in the session by increasing group rank
   * and named by their group ranks). */
  if (m > 0) {
    size_t l = strlen(session);
    snprintf(session + l, sizeof session - l, "-h%d", members[0]);
  }
  mlxd_status sst = {0};
  if (nloc >= 2)
    shm = m == 0 ? mlxd_shm_transport_new(rank, size, session, &sst)
                 : mlxd_shm_transport_new_named(me, nloc, session, members, size, machine, &sst);
  memset(my_status, 0, sizeof my_status);
  my_status[0] = shm || nloc < 2 ? 1 : 0;
  if (!my_status[0]) {
    /* The reason travels to every rank as text: rendered without a tag,
     * since it becomes part of a ring message (or a log line) there. */
    if (!sst.code) mlxd_fail_at(&sst, MLXD_ESYS, MLXD_LAYER_SHM, "failed without a message");
    mlxd_status_render(&sst, NULL);
    snprintf((char*)my_status + 1, STATUS_BYTES - 1, "%.*s", STATUS_BYTES - 2, sst.msg);
  }
  /* Whether every rank joined: one byte a rank (the reasons, 160 bytes a rank,
   * travel only if one did not: 160 KiB into every rank at 1,024 ranks) */
  if ((rc = boot_exchange(tcp, 2, my_status, ok_all, 1, st))) goto done;
  int bad = -1;
  for (int p = 0; p < size && bad < 0; p++)
    if (ok_all[p] != 1) bad = p;
  if (bad < 0) {
    /* every rank joined: the router gives each peer shm on this host, tcp
     * elsewhere (the TCP transport is closed when no peer takes it) */
    for (int i = 0; i < nloc; i++) on_shm[members[i]] = members[i] != rank;
    mlxd_transport* parts[MLXD_ROUTE_KINDS] = {[MLXD_ROUTE_SHM] = shm, [MLXD_ROUTE_TCP] = tcp};
    mlxd_router_opts ro = {.machine_ranks = machine, .bare_alone = true};
    mlxd_transport* t = mlxd_router_new(&facts, parts, &ro, st);
    if (!t) {
      rc = st->code;
      goto done;
    }
    shm = NULL;
    *tp = t;
    if (m == 0)
      mlxd_net_log(
          "rank %d of %d: transport shm (all %d ranks on host '%s', session %s, "
          "MLXDIST_TRANSPORT=%s)",
          rank, size, size, (const char*)mine + 80, session, mlxd_ring_mode_name(mode));
    else if (nloc >= 2)
      mlxd_net_log(
          "rank %d of %d: transport mixed (%d ranks on host '%s', session %s; tcp to the "
          "other %d)",
          rank, size, nloc, (const char*)mine + 80, session, size - nloc);
    else
      mlxd_net_log("rank %d of %d: transport tcp (no other rank on host '%s')", rank, size,
                   (const char*)mine + 80);
    mlxd_ring_log_transports(rank, size, on_shm);
    goto done;
  }
  /* every rank saw the same bytes, so every rank gathers the reasons */
  stat_all = calloc((size_t)size, STATUS_BYTES);
  if (!stat_all) {
    rc =
        mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory choosing the transport");
    goto done;
  }
  if ((rc = boot_exchange(tcp, 4, my_status, stat_all, STATUS_BYTES, st))) goto done;
  char reason[STATUS_BYTES];
  memcpy(reason, stat_all + (size_t)bad * STATUS_BYTES + 1, STATUS_BYTES - 1);
  reason[STATUS_BYTES - 1] = '\0';
  if (mode == MLXD_RING_T_SHM) {
    rc = mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP,
                      "MLXDIST_TRANSPORT=shm but the shared-memory transport could not "
                      "start on rank %d: %s",
                      bad, reason);
    if (bad != rank) mlxd_status_set_peer(st, bad, NULL);
    goto done;
  }
  mlxd_net_log(
      "rank %d of %d: shared memory could not start on rank %d (%s); falling back "
      "to transport tcp (MLXDIST_TRANSPORT=auto)",
      rank, size, bad, reason);
  mlxd_ring_log_transports(rank, size, on_shm);
done:
  if (shm) shm->ops->destroy(shm);
  free(ids);
  free(full);
  free(ok_all);
  free(stat_all);
  free(other);
  free(hosts);
  free(members);
  free(on_shm);
  return rc;
}

/* ---- ranks that mlxdist-launch started on one host ---- */

_Static_assert(REC_BYTES == MLXD_SHM_BOOT_BYTES, "a host record is a shared-memory boot record");

/* A process's first ring group only: later ones (after clear_backends, or
 * a failed init) take the TCP exchange, so no rank ever opens a session
 * name whose last joiner has yet to remove it. */
static atomic_bool g_session_used;

/* Which job a rank is of, as far as its token and secret say (not a proof:
 * the session is this user's 0600 memory; a mismatch is a mistake to name). */
static uint64_t job_hash(const mlxd_net_auth* auth) {
  const unsigned char keyed = auth->have_key ? 1 : 0;
  uint64_t h = fnv1a(fnv1a(FNV_OFFSET, auth->token, sizeof auth->token), &keyed, 1);
  return auth->have_key ? fnv1a(h, auth->key, sizeof auth->key) : h;
}

int mlxd_ring_select_local(int rank, int size, const mlxd_net_auth* auth, mlxd_transport** out,
                           char* session_out, mlxd_status* st) {
  *out = NULL;
  const char* session = mlxd_tunable_str(MLXD_T_SHM_SESSION);
  if (size < 2 || !session || !*session || atomic_exchange(&g_session_used, true)) return 0;
  int mode = MLXD_RING_T_AUTO;
  const char* host_id = NULL;
  if (mlxd_ring_transport_mode(&mode, st) || mlxd_route_host_id(&host_id, st)) return st->code;
  unsigned char* ids = malloc((size_t)size * REC_BYTES);
  if (!ids)
    return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP,
                        "out of memory choosing the transport");
  unsigned char mine[ID_BYTES], my_rec[REC_BYTES];
  uint64_t session_rand = rank == 0 ? random64() : 0;
  make_id(mine, rank, size, mode, host_id, session_rand);
  make_rec(my_rec, mine, rank, session_rand);
  put_u(my_rec + REC_JOB, job_hash(auth), 8);
  mlxd_status sst = {0};
  mlxd_transport* shm = mlxd_shm_transport_join(rank, size, session, my_rec, ids, &sst);
  if (!shm) {
    /* every rank waits for this one in the session: it cannot fall back alone */
    mlxd_status_render(&sst, NULL);
    mlxd_fail_at(st, sst.code ? sst.code : MLXD_ESYS, MLXD_LAYER_BOOTSTRAP,
                 "rank %d could not join the shared-memory session that mlxdist-launch named "
                 "(MLXDIST_SHM_SESSION=%s): %s; MLXDIST_TRANSPORT=tcp runs the job without it",
                 rank, session, sst.msg);
    free(ids);
    return st->code;
  }
  int rc = check_records(ids, mine, rank, size, mode, st);
  for (int p = 0; p < size && rc == 0; p++)
    if (memcmp(ids + (size_t)p * REC_BYTES + REC_JOB, my_rec + REC_JOB, 8) != 0) {
      rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "rank %d in shared-memory session %s (MLXDIST_SHM_SESSION) is of "
                        "another job than rank %d: its job token or secret differs "
                        "(MLXDIST_JOB_TOKEN, MLXDIST_SECRET_FILE); expected every rank of one "
                        "mlxdist-launch job",
                        p, session, rank);
      mlxd_status_set_peer(st, p, NULL);
    }
  bool one_host = true;
  for (int p = 1; p < size && one_host; p++)
    one_host = memcmp(ids + REC_HOST, ids + (size_t)p * REC_BYTES + REC_HOST, 8) == 0;
  /* Every rank saw the same records, so every rank decides the same. */
  if (rc == 0 && one_host && mode != MLXD_RING_T_TCP) {
    snprintf(session_out, MLXD_RING_SESSION_MAX, "%s", session);
    mlxd_net_log(
        "rank %d of %d: transport shm (all %d ranks on host '%s', session %s from "
        "mlxdist-launch, MLXDIST_TRANSPORT=%s)",
        rank, size, size, (const char*)mine + 80, session, mlxd_ring_mode_name(mode));
    if (mlxd_net_verbose()) {
      bool* on = calloc((size_t)size, sizeof *on);
      for (int p = 0; on && p < size; p++) on[p] = p != rank;
      if (on) mlxd_ring_log_transports(rank, size, on);
      free(on);
    }
    *out = shm;
    shm = NULL;
  } else if (rc == 0) {
    mlxd_net_log("rank %d of %d: %s: the TCP exchange decides", rank, size,
                 mode == MLXD_RING_T_TCP ? "MLXDIST_TRANSPORT=tcp" : "hosts differ");
  }
  if (shm) shm->ops->destroy(shm);
  free(ids);
  return rc;
}

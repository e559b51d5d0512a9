/* Private: two-level ("hierarchical") collectives for a group that spans
 * hosts with several ranks on some host. Where the flat algorithms
 * (algo.h) treat every link alike, these move as little as possible over
 * the links between hosts: inside each host first (shared memory), then
 * across hosts, then inside each host again. Each phase is a flat
 * algorithm run on a view (transport/view.h) of the group's transport:
 * "the ranks of my host" or "the ranks with my local index on every host"
 * (a column), each phase with its own tag phase under the caller's one
 * sequence number. See docs/ring.md, "Two-level collectives".
 *
 * all_reduce, nbytes <= MLXD_HIER_TINY_BYTES with the same number of ranks
 * on every host (fewest dependent hops): a one-shot all-reduce inside each
 * host, then each column one-shot all-reduces the host sums across hosts
 * (two hops; each host's uplink carries one message per rank and remote
 * host instead of the flat one-shot's one per rank and remote rank).
 * all_reduce, nbytes <= MLXDIST_SMALL_BYTES (few messages over the slow
 * links): the ranks of each host send their input to the host's first
 * rank (its leader), which reduces them in local order; the leaders
 * all-reduce across hosts (flat: one-shot); each leader sends the result
 * to its host's ranks. Each host's uplink carries one message per remote
 * leader instead of (its ranks) x (remote ranks).
 * all_reduce, larger: the buffer is cut into c parts, c the fewest ranks
 * any host has; inside each host a reduce-scatter leaves part i with the
 * host's rank of local index i (ranks beyond c get nothing); column i
 * all-reduces part i across hosts (every rank of a full column uses the
 * network, each for 1/c of the buffer); an all-gather inside each host
 * spreads the parts. Above MLXDIST_HIER_SEGMENT bytes (seg_bytes) the
 * buffer is cut into segments of about that size that go through these
 * three phases as a pipeline: segment k crosses the hosts (on a helper
 * thread) while the next ones are reduce-scattered and the previous one
 * is all-gathered inside the host (hier.c has the schedule).
 * all_gather / sum_scatter with the same number of ranks on every host, at
 * every size: columns first for all_gather (each column gathers its ranks'
 * blocks, then each host gathers its columns), host first for sum_scatter
 * (a reduce-scatter inside the host by local index, then one in each column
 * by host); each host's uplink carries (hosts - 1) / hosts of the result
 * (all_gather), where the all_reduce below sends all of it. With hosts of
 * different sizes both run as the two-level all_reduce: all_gather
 * as a byte-wise max over a zeroed buffer holding each rank's block (max
 * with 0 keeps every byte), sum_scatter as the all_reduce of the whole
 * input and this rank's block of it.
 *
 * Every result is bit-identical on every rank that holds it and the same
 * from run to run: each element is reduced in a fixed order (host order
 * inside each host, then the flat algorithm's order across hosts), on one
 * rank, and copied to the others. A failure in any phase aborts the
 * group's transport with it, so ranks in other phases fail at once
 * instead of waiting for a peer that will not come. */
#ifndef MLXD_ALGO_HIER_H
#define MLXD_ALGO_HIER_H

#include <stdbool.h>

#include "algo/algo.h"

/* MLXDIST_ALGO's values (util/tunables.h, in the order of its choices). */
enum { MLXD_ALGO_AUTO = 0, MLXD_ALGO_FLAT = 1, MLXD_ALGO_HIER = 2 };

/* Where the group's ranks are (from the host records: host_of[p] is the
 * lowest rank on p's host). Hosts are numbered in the order of their
 * lowest rank, local indices in increasing group rank. */
typedef struct mlxd_hier {
  int size, rank;
  int nhosts, host;       /* hosts; this rank's */
  int nlocal, local_rank; /* ranks on this rank's host; this rank's index among them */
  int min_local, max_local;
  int* host_count;  /* [nhosts] ranks on each host */
  int* host_start;  /* [nhosts + 1] where each host's ranks start in by_host */
  int* by_host;     /* [size] the group's ranks host by host, increasing inside a host */
  int* col;         /* [nhosts] column local_rank (if local_rank < min_local), else NULL */
  int* leaders;     /* [nhosts] column 0: each host's first rank */
  size_t seg_bytes; /* the slices' pipeline segment (MLXDIST_HIER_SEGMENT; 0: none); the same
                       on every rank */
} mlxd_hier;

/* The topology of rank's group of size ranks; NULL with st set (out of
 * memory, or host_of not naming a rank's host by its lowest rank). */
mlxd_hier* mlxd_hier_new(int rank, int size, const int* host_of, mlxd_status* st);
void mlxd_hier_free(mlxd_hier* h);
/* Whether the two-level form applies: >= 2 hosts and >= 2 ranks on some host. */
bool mlxd_hier_applies(const mlxd_hier* h);
/* MLXDIST_ALGO as one of MLXD_ALGO_*. */
int mlxd_hier_mode(void);
/* "2 hosts x 2" or "2 hosts: 3+1 ranks" (the verbose line). */
void mlxd_hier_describe(const mlxd_hier* h, char* out, size_t n);
/* The form of a two-level all_reduce of nbytes (all_gather and sum_scatter
 * through it too: of their whole buffer). */
typedef enum {
  MLXD_HIER_COLUMNS, /* <= MLXD_HIER_TINY_BYTES, same ranks on every host: host sums by column */
  MLXD_HIER_LEADERS, /* <= MLXDIST_SMALL_BYTES: via one leader per host */
  MLXD_HIER_SLICES,  /* larger: reduce-scatter, slices across hosts, all-gather */
} mlxd_hier_form;
#define MLXD_HIER_TINY_BYTES 256
/* The largest buffer a phase across three or more hosts (the leaders, a
 * column) sends by the one-shot (direct) form; above it, the pipeline. The
 * one-shot sends (hosts - 1) x the buffer through every uplink, the pipeline
 * 2 (hosts - 1) / hosts x; at 3 hosts x 2 ranks, 1 Gbit/s, the one-shot lost
 * from 32 KiB (a 64 KiB column: 4.8 ms against 1.5 ms by the pipeline) and won up to
 * 16 KiB (fewer steps). docs/ring.md, "The cross-host limit". */
#define MLXD_HIER_CROSS_SMALL ((size_t)16 << 10)
mlxd_hier_form mlxd_hier_pick(const mlxd_hier* h, size_t nbytes);
/* "" for the slices, ", host sums by column", ", via host leaders" (the verbose line). */
const char* mlxd_hier_form_note(mlxd_hier_form f);

/* As the functions of algo.h, on t (the group's transport: t->rank ==
 * h->rank, t->size == h->size), h applying. */
int mlxd_algo_hier_all_reduce(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                              const mlxd_sig* sig, const void* in, void* out, size_t count,
                              mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st);
int mlxd_algo_hier_all_gather(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                              const mlxd_sig* sig, const void* in, void* out, size_t nbytes,
                              mlxd_status* st);
int mlxd_algo_hier_reduce_scatter(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                                  const mlxd_sig* sig, const void* in, void* out, size_t count,
                                  mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st);
/* all_to_all (hier_all_to_all.c): large parts go straight to their reader
 * (the flat form: each byte crosses between hosts once either way); small
 * ones are gathered per host so the links between hosts carry one message
 * per pair of hosts instead of one per pair of ranks
 * (mlxd_hier_a2a_gathered picks). */
int mlxd_algo_hier_all_to_all(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                              const mlxd_sig* sig, const void* in, void* out, size_t part_bytes,
                              mlxd_status* st);
/* The gathered form at any part size (tests call it directly): each host's
 * ranks hand their inputs to its leader, the leaders exchange one message
 * per pair of hosts, each leader hands its ranks their outputs. */
int mlxd_algo_hier_all_to_all_gathered(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                                       const mlxd_sig* sig, const void* in, void* out,
                                       size_t part_bytes, mlxd_status* st);
/* Whether an all_to_all of part_bytes per part takes the gathered form
 * (hier_topo.c has the count; docs/ring.md, "Two-level collectives"):
 * while the bytes the busiest host's leader copies beyond the flat form's
 * are at most MLXD_A2A_MSG_BYTES per message its uplink is spared. The same
 * on every rank (it reads only the host map). */
#define MLXD_A2A_MSG_BYTES ((size_t)8 << 10)
bool mlxd_hier_a2a_gathered(const mlxd_hier* h, size_t part_bytes);
/* ", parts gathered per host" or ", parts direct" (the verbose line). */
const char* mlxd_hier_a2a_note(const mlxd_hier* h, size_t part_bytes);

#endif

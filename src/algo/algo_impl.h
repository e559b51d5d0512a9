/* Private to src/algo: the individual algorithms behind algo.h's dispatchers
 * (exposed so tests can run each one on any size) and shared helpers. */
#ifndef MLXD_ALGO_IMPL_H
#define MLXD_ALGO_IMPL_H

#include <assert.h>
#include <stdint.h>

#include "algo/algo.h"

/* Target bytes of one pipeline chunk, unless the transport asks for
 * another size (mlxd_transport.pipeline_chunk: shared memory, shm_impl.h). */
#define MLXD_PIPELINE_CHUNK ((size_t)1 << 20)
/* Receives posted ahead per pipeline direction where a received chunk waits in
 * a scratch slot to be reduced (all_reduce, reduce_scatter); all_gather
 * receives straight into the output and posts every receive at once
 * (src/algo/pipeline.c). */
#define MLXD_PIPELINE_WINDOW 8
/* Use both pipeline directions from this many ranks and bytes on. */
#define MLXD_PIPELINE_BIDIR_MIN_RANKS 3
#define MLXD_PIPELINE_BIDIR_MIN_BYTES ((size_t)1 << 20)

/* all_reduce: every rank sends its buffer to every other and reduces all
 * contributions in rank order (low latency; bit-identical results). */
int mlxd_algo_all_reduce_oneshot(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                 const void* in, void* out, size_t count, mlx_dtype dtype,
                                 mlxd_reduce_op op, mlxd_status* st);
/* all_reduce: the pipeline's reduce-scatter + all-gather; bidir < 0: choose,
 * 0: one direction, 1: both directions (each carries half the buffer). */
int mlxd_algo_all_reduce_pipeline(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                  const void* in, void* out, size_t count, mlx_dtype dtype,
                                  mlxd_reduce_op op, int bidir, mlxd_status* st);
int mlxd_algo_all_gather_direct(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                const void* in, void* out, size_t nbytes, mlxd_status* st);
int mlxd_algo_all_gather_pipeline(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                  const void* in, void* out, size_t nbytes, int bidir,
                                  mlxd_status* st);
int mlxd_algo_reduce_scatter_direct(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                    const void* in, void* out, size_t count, mlx_dtype dtype,
                                    mlxd_reduce_op op, mlxd_status* st);
int mlxd_algo_reduce_scatter_pipeline(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                      const void* in, void* out, size_t count, mlx_dtype dtype,
                                      mlxd_reduce_op op, int bidir, mlxd_status* st);
/* The log-depth forms (logdepth.c: the fold for sizes that are not a power
 * of two and the one reduction order are described there): all_reduce by
 * recursive doubling, reduce_scatter by recursive halving, all_gather by
 * recursive doubling; log2 of the largest power of two <= size (+ 2 with the
 * fold) steps, one peer each, the same peers in all three. */
int mlxd_algo_all_reduce_rd(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                            void* out, size_t count, mlx_dtype dtype, mlxd_reduce_op op,
                            mlxd_status* st);
int mlxd_algo_reduce_scatter_rh(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                const void* in, void* out, size_t count, mlx_dtype dtype,
                                mlxd_reduce_op op, mlxd_status* st);
int mlxd_algo_all_gather_rd(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                            void* out, size_t nbytes, mlxd_status* st);
/* Bruck's rounds: ceil(log2 size) steps, each sending to r - d and receiving
 * from r + d (two peers a step, no fold, a rotation at the end). */
int mlxd_algo_all_gather_bruck(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                               void* out, size_t nbytes, mlxd_status* st);
/* The log-depth all_gather for this transport: Bruck's rounds over shared
 * memory below MLXD_LOGN_SHM_WIDE_RANKS ranks (32 ranks on 2 CPUs: 1 KiB
 * 1.14-1.19x faster than recursive doubling), recursive doubling elsewhere
 * (its peers are all_sum's: fewer connections, fewer shared-memory pairs). */
int mlxd_algo_all_gather_logn(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                              void* out, size_t nbytes, mlxd_status* st);
/* Within the small limit, the dispatchers take the log-depth form where it
 * beat the one-shot / direct one on this machine (docs/performance.md,
 * "Small collectives in log N steps"), unless MLXDIST_SMALL_ALGO forces one.
 * bytes: all_reduce the buffer, all_gather the gathered output,
 * reduce_scatter the input (mlxdist-bench's size). Over TCP and every
 * transport but shared memory (mixed, views) from MLXD_LOGN_NET_*_RANKS
 * ranks; over shared memory (where a step costs a wake-up, and every rank's
 * messages cost little) all_reduce from MLXD_LOGN_SHM_AR_RANKS ranks, or
 * from MLXD_LOGN_SHM_AR_MID_RANKS ranks and MLXD_LOGN_SHM_AR_MID_BYTES;
 * all_gather from MLXD_LOGN_SHM_AG_RANKS ranks up to
 * MLXD_LOGN_SHM_AG_MAX_BYTES;
 * reduce_scatter from MLXD_LOGN_SHM_RS_RANKS ranks up to
 * MLXD_LOGN_SHM_RS_MAX_BYTES; and from MLXD_LOGN_SHM_WIDE_RANKS ranks every
 * small op of every size: a direct / one-shot form makes (and maps) a pair
 * of lanes with every other rank of the host the first time it runs, N^2/2
 * pairs in the job, which costs more than any saving of its single step
 * (docs/performance.md, "Small collectives at 128 ranks and more"). */
#define MLXD_LOGN_NET_AR_RANKS 8
#define MLXD_LOGN_NET_AG_RANKS 8
#define MLXD_LOGN_NET_RS_RANKS 8
#define MLXD_LOGN_SHM_AR_RANKS 64
#define MLXD_LOGN_SHM_AR_MID_RANKS 8
#define MLXD_LOGN_SHM_AR_MID_BYTES ((size_t)4 << 10)
#define MLXD_LOGN_SHM_AG_RANKS 32
#define MLXD_LOGN_SHM_AG_MAX_BYTES ((size_t)1 << 10)
#define MLXD_LOGN_SHM_RS_RANKS 4
#define MLXD_LOGN_SHM_RS_MAX_BYTES ((size_t)16 << 10)
#ifndef MLXD_LOGN_SHM_WIDE_RANKS /* a build may lower it to test the wide forms on few ranks */
#define MLXD_LOGN_SHM_WIDE_RANKS 128
#endif
typedef enum { MLXD_SMALL_AR, MLXD_SMALL_AG, MLXD_SMALL_RS } mlxd_small_op;
/* Whether a small op of `bytes` on t takes the log-depth form. The same on
 * every rank of a group (same size, bytes and kind of transport;
 * MLXDIST_SMALL_ALGO must agree). */
bool mlxd_algo_logn(const mlxd_transport* t, mlxd_small_op op, size_t bytes);
/* As mlxd_algo_all_reduce / _all_gather / _reduce_scatter (algo.h), with
 * `small` in place of MLXDIST_SMALL_BYTES: the largest whole buffer they
 * send by the one-shot (direct) form instead of the pipeline (the two-level
 * collectives' phases across hosts use a smaller one, hier.c). */
int mlxd_algo_all_reduce_upto(mlxd_transport* t, size_t small, uint64_t seq, const mlxd_sig* sig,
                              const void* in, void* out, size_t count, mlx_dtype dtype,
                              mlxd_reduce_op op, mlxd_status* st);
int mlxd_algo_all_gather_upto(mlxd_transport* t, size_t small, uint64_t seq, const mlxd_sig* sig,
                              const void* in, void* out, size_t nbytes, mlxd_status* st);
int mlxd_algo_reduce_scatter_upto(mlxd_transport* t, size_t small, uint64_t seq,
                                  const mlxd_sig* sig, const void* in, void* out, size_t count,
                                  mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st);

/* Blocks of any sizes (the two-level collectives' phases, hier.c): block b
 * is elements [off[b], off[b] + len[b]); the blocks follow each other
 * without gaps from element 0 (off[0] == 0, off[b+1] == off[b] + len[b]);
 * empty blocks are allowed. Pipeline schedules, both directions as
 * mlxd_algo_bidir decides. */
/* reduce_scatter: in holds every block; out receives block `rank` reduced
 * (len[rank] elements). */
int mlxd_algo_reduce_scatter_blocks(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                    const void* in, void* out, const size_t* off, const size_t* len,
                                    mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st);
/* all_gather in place, in bytes: buf holds block `rank` at its offset on
 * entry and every block on return. */
int mlxd_algo_all_gather_blocks(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, void* buf,
                                const size_t* off, const size_t* len, mlxd_status* st);

/* ---- helpers (common.c) ---- */

/* Element size of dtype, for a reduction with op. The caller guarantees
 * both are valid (algo.h's contract); asserted here. */
size_t mlxd_algo_esize(mlx_dtype dtype, mlxd_reduce_op op);
/* a * b; the caller guarantees it does not overflow (asserted). */
static inline size_t mlxd_algo_mul(size_t a, size_t b) {
  assert(a == 0 || b <= SIZE_MAX / a);
  return a * b;
}
/* A structured failure of the algorithm layer (MLXD_LAYER_ALGO): the
 * backend that calls us adds the op and renders the text. */
#define mlxd_algo_fail(st, code, ...) mlxd_fail_at((st), (code), MLXD_LAYER_ALGO, __VA_ARGS__)
/* Wait for (and free) every non-NULL request in reqs; keeps the first error in st
 * unless st already holds one. Returns st's code. */
int mlxd_algo_drain(mlxd_transport* t, mlxd_req** reqs, int n, mlxd_status* st);

/* A collective that moves no bytes on this rank (every algorithm's count-0 case): every
 * pair of ranks exchanges one empty message carrying the call's signature (tag seq, step
 * 0; all_to_all.c's exchange with empty parts). Ranks that passed nothing where a peer passed something so fail at once, both calls
 * named (the peer's data meets this rank's empty receive, this rank's empty message the
 * peer's receive), instead of the peer waiting for this rank until MLXDIST_OP_TIMEOUT;
 * when every rank passed nothing, the op costs n - 1 empty messages each way. */
int mlxd_algo_empty(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, mlxd_status* st);
/* Whether to use both pipeline directions. */
bool mlxd_algo_bidir(int size, size_t nbytes, int bidir);
/* Split blocks (off, len; n of them) over ndir directions: direction 0
 * takes the first half of every block, direction 1 the rest (tab: 4 * n
 * entries, for the plan's boff/blen). */
void mlxd_algo_split_blocks(const size_t* off, const size_t* len, int n, int ndir, size_t* tab,
                            size_t* boff[2], size_t* blen[2]);
/* n equal blocks of len units: n offsets, then n lengths (malloc'd, the
 * caller frees it); NULL with st set when out of memory. */
size_t* mlxd_algo_equal_blocks(int n, size_t len, mlxd_status* st);

/* A pipeline schedule (pipeline.c). */
typedef enum { MLXD_PIPELINE_AR, MLXD_PIPELINE_AG, MLXD_PIPELINE_RS } mlxd_pipeline_mode;
typedef struct mlxd_pipeline_plan {
  mlxd_pipeline_mode mode;
  const mlxd_sig* sig; /* every message's signature (transport.h) */
  size_t esz;
  mlx_dtype dtype;
  mlxd_reduce_op op;
  const char* in;  /* AR: input; RS: input (size blocks); AG: block `rank` (NULL: in out already;
                      else the first step sends from it and the engine copies it into out) */
  char* out;       /* AR: output; AG: output (size blocks); RS: block `rank` */
  char* work;      /* RS: partial sums (same layout as in) */
  size_t out_base; /* RS: element offset of block `rank` in `in`; AG: in `out`; else 0 */
  int ndir;        /* 1 or 2 */
  /* Per direction, the element range [boff[b], boff[b] + blen[b]) of block b
   * in the buffer coordinates (size entries each). */
  size_t* boff[2];
  size_t* blen[2];
} mlxd_pipeline_plan;

int mlxd_pipeline_run(mlxd_transport* t, uint64_t seq, const mlxd_pipeline_plan* p,
                      mlxd_status* st);

#endif

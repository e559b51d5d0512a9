/* Private: collective algorithms, written once over mlxd_transport.
 * Every function is called with the same arguments (but its own buffers)
 * on every rank of the transport, in the same order; seq keeps concurrent
 * collectives apart (it becomes part of every tag). Results are identical
 * on every rank (bit for bit, also for floating point).
 *
 * Contract (the front-end checks it once, for every backend; here it is
 * only asserted): the transport has size >= 2; dtype and op are valid;
 * a peer is a rank of the transport other than its own; buffers are
 * non-NULL when their size is non-zero; no byte count overflows size_t.
 *
 * sig: what the caller is doing (transport.h), passed with every message so
 * that ranks making different calls fail with both named; NULL: unchecked.
 *
 * Errors: a transport's status is passed on untouched; the algorithms'
 * own failures (out of memory, a group too large for the pipeline schedule)
 * are structured (MLXD_LAYER_ALGO) with a detail that names no op. The
 * caller (a backend) sets the op and renders the message. */
#ifndef MLXD_ALGO_H
#define MLXD_ALGO_H

#include <stddef.h>
#include <stdint.h>

#include "mlx/c/array.h"
#include "reduce/reduce.h"
#include "transport/transport.h"
#include "util/status.h"

/* out[i] = OP over ranks of in[i] (count elements; in == out allowed). */
int mlxd_algo_all_reduce(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                         void* out, size_t count, mlx_dtype dtype, mlxd_reduce_op op,
                         mlxd_status* st);
/* out (size * nbytes) = every rank's in (nbytes), in rank order. */
int mlxd_algo_all_gather(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                         void* out, size_t nbytes, mlxd_status* st);
/* As mlxd_algo_all_gather, for a group's set-up exchanges: the algorithm
 * depends on the group size and nbytes alone, never on the environment
 * (MLXDIST_SMALL_BYTES, MLXDIST_SMALL_ALGO), so ranks that disagree on those
 * still meet here and the exchange can say so: recursive doubling (log depth)
 * from MLXD_LOGN_NET_AG_RANKS ranks up to 256 KiB gathered, direct below,
 * the pipeline above. sig: none (set-up messages are unsigned). */
int mlxd_algo_all_gather_setup(mlxd_transport* t, uint64_t seq, const void* in, void* out,
                               size_t nbytes, mlxd_status* st);
/* in: size * count elements; out: count elements = block `rank` of the all_reduce. */
int mlxd_algo_reduce_scatter(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                             void* out, size_t count, mlx_dtype dtype, mlxd_reduce_op op,
                             mlxd_status* st);
/* in and out: size parts of part_bytes each (distinct, not overlapping);
 * part j of in goes to rank j, part i of out comes from rank i. */
int mlxd_algo_all_to_all(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                         void* out, size_t part_bytes, mlxd_status* st);
/* MLXDIST_SMALL_BYTES (0 when not positive), read once per process: it is
 * asked on every op, and reading the environment costs ~900 instructions. */
size_t mlxd_algo_small_bytes(void);

/* Point to point; seq is the per-(peer, direction) number from the front-end. */
int mlxd_algo_send(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* buf,
                   size_t nbytes, int dst, mlxd_status* st);
int mlxd_algo_recv(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, void* buf, size_t nbytes,
                   int src, mlxd_status* st);

#endif

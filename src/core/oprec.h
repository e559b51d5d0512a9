/* Private: the operation record ("flight recorder"). Every rank keeps its
 * last MLXD_OPREC_N operations, of every group, in one table per process:
 * group, sequence number, op, dtype, bytes, peer (send/recv), state
 * (queued, running, done, failed) and the time it spent running. The record
 * is printed as one compact block (docs/troubleshooting.md):
 *  - when an op fails with a timeout or a lost peer (distributed/ops.c),
 *  - with the warning of a long wait (transport/liveness.h),
 *  - on SIGUSR1 when MLXDIST_DUMP_SIGNAL=1 (mlxdist-launch sets it, and
 *    sends SIGUSR1 to every rank when its --timeout expires),
 * and summarised in one short note ("in all_sum #17 for 3.2 s", "after
 * all_sum #16, 61.0 s ago") that heartbeats carry to the peers.
 *
 * Thread-safe (one mutex, held for a few stores; never across I/O). */
#ifndef MLXD_OPREC_H
#define MLXD_OPREC_H

#include <stddef.h>
#include <stdint.h>

#define MLXD_OPREC_N 16

typedef enum mlxd_oprec_state {
  MLXD_OPREC_QUEUED = 0,
  MLXD_OPREC_RUNNING,
  MLXD_OPREC_DONE,
  MLXD_OPREC_FAILED,
} mlxd_oprec_state;

/* Start recording an op (its task was queued): returns a handle for the
 * calls below. op: a static name ("all_sum"); dtype: an mlx_dtype or -1;
 * peer: -1 for collectives. group: a number that tells this process's
 * groups apart (e.g. its size and a counter). */
uint64_t mlxd_oprec_begin(unsigned group, uint64_t seq, const char* op, int dtype, size_t bytes,
                          int peer);
/* The op's task started to run / finished. A handle that fell out of the
 * table is ignored. */
void mlxd_oprec_running(uint64_t h);
void mlxd_oprec_end(uint64_t h, int code);

/* This rank's note: what it is doing now, in at most n - 1 bytes
 * (printable ASCII; "" before the first op). */
void mlxd_oprec_note(char* out, size_t n);

/* Print the record as one block on fd (stderr: 2) with a heading giving
 * why ("timeout", "warning", "signal"). Takes the mutex; writes with
 * write(2). */
void mlxd_oprec_dump(int fd, const char* why);

#endif

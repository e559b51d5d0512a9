/* Private: the operation record ("flight recorder"). Every rank keeps its
 * last MLXD_OPREC_N operations, of every group, in one history per process:
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
 * Thread-safe and lock-free: a few relaxed atomic stores per call (the
 * stream workers run at idle priority; a lock they held while preempted
 * would stall the caller), read seqlock-style by the note and the dump. */
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
 * calls below (never 0). group: a number that tells this process's groups
 * apart (distributed/group.c numbers them 1, 2, ...); rank, size: this
 * process in that group (the record's heading names the rank in the largest
 * group seen, the "world"); seq: the backend's sequence number (the one its
 * messages show); op: a static name as users call it ("all_sum"); dtype: an
 * mlx_dtype or -1; peer: -1 for collectives. */
uint64_t mlxd_oprec_begin(unsigned group, int rank, int size, uint64_t seq, const char* op,
                          int dtype, size_t bytes, int peer);
/* The op's task started to run / finished with code (0: success). A handle
 * that fell out of the history is ignored. */
void mlxd_oprec_running(uint64_t h);
void mlxd_oprec_end(uint64_t h, int code);

/* This rank's note: what it is doing now, in at most n - 1 bytes
 * (printable ASCII): "in all_sum #17 for 3.2 s" (the oldest op not done,
 * since it started to run), "queued all_sum #17 for 3.2 s" (not started),
 * "after all_sum #16, 61.0 s ago" (all done), "failed all_sum #16, 2.0 s
 * ago" (the last op failed), "idle" (no op yet). */
void mlxd_oprec_note(char* out, size_t n);

/* Print the record as one block on fd (stderr: 2) with a heading giving
 * why ("failure", "warning", "signal"), written with write(2). The first line is for programs (mlxdist-launch
 * reads it, docs/troubleshooting.md):
 *   [mlxdist] record rank 1/4 pid 123 host h1 (why): <note>; colls 18
 * colls: how many collectives this rank has entered on its largest group.
 * Then one line per op, oldest first. */
void mlxd_oprec_dump(int fd, const char* why);

/* After an op failed with a timeout or a lost peer: dump the record on
 * stderr ("failure") unless that was done since the last op that succeeded
 * (one block per failure cascade, not one per pending op). */
void mlxd_oprec_dump_failure(void);

/* MLXDIST_DUMP_SIGNAL=1: install a SIGUSR1 handler (it only sets a flag)
 * and a watchdog tick (core/watchdog.h) that prints the record ("signal")
 * within ~0.2 s of the signal. Once per process; nothing without the
 * variable (the signal keeps its disposition), nor when the application
 * has its own SIGUSR1 handler (a warning says so). */
void mlxd_oprec_signal_setup(void);

#endif

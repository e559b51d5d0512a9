/* Private: the launcher's gate, waited for by init (group.c) before any backend starts.
 *
 * mlxdist-launch (tools/launch/supervise.c, spawn.c) starts its ranks with posix_spawn, one after
 * the other, and each rank inherits the read end of one pipe, the gate, named by
 * MLXDIST_LAUNCH_GATE=FD:INODE. The launcher writes one byte into it once every rank is
 * started, then closes its end. Init waits for that byte before any connect bound starts,
 * so a rank started first does not spend its bounds on ranks not yet started; nobody reads
 * the byte (a poll for it), so every process holding the pipe sees it. The write end closed
 * without the byte: the launcher died or could not start a rank, and init fails saying so.
 * The fd is closed after the wait; a program that never calls init keeps it open (one
 * pipe's read end, harmless). docs/launch.md, "How the ranks start". */
#ifndef MLXD_LAUNCH_GATE_H
#define MLXD_LAUNCH_GATE_H

#include "util/status.h"

/* How many MLXDIST_CONNECT_TIMEOUTs the wait for the gate may last. */
#define MLXD_LAUNCH_GATE_TIMEOUTS 4

/* Wait for the gate when MLXDIST_LAUNCH_GATE is set. The first call decides, later calls
 * repeat its verdict. Returns 0 (no gate, the gate open, or a gate that is not this
 * process's: MLXDIST_LAUNCH_GATE names an fd that is closed, not a pipe, or another pipe,
 * ignored with one warning on stderr), or fails st (MLXD_EINVAL: a value that is not
 * FD:INODE; MLXD_EREMOTE: the pipe closed without the byte; MLXD_ETIMEDOUT: not open
 * within MLXD_LAUNCH_GATE_TIMEOUTS x MLXDIST_CONNECT_TIMEOUT; MLXD_ESYS: poll failed). The
 * gate's fd stays open (a process the rank starts later passes at once). Blocks at most that long; the
 * caller serializes calls (group.c: under g_init_mu). */
int mlxd_launch_gate_pass(mlxd_status* st);

#endif

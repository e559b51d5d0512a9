/* Private: which process owns what, for fork() (docs/api.md, "Fork").
 *
 * A group, a stream and a pending array belong to the process that made
 * them: their threads, sockets and shared-memory lanes are that process's.
 * A child made by fork() has copies of them but none of the threads, and
 * the sockets and lanes it shares with its parent must not carry a byte
 * from it. So each such object keeps the id of the process that made it
 * (mlxd_self_pid() then), and every entry point compares it with
 * mlxd_self_pid() now: a copy in another process fails at once with
 * mlxd_fork_refuse's message, and dropping it there frees nothing the
 * parent shares (no shutdown, no goodbye, no unlink, no join).
 *
 * mlxd_self_pid() is a load of a variable set at load time and updated by
 * a pthread_atfork child handler, not a getpid() system call: it is on
 * every op's path (docs/api.md has the cost of both). A child made without
 * fork()'s handlers (a raw clone system call) is not seen; posix_spawn,
 * vfork and system() exec at once and hold nothing (every descriptor
 * mlxdist opens is close-on-exec). */
#ifndef MLXD_FORK_H
#define MLXD_FORK_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "util/status.h"

extern _Atomic int mlxd_fork_pid_; /* use mlxd_self_pid() */

/* This process's id (getpid() as of the last fork; set before main). */
static inline pid_t mlxd_self_pid(void) {
  return (pid_t)atomic_load_explicit(&mlxd_fork_pid_, memory_order_relaxed);
}

/* Whether something stamped with owner (a pid from mlxd_self_pid()) is a
 * copy inherited by a forked child. */
static inline int mlxd_fork_foreign(pid_t owner) { return owner != mlxd_self_pid(); }

/* Fill st (code MLXD_EINVAL, plain text) with
 *   "<prefix>: this <what> was made by process <owner>; process <self> (a fork of it)
 *    cannot use it: <why>"
 * prefix: "[ring] all_sum #3", "[stream] mlx_synchronize" ...; why: what
 * to do instead. Returns MLXD_EINVAL. */
int mlxd_fork_refuse(mlxd_status* st, const char* prefix, const char* what, pid_t owner,
                     const char* why);

/* Make fork() take mu first (a pthread_atfork prepare handler) and release
 * it after, in the parent and in the child: the child then finds mu free
 * and what it guards consistent, whichever thread held it. For the
 * process-wide leaf mutexes held only briefly (the buffer cache, the error
 * handler, the default device, the group list and cache); never one held
 * across a blocking wait or a call out. Call from a constructor (before
 * any thread); at most 8. */
void mlxd_fork_guard(pthread_mutex_t* mu);

/* The advice every refusal of a group ends with. */
#define MLXD_FORK_ADVICE                                                                   \
  "a group, its streams and its pending arrays belong to the process that made them "      \
  "(fork before mlx_distributed_init, or exec a new program in the child; the parent and " \
  "its peers are not affected)"

#endif

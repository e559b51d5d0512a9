/* Which process owns what (fork.h). */
#include "core/fork.h"

#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "core/error.h"

_Atomic int mlxd_fork_pid_;

static void child(void) {
  atomic_store_explicit(&mlxd_fork_pid_, (int)getpid(), memory_order_relaxed);
}

/* Before main (and before anything of this library can run): the id, and
 * the handler that keeps it current in children. */
__attribute__((constructor)) static void fork_init(void) {
  atomic_store_explicit(&mlxd_fork_pid_, (int)getpid(), memory_order_relaxed);
  pthread_atfork(NULL, NULL, child);
}

int mlxd_fork_refuse(mlxd_status* st, const char* prefix, const char* what, pid_t owner,
                     const char* why) {
  return mlxd_fail(st, MLXD_EINVAL,
                   "%s: this %s was made by process %ld; process %ld (a fork of it) cannot use "
                   "it: %s",
                   prefix, what, (long)owner, (long)mlxd_self_pid(), why);
}

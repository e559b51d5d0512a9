/* Which process owns what (fork.h). */
#include "core/fork.h"

#include <pthread.h>
#include <unistd.h>

_Atomic int mlxd_fork_pid_;

#define GUARDS 8
static pthread_mutex_t* g_guards[GUARDS]; /* written by constructors only */
static int g_nguards;

void mlxd_fork_guard(pthread_mutex_t* mu) {
  if (g_nguards < GUARDS) g_guards[g_nguards++] = mu;
}

static void prepare(void) {
  for (int i = 0; i < g_nguards; i++) pthread_mutex_lock(g_guards[i]);
}

static void parent(void) {
  for (int i = g_nguards - 1; i >= 0; i--) pthread_mutex_unlock(g_guards[i]);
}

static void child(void) {
  atomic_store_explicit(&mlxd_fork_pid_, (int)getpid(), memory_order_relaxed);
  parent();
}

/* Before main (and before anything of this library can run): the id, and
 * the handlers that keep it current in children and the guarded mutexes
 * free there. */
__attribute__((constructor)) static void fork_init(void) {
  atomic_store_explicit(&mlxd_fork_pid_, (int)getpid(), memory_order_relaxed);
  pthread_atfork(prepare, parent, child);
}

int mlxd_fork_refuse(mlxd_status* st, const char* prefix, const char* what, pid_t owner,
                     const char* why) {
  return mlxd_fail(st, MLXD_EINVAL,
                   "%s: this %s was made by process %ld; process %ld (a fork of it) cannot use "
                   "it: %s",
                   prefix, what, (long)owner, (long)mlxd_self_pid(), why);
}

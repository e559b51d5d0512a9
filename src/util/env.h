/* Private: the environment as the library reads it, and the threads the
 * library starts (util/env.c).
 *
 * glibc's getenv is not safe against a setenv or unsetenv on another thread
 * (setenv may move the array getenv is walking), and POSIX lets a program with
 * one thread of its own call setenv whenever it likes. A thread that mlxdist
 * starts (a stream's worker, the watchdog, a pipeline's column, a PMIx
 * finalizer) runs beside such a program, so it must never call getenv. The
 * rule, in one place:
 *
 *  - mlxd_env_get(name) on a caller's thread reads the variable now, as
 *    getenv does, and keeps what it read in the library's snapshot. On a thread
 *    of the library's own it returns the snapshot's value and calls nothing.
 *  - mlxd_env_refresh() reads every name the snapshot knows again (a caller's
 *    thread; nothing on the library's own). The library calls it where a
 *    caller's thread enters its setup: init (through mlxd_tunables_check) and
 *    the start of a stream's worker, so a thread sees what was set before.
 *  - Every thread of the library's own is started by mlxd_thread_start: marked
 *    as the library's (mlxd_thread_is_own) and named "mlxd-<job>" (top -H,
 *    gdb, /proc/PID/task/TID/comm), which is also how tests/core's
 *    test_env_threads tells, from an interposed getenv, who called it.
 *
 * Names the snapshot knows: every tunable (util/tunables.h), the other
 * variables the library reads (the list in env.c), and any name read once on a
 * caller's thread. A name read first on the library's own thread, before any
 * caller's thread read or refreshed it, is taken as unset, counted
 * (mlxd_env_misses) and warned about once: a defect of mlxdist's, which the
 * tests check never happens.
 *
 * Values returned stay valid for the life of the process: each distinct value
 * a variable has had is kept once (the memory is bounded by the distinct
 * values a program gives the variables mlxdist reads), so a reader on any
 * thread never holds a freed string. */
#ifndef MLXD_ENV_H
#define MLXD_ENV_H

#include <pthread.h>
#include <stdbool.h>

/* The value of the variable name, or NULL when unset. Any thread; never
 * blocks on I/O (takes the snapshot's lock for a moment when a caller's
 * thread reads a value it has not seen before). */
const char* mlxd_env_get(const char* name);

/* The decimal integer in variable name, within [lo, hi], into *out: 0; 1
 * when unset or empty; -1 when it is not a decimal integer in that range
 * (*out untouched; the caller words both, naming what it needs it for).
 * Any thread (mlxd_env_get). */
int mlxd_env_long(const char* name, long lo, long hi, long* out);

/* mlxd_env_get for tunable t (util/tunables.h's enum), found by its index. */
const char* mlxd_env_tunable(int t);

/* The snapshot's value of tunable t on any thread, never calling getenv (NULL
 * when unset or never read): for code that runs on threads mlxdist did not
 * start and cannot mark, the plugins' own threads calling the host table. */
const char* mlxd_env_tunable_kept(int t);

/* Read every known name again into the snapshot. A caller's thread; does
 * nothing on a thread of the library's own. */
void mlxd_env_refresh(void);

/* Start a thread of the library's own running fn(arg): named "mlxd-<job>"
 * (job cut to fit the 15 bytes a thread name holds) and marked so that
 * mlxd_env_get never calls getenv on it. The caller's signal mask is
 * inherited, as with pthread_create. Returns 0 or pthread_create's error
 * (ENOMEM when the start record cannot be allocated). */
int mlxd_thread_start(pthread_t* th, const char* job, void* (*fn)(void*), void* arg);

/* Whether the calling thread is one mlxd_thread_start started. */
bool mlxd_thread_is_own(void);

/* How many reads on the library's own threads found a name the snapshot had
 * never read (taken as unset); 0 unless mlxdist has a defect. */
unsigned long mlxd_env_misses(void);

#endif

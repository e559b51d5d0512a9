/* Private: the process's watchdog thread. One thread per process, started
 * with the first registration and joined when the last one is removed,
 * runs registered ticks: the transports' heartbeats (transport/liveness.h),
 * the operation record's signal dump (core/oprec.h). It runs at normal
 * priority (a rank busy on every CPU still sends its heartbeats) and sleeps
 * between ticks; a tick must be short and must not block without a bound.
 *
 * A child made by fork() starts with no registrations and no thread (its
 * copies of the parent's transports send no heartbeats: core/fork.h). */
#ifndef MLXD_WATCHDOG_H
#define MLXD_WATCHDOG_H

/* A tick: called on the watchdog thread about every period_s seconds (never
 * two ticks of one registration at once). now: mlxd_now(). */
typedef void (*mlxd_watch_fn)(void* ctx, double now);

/* Register fn(ctx) every period_s seconds (>= 0.01). Returns a handle > 0,
 * or 0 when out of memory or the thread could not start (the caller goes on
 * without: its peers will then take it for dead when it is idle for
 * MLXDIST_TIMEOUT; the failure is printed once). */
int mlxd_watchdog_add(mlxd_watch_fn fn, void* ctx, double period_s);

/* Remove a registration (0 is a no-op). When it returns, fn is not running
 * and will not run again. Must not be called from a tick, nor while holding
 * a lock a tick takes. */
void mlxd_watchdog_remove(int handle);

#endif

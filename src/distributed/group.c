/* Groups and the backend registry: init, init_with_all_gather,
 * clear_backends, the getters, split and is_available.
 *
 * Registry locking. Two mutexes:
 *  - g_cache_mu guards the cache (one group per backend name plus "any");
 *    it is only held for a few pointer moves, never while a backend starts.
 *  - g_init_mu serialises the starting of backends: one init at a time in
 *    the process, so two threads asking for the same backend get one group
 *    (the second finds it cached). It is held while a backend starts, and
 *    so while the caller's all_gather callback runs (on the init thread).
 *    A callback (or anything it calls) that calls init again on the same
 *    thread gets an error instead of a deadlock.
 *  - clear_backends takes only g_cache_mu: it does not wait for an init in
 *    progress on another thread; that init caches its group when it ends.
 * A group released by clear_backends is destroyed there only if no handle
 * or queued op still holds it; otherwise by whoever drops the last reference. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/oprec.h"
#include "distributed/group_impl.h"
#include "distributed/launch_gate.h"
#include "distributed/plugin.h"
#include "util/env.h"
#include "util/env_names.h"
#include "util/text.h"
#include "util/tunables.h"

/* Cache slots: one per registry entry, and "any". */
#define ANY_IDX MLXD_REGISTRY_MAX
#define CACHE_SLOTS (MLXD_REGISTRY_MAX + 1)

#define BIG_MSG 4096

/* ------------------------------------------------------------------ */
/* small helpers                                                       */

/* A registry index or ANY_IDX; -1 for an unknown name. NULL means "any". A
 * name outside the registry is a backend plugin's if libmlxdist-<name>.so
 * loads (registry.c); if not, why (when given) says what was tried. */
static int name_index(const char* bk, char* why, size_t why_len) {
  if (bk == NULL || strcmp(bk, "any") == 0) return ANY_IDX;
  int idx = mlxd_registry_find(bk);
  if (idx < 0) idx = mlxd_registry_add_plugin(bk, why, why_len);
  return idx;
}

static const char* idx_name(int idx) { return idx == ANY_IDX ? "any" : mlxd_registry_name(idx); }

/* "\"any\" (or NULL), \"nccl\", ..., or \"jaccl\"": every name init accepts. */
static void valid_names(char* buf, size_t len) {
  mlxd_text t = {buf, len, 0};
  buf[0] = '\0';
  mlxd_text_add(&t, "\"any\" (or NULL)");
  for (int i = 0; i < mlxd_registry_size; i++)
    mlxd_text_add(&t, "%s\"%s\"", i + 1 == mlxd_registry_size ? " or " : ", ",
                  mlxd_registry[i].name);
  mlxd_text_add(&t, ", or the name of a backend plugin");
}

/* ------------------------------------------------------------------ */
/* the caller's all-gather, kept as an mlxd_bootstrap                  */

struct mlxd_user_gather {
  mlxd_bootstrap bs; /* first member: the backend sees only this */
  atomic_int refs;
  int (*fn)(void* dst, const void* src, size_t n, int rank, int size, void* payload);
  void* payload;
  void (*dtor)(void* payload);
};

/* The callback may only run on the thread that is inside init or split for it. */
static _Thread_local mlxd_user_gather* t_gather;
/* set while a kind's create runs for init("any") (backend.h, mlxd_init_for_any) */
static _Thread_local bool t_for_any;

bool mlxd_init_for_any(void) { return t_for_any; }
static _Thread_local int t_in_init;

static int user_gather_call(mlxd_bootstrap* bs, void* dst, const void* src, size_t n,
                            mlxd_status* st) {
  mlxd_user_gather* u = (mlxd_user_gather*)bs;
  if (t_gather != u)
    return mlxd_fail(st, MLXD_EINVAL,
                     "[distributed] the all_gather callback can only be called on the thread "
                     "that called init or split, while it runs (the backend called it from "
                     "elsewhere)");
  if (bs->size <= 0 || bs->rank < 0 || bs->rank >= bs->size)
    return mlxd_fail(st, MLXD_EINVAL,
                     "[distributed] the all_gather bootstrap has rank %d and size %d (expected "
                     "0 <= rank < size)",
                     bs->rank, bs->size);
  if (n > 0 && (dst == NULL || src == NULL))
    return mlxd_fail(st, MLXD_EINVAL, "[distributed] the all_gather bootstrap got a NULL buffer");
  int rc = u->fn(dst, src, n, bs->rank, bs->size, u->payload);
  if (rc != 0)
    return mlxd_fail(st, MLXD_ECALLBACK, "[distributed] the all_gather callback returned %d", rc);
  return 0;
}

static mlxd_user_gather* user_gather_new(int (*fn)(void*, const void*, size_t, int, int, void*),
                                         void* payload, void (*dtor)(void*)) {
  mlxd_user_gather* u = calloc(1, sizeof *u);
  if (!u) return NULL;
  u->bs.rank = -1;
  u->bs.size = 0;
  u->bs.all_gather = user_gather_call;
  atomic_init(&u->refs, 1);
  u->fn = fn;
  u->payload = payload;
  u->dtor = dtor;
  return u;
}

static mlxd_user_gather* user_gather_retain(mlxd_user_gather* u) {
  if (u) atomic_fetch_add(&u->refs, 1);
  return u;
}

static void user_gather_release(mlxd_user_gather* u) {
  if (!u || atomic_fetch_sub(&u->refs, 1) != 1) return;
  if (u->dtor) u->dtor(u->payload);
  free(u);
}

/* ------------------------------------------------------------------ */
/* groups                                                              */

/* ------------------------------------------------------------------ */
/* the process's live groups (for the record's numbers and for exit)   */

static pthread_mutex_t g_live_mu = PTHREAD_MUTEX_INITIALIZER;
static mlxd_group* g_live; /* doubly linked through live_prev/live_next */
static unsigned g_next_id = 1;
/* A forked child's copies of its parent's groups whose last reference went
 * there: kept, unused and reachable (linked through live_next). */
static mlxd_group* g_forgotten;

static pthread_mutex_t g_cache_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;

/* The list and the cache are consistent and free in a forked child. */
__attribute__((constructor)) static void group_fork_guard(void) {
  mlxd_fork_guard(&g_live_mu);
  mlxd_fork_guard(&g_cache_mu);
}

/* In a child made by fork() (one thread, the one that forked): the init
 * lock may be held by a thread that is not here (it is held across a
 * backend's start-up, so fork does not wait for it), so it starts afresh;
 * and the child closes its copies of every live group's descriptors (the
 * backend's forget op: close() only, nothing sent), so it holds none of
 * its parent's connections, whether or not it execs. */
static void groups_after_fork(void) {
  pthread_mutex_init(&g_init_mu, NULL);
  for (mlxd_group* g = g_live; g; g = g->live_next) /* all the parent's (idempotent) */
    if (g->backend->ops->forget) g->backend->ops->forget(g->backend);
}

static pthread_once_t g_fork_once = PTHREAD_ONCE_INIT;
static void fork_watch(void) { pthread_atfork(NULL, NULL, groups_after_fork); }

static void live_add(mlxd_group* g) {
  pthread_mutex_lock(&g_live_mu);
  g->id = g_next_id++;
  g->live_prev = NULL;
  g->live_next = g_live;
  if (g_live) g_live->live_prev = g;
  g_live = g;
  pthread_mutex_unlock(&g_live_mu);
}

static void live_remove(mlxd_group* g) {
  pthread_mutex_lock(&g_live_mu);
  if (g->live_prev)
    g->live_prev->live_next = g->live_next;
  else if (g_live == g)
    g_live = g->live_next;
  if (g->live_next) g->live_next->live_prev = g->live_prev;
  g->live_prev = g->live_next = NULL;
  pthread_mutex_unlock(&g_live_mu);
}

void mlxd_groups_abort_pending(void) {
  mlxd_status st;
  mlxd_fail_at(&st, MLXD_EABORTED, MLXD_LAYER_BACKEND,
               "the group was closed with this operation pending (the process is exiting)");
  /* A group's last reference is dropped (live_remove) only after its ops
   * are gone, and with an op pending it holds a reference: take one under
   * the list's mutex, where the group cannot be removed, from a count > 0. */
  for (;;) {
    mlxd_group* hit = NULL;
    pthread_mutex_lock(&g_live_mu);
    for (mlxd_group* g = g_live; g && !hit; g = g->live_next) {
      /* finished first: queued is never behind it, so no false "pending" */
      uint64_t fin = atomic_load(&g->finished);
      /* a forked child's copy: its ops and its peers are the parent's */
      if (mlxd_group_foreign(g)) continue;
      if (g->aborted || atomic_load(&g->queued) == fin || !g->backend->ops->abort) continue;
      int r = atomic_load(&g->refs);
      while (r > 0 && !atomic_compare_exchange_weak(&g->refs, &r, r + 1)) {
      }
      if (r > 0) {
        g->aborted = true;
        hit = g;
      }
    }
    pthread_mutex_unlock(&g_live_mu);
    if (!hit) return;
    hit->backend->ops->abort(hit->backend, &st);
    mlxd_group_release(hit);
  }
}

/* Takes ownership of b (destroyed on failure); retains u and parent.
 * A group of one always holds the size-one backend (single.c), whatever
 * started it (a one-rank hostfile, mpirun -n 1, a split into singletons):
 * backends are never called with size 1 (backend.h), and a group of one
 * needs nothing from its backend, so that instance is released at once. */
static mlxd_group* group_new(mlxd_backend* b, const char* kind, mlxd_user_gather* u,
                             mlxd_group* parent, mlxd_status* st) {
  if (b->size <= 0 || b->rank < 0 || b->rank >= b->size) {
    mlxd_fail(st, MLXD_EINVAL, "[distributed] the %s backend reported rank %d of size %d", kind,
              b->rank, b->size);
    b->ops->destroy(b);
    return NULL;
  }
  if (b->size == 1 && b->ops != mlxd_single_ops()) {
    b->ops->destroy(b);
    b = mlxd_single_backend_new();
    if (!b) {
      mlxd_fail(st, MLXD_ENOMEM, "[distributed] out of memory creating a group of one");
      return NULL;
    }
  }
  mlxd_group* g = calloc(1, sizeof *g);
  _Atomic uint64_t* seqs = calloc(2 * (size_t)b->size, sizeof *seqs);
  if (!g || !seqs) {
    free(g);
    free(seqs);
    b->ops->destroy(b);
    mlxd_fail(st, MLXD_ENOMEM, "[distributed] out of memory creating a group of %d", b->size);
    return NULL;
  }
  atomic_init(&g->refs, 1);
  g->pid = mlxd_self_pid();
  pthread_once(&g_fork_once, fork_watch);
  g->backend = b;
  g->kind = kind;
  g->gather = user_gather_retain(u);
  g->parent = mlxd_group_retain(parent);
  mlxd_status ignore;
  mlxd_status_clear(&ignore);
  g->comm_stream = mlxd_default_stream(b->comm_device, &ignore);
  atomic_init(&g->coll_seq, 0);
  g->send_seq = seqs;
  g->recv_seq = seqs + b->size;
  atomic_init(&g->queued, 0);
  atomic_init(&g->finished, 0);
  live_add(g);
  mlxd_stream_set_exit_hook(mlxd_groups_abort_pending);
  if (b->size > 1) mlxd_oprec_signal_setup();
  return g;
}

static mlxd_group* single_group(mlxd_status* st) {
  mlxd_backend* b = mlxd_single_backend_new();
  if (!b) {
    mlxd_fail(st, MLXD_ENOMEM, "[distributed] out of memory creating a size-one group");
    return NULL;
  }
  return group_new(b, "single", NULL, NULL, st);
}

mlxd_group* mlxd_group_retain(mlxd_group* g) {
  if (g) atomic_fetch_add(&g->refs, 1);
  return g;
}

int mlxd_group_refuse(const mlxd_group* g, const char* op, bool numbered) {
  char prefix[96];
  if (numbered)
    snprintf(prefix, sizeof prefix, "[%s] %s #%llu", g->kind, op,
             (unsigned long long)atomic_load_explicit(&g->coll_seq, memory_order_relaxed));
  else
    snprintf(prefix, sizeof prefix, "[%s] %s", g->kind, op);
  mlxd_status st;
  mlxd_fork_refuse(&st, prefix, "group", g->pid, MLXD_FORK_ADVICE);
  return mlxd_error_status(&st);
}

void mlxd_group_release(mlxd_group* g) {
  if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
  if (mlxd_group_foreign(g)) {
    /* A forked child's copy (group_impl.h): forget it, touch nothing. */
    live_remove(g);
    pthread_mutex_lock(&g_live_mu);
    g->live_next = g_forgotten;
    g_forgotten = g;
    pthread_mutex_unlock(&g_live_mu);
    return;
  }
  live_remove(g);
  g->backend->ops->destroy(g->backend);
  mlxd_group_release(g->parent);
  user_gather_release(g->gather);
  free((void*)g->send_seq);
  free(g);
}

/* *res = g (a reference the caller passes on), releasing what *res held. */
static void set_result(mlx_distributed_group* res, mlxd_group* g) {
  mlxd_group* old = mlxd_group_of(*res);
  res->ctx = g;
  mlxd_group_release(old);
}

/* ------------------------------------------------------------------ */
/* the registry                                                        */

static mlxd_group* g_cache[CACHE_SLOTS];

static mlxd_group* cache_get(int idx) {
  pthread_mutex_lock(&g_cache_mu);
  mlxd_group* g = mlxd_group_retain(g_cache[idx]);
  pthread_mutex_unlock(&g_cache_mu);
  return g;
}

/* Cache g under idx and, if nothing is there yet, under "any". */
static void cache_put(int idx, mlxd_group* g) {
  pthread_mutex_lock(&g_cache_mu);
  if (!g_cache[idx]) g_cache[idx] = mlxd_group_retain(g);
  if (!g_cache[ANY_IDX]) g_cache[ANY_IDX] = mlxd_group_retain(g);
  pthread_mutex_unlock(&g_cache_mu);
}

/* Try one backend. Returns a new group, or NULL with the reason in why.
 * For "any" (for_any), a backend whose configuration is absent
 * (is_configured) is not started: non-strict, it is skipped outright (the
 * default group of every op on an empty handle goes through here, and
 * builds no messages); strict, its create names what is missing, which by
 * the kind's contract starts nothing (backend.h). */
static mlxd_group* try_start(int idx, mlxd_user_gather* u, bool for_any, bool strict, char* why,
                             size_t why_len, int* code) {
  const char* name = mlxd_registry_name(idx);
  const mlxd_backend_kind* kind = mlxd_registry_kind(idx, why, why_len);
  if (!kind) {
    *code = MLXD_EUNAVAIL;
    return NULL;
  }
  /* first, being cheap: is_available may probe hardware (jaccl opens every RDMA device) */
  if (for_any && !strict && !kind->is_configured(u != NULL)) {
    snprintf(why, why_len, "[%s] not configured", name);
    *code = MLXD_EUNAVAIL;
    return NULL;
  }
  if (!kind->is_available(why, why_len)) {
    if (!why[0]) snprintf(why, why_len, "[%s] not available in this process", name);
    *code = MLXD_EUNAVAIL;
    if (!kind->diagnose_unavailable || (for_any && !strict)) return NULL;
    why[0] = '\0'; /* create names the configuration's error first, then this reason */
  }
  if (u && !kind->supports_bootstrap) {
    snprintf(why, why_len, "[%s] this backend cannot be started with a caller's all_gather", name);
    *code = MLXD_EINVAL;
    return NULL;
  }
  mlxd_status st;
  mlxd_status_clear(&st);
  mlxd_backend* b = NULL;
  mlxd_user_gather* saved = t_gather;
  t_gather = u;
  t_for_any = for_any;
  int rc = kind->create(u ? &u->bs : NULL, &b, &st);
  t_for_any = false;
  t_gather = saved;
  if (rc != 0 || !b) {
    if (b) b->ops->destroy(b);
    snprintf(why, why_len, "%s", st.msg[0] ? st.msg : "(the backend gave no reason)");
    *code = rc ? rc : MLXD_EUNAVAIL;
    return NULL;
  }
  mlxd_group* g = group_new(b, kind->name, u, NULL, &st);
  if (!g) {
    snprintf(why, why_len, "%s", st.msg);
    *code = st.code;
  }
  return g;
}

/* The heart of init / init_with_all_gather / the default group.
 * Returns a new reference, or NULL with msg/code set (strict failure, or
 * out of memory, or a recursive call). A cached group is returned as is
 * (u is then not used). */
static mlxd_group* do_init(bool strict, int idx, mlxd_user_gather* u, char* msg, size_t len,
                           int* code) {
  mlxd_text t = {msg, len, 0};
  msg[0] = '\0';
  mlxd_group* g = cache_get(idx);
  if (g) return g;
  if (t_in_init) {
    mlxd_text_add(
        &t,
        "[distributed] init was called again while an init is running on this thread (from "
        "inside an all_gather callback?); that would deadlock");
    *code = MLXD_EINVAL;
    return NULL;
  }
  /* a bad MLXDIST_* value fails init, strict or not; an unknown name is warned about once
   * (an error under MLXDIST_STRICT_ENV=1) */
  mlxd_status cst = {0};
  mlxd_env_refresh(); /* what the library's threads will read (util/env.h) */
  if (mlxd_tunables_check(&cst) != 0 || mlxd_env_names_check(&cst) != 0) {
    mlxd_text_add(&t, "[distributed] init: %s", cst.msg);
    *code = cst.code;
    return NULL;
  }
  pthread_mutex_lock(&g_init_mu);
  t_in_init = 1;
  g = cache_get(idx);
  if (g) goto done;
  /* mlxdist-launch's ranks: every rank started before any connect bound starts; a launcher
   * that died or could not start them all fails init, strict or not (launch_gate.h) */
  if (mlxd_launch_gate_pass(&cst) != 0) {
    mlxd_text_add(&t, "%s", cst.msg);
    *code = cst.code;
    goto done;
  }

  int cand[MLXD_REGISTRY_MAX], n = 0;
  if (idx != ANY_IDX)
    cand[n++] = idx;
  else
    n = mlxd_registry_any_order(u != NULL, cand);

  char why[BIG_MSG];
  int why_code = MLXD_EUNAVAIL;
  if (idx == ANY_IDX)
    mlxd_text_add(&t, "[distributed] init: no backend could be started (tried %s: ",
                  n == 1 ? "one" : "in order");
  for (int i = 0; i < n; i++) { /* a backend already started under its own name */
    g = cache_get(cand[i]);
    if (g) {
      cache_put(cand[i], g);
      goto done;
    }
  }
  for (int i = 0; i < n; i++) {
    int c = cand[i];
    why[0] = '\0';
    g = try_start(c, u, idx == ANY_IDX, strict, why, sizeof why, &why_code);
    if (g) {
      cache_put(c, g);
      goto done;
    }
    if (idx == ANY_IDX)
      mlxd_text_add(&t, "%s%s: %s", i ? "; " : "", idx_name(c), why);
    else
      mlxd_text_add(&t, "[distributed] init: could not start the %s backend: %s", idx_name(c), why);
  }
  if (idx == ANY_IDX) mlxd_text_add(&t, ")");

  if (strict) {
    *code = idx == ANY_IDX ? MLXD_EUNAVAIL : why_code;
  } else {
    mlxd_status st;
    mlxd_status_clear(&st);
    g = single_group(&st); /* not cached: a later init tries again */
    if (!g) {
      msg[0] = '\0';
      snprintf(msg, len, "%s", st.msg);
      *code = st.code;
    }
  }
done:
  t_in_init = 0;
  pthread_mutex_unlock(&g_init_mu);
  return g;
}

mlxd_group* mlxd_group_default(mlxd_status* st) {
  char msg[BIG_MSG];
  int code = MLXD_EUNAVAIL;
  mlxd_group* g = do_init(false, ANY_IDX, NULL, msg, sizeof msg, &code);
  if (!g) mlxd_fail(st, code ? code : MLXD_EUNAVAIL, "%s", msg);
  return g;
}

/* ------------------------------------------------------------------ */
/* public API                                                          */

mlx_distributed_group mlx_distributed_group_new(void) {
  mlx_distributed_group g = {NULL};
  return g;
}

int mlx_distributed_group_free(mlx_distributed_group group) {
  mlxd_group_release(mlxd_group_of(group));
  return 0;
}

int mlx_distributed_init(mlx_distributed_group* res, bool strict, const char* bk) {
  if (!res) {
    mlxd_error("[distributed] init: res is NULL (expected a pointer to an mlx_distributed_group)");
    return MLXD_EINVAL;
  }
  char why[BIG_MSG];
  int idx = name_index(bk, why, sizeof why);
  if (idx < 0) {
    char names[256];
    valid_names(names, sizeof names);
    mlxd_error("[distributed] init: unknown backend \"%s\" (expected %s: %s)", bk, names, why);
    return MLXD_EINVAL;
  }
  char msg[BIG_MSG];
  int code = MLXD_EUNAVAIL;
  mlxd_group* g = do_init(strict, idx, NULL, msg, sizeof msg, &code);
  if (!g) {
    mlxd_error("%s", msg);
    return code ? code : MLXD_EUNAVAIL;
  }
  set_result(res, g);
  return 0;
}

/* Whether a backend takes the caller's all-gather: its kind says
 * (supports_bootstrap). A plugin that cannot be loaded cannot say, and
 * counts as no. */
static bool accepts_gather(int idx) {
  char why[BIG_MSG];
  const mlxd_backend_kind* k = mlxd_registry_kind(idx, why, sizeof why);
  return k && k->supports_bootstrap;
}

/* "\"ring\", \"jaccl\" and \"any\"": the names init_with_all_gather accepts. */
static void gather_names(char* buf, size_t len) {
  mlxd_text t = {buf, len, 0};
  buf[0] = '\0';
  for (int i = 0; i < mlxd_registry_size; i++)
    if (accepts_gather(i)) mlxd_text_add(&t, "\"%s\", ", mlxd_registry[i].name);
  mlxd_text_add(&t, "and \"any\"");
}

int mlx_distributed_init_with_all_gather(mlx_distributed_group* res, bool strict, const char* bk,
                                         int (*all_gather)(void* dst, const void* src,
                                                           size_t n_bytes, int rank, int size,
                                                           void* payload),
                                         void* payload, void (*dtor)(void* payload)) {
  /* Every early return runs dtor(payload) once: the callback is not kept. */
  if (!res) {
    if (dtor) dtor(payload);
    mlxd_error(
        "[distributed] init_with_all_gather: res is NULL (expected a pointer to an "
        "mlx_distributed_group)");
    return MLXD_EINVAL;
  }
  if (!all_gather) {
    if (dtor) dtor(payload);
    mlxd_error("[distributed] init_with_all_gather: all_gather is NULL (expected a callback)");
    return MLXD_EINVAL;
  }
  char why[BIG_MSG];
  int idx = name_index(bk, why, sizeof why);
  if (idx < 0) {
    if (dtor) dtor(payload);
    char names[256];
    valid_names(names, sizeof names);
    mlxd_error("[distributed] init_with_all_gather: unknown backend \"%s\" (expected %s: %s)", bk,
               names, why);
    return MLXD_EINVAL;
  }
  if (idx != ANY_IDX && !accepts_gather(idx)) {
    if (dtor) dtor(payload);
    char names[256];
    gather_names(names, sizeof names);
    mlxd_error(
        "[distributed] init_with_all_gather: backend \"%s\" cannot be started with a caller's "
        "all_gather (supported: %s)",
        idx_name(idx), names);
    return MLXD_EINVAL;
  }
  mlxd_user_gather* u = user_gather_new(all_gather, payload, dtor);
  if (!u) {
    if (dtor) dtor(payload);
    mlxd_error("[distributed] init_with_all_gather: out of memory");
    return MLXD_ENOMEM;
  }
  char msg[BIG_MSG];
  int code = MLXD_EUNAVAIL;
  mlxd_group* g = do_init(strict, idx, u, msg, sizeof msg, &code);
  /* Drop our reference: a group started with u keeps its own; otherwise
   * (cached group, failure, size-one fallback) this runs dtor now. */
  user_gather_release(u);
  if (!g) {
    mlxd_error("%s", msg);
    return code ? code : MLXD_EUNAVAIL;
  }
  set_result(res, g);
  return 0;
}

int mlx_distributed_clear_backends(void) {
  mlxd_group* drop[CACHE_SLOTS];
  pthread_mutex_lock(&g_cache_mu);
  for (int i = 0; i < CACHE_SLOTS; i++) {
    drop[i] = g_cache[i];
    g_cache[i] = NULL;
  }
  pthread_mutex_unlock(&g_cache_mu);
  for (int i = 0; i < CACHE_SLOTS; i++) mlxd_group_release(drop[i]);
  return 0;
}

static int get_value(int* res, mlx_distributed_group group, bool rank, const char* fn) {
  if (!res) {
    mlxd_error("[distributed] %s: res is NULL (expected a pointer to an int)", fn);
    return MLXD_EINVAL;
  }
  mlxd_group* g = mlxd_group_of(group);
  if (!g) {
    mlxd_error(
        "[distributed] %s: the group is an empty handle (expected one from "
        "mlx_distributed_init)",
        fn);
    return MLXD_EINVAL;
  }
  *res = rank ? g->backend->rank : g->backend->size;
  return 0;
}

int mlx_distributed_group_get_rank(int* res, mlx_distributed_group group) {
  return get_value(res, group, true, "group_get_rank");
}

int mlx_distributed_group_get_size(int* res, mlx_distributed_group group) {
  return get_value(res, group, false, "group_get_size");
}

int mlx_distributed_group_rank(mlx_distributed_group group) {
  int v = 0;
  if (get_value(&v, group, true, "group_rank") != 0) return 0;
  return v;
}

int mlx_distributed_group_size(mlx_distributed_group group) {
  int v = 0;
  if (get_value(&v, group, false, "group_size") != 0) return 0;
  return v;
}

int mlx_distributed_group_split(mlx_distributed_group* res, mlx_distributed_group group, int color,
                                int key) {
  if (!res) {
    mlxd_error(
        "[distributed] group_split: res is NULL (expected a pointer to an "
        "mlx_distributed_group)");
    return MLXD_EINVAL;
  }
  mlxd_group* g = mlxd_group_of(group);
  if (!g) {
    mlxd_error(
        "[distributed] group_split: the group is an empty handle (expected one from "
        "mlx_distributed_init)");
    return MLXD_EINVAL;
  }
  if (color < 0) {
    mlxd_error("[distributed] group_split: color is %d (expected a color >= 0)", color);
    return MLXD_EINVAL;
  }
  if (mlxd_group_foreign(g)) return mlxd_group_refuse(g, "split", true);
  mlxd_backend* b = g->backend;
  if (key < 0) key = b->rank;

  uint64_t seq = atomic_fetch_add_explicit(&g->coll_seq, 1, memory_order_relaxed);

  mlxd_status st;
  mlxd_status_clear(&st);
  mlxd_backend* nb = NULL;
  mlxd_user_gather* saved = t_gather;
  t_gather = g->gather; /* the kept callback may be used, on this thread */
  int rc = b->ops->split(b, seq, color, key, &nb, &st);
  t_gather = saved;
  if (rc != 0 || !nb) {
    if (nb) nb->ops->destroy(nb);
    if (!st.msg[0]) mlxd_fail(&st, MLXD_EINVAL, "[%s] split failed", g->kind);
    return mlxd_error_status(&st);
  }
  mlxd_group* ng = group_new(nb, g->kind, g->gather, g, &st);
  if (!ng) return mlxd_error_status(&st);
  set_result(res, ng);
  return 0;
}

bool mlx_distributed_is_available(const char* bk) {
  char why[BIG_MSG];
  int idx = name_index(bk, why, sizeof why);
  if (idx < 0) return false;
  if (idx != ANY_IDX) {
    const mlxd_backend_kind* k = mlxd_registry_kind(idx, why, sizeof why);
    return k && k->is_available(why, sizeof why);
  }
  for (int i = 0; i < mlxd_registry_size; i++) {
    const mlxd_backend_kind* k = mlxd_registry_kind(i, why, sizeof why);
    if (k && k->is_available(why, sizeof why)) return true;
  }
  return false;
}

void mlxd_group_describe(const mlxd_group* g, char* buf, size_t len) {
  if (!buf || len == 0) return;
  char d[1024];
  if (!mlxd_plugin_describe(g->backend, d, sizeof d))
    snprintf(d, sizeof d, "%s",
             g->backend->ops == mlxd_single_ops() ? "the size-one group" : "built in");
  snprintf(buf, len, "%s, rank %d of %d: %s", g->kind, g->backend->rank, g->backend->size, d);
}

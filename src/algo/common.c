/* Helpers shared by the collective algorithms: element sizes (the
 * arguments were checked by the front-end; asserted here) and draining
 * outstanding requests on an error path. */
#include <assert.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo_impl.h"
#include "util/tunables.h"

size_t mlxd_algo_esize(mlx_dtype dtype, mlxd_reduce_op op) {
  assert((int)dtype >= 0 && (int)dtype <= (int)MLX_COMPLEX64);
  assert(op >= MLXD_SUM && op <= MLXD_MIN);
  (void)op;
  return mlx_dtype_size(dtype);
}

static pthread_once_t g_small_once = PTHREAD_ONCE_INIT;
static size_t g_small;

static void small_init(void) {
  long v = mlxd_tunable_long(MLXD_T_SMALL_BYTES);
  g_small = v > 0 ? (size_t)v : 0;
}

size_t mlxd_algo_small_bytes(void) {
  pthread_once(&g_small_once, small_init);
  return g_small;
}

static pthread_once_t g_form_once = PTHREAD_ONCE_INIT;
static int g_form; /* MLXDIST_SMALL_ALGO: 0 auto, 1 direct, 2 logn */

static void form_init(void) { g_form = (int)mlxd_tunable_long(MLXD_T_SMALL_ALGO); }

bool mlxd_algo_logn(const mlxd_transport* t, mlxd_small_op op, size_t bytes) {
  pthread_once(&g_form_once, form_init);
  if (g_form) return g_form == 2;
  int n = t->size;
  if (n < 4) return false; /* below every threshold: no name compared */
  if (strcmp(t->ops->name, "shm") != 0) {
    if (op == MLXD_SMALL_AR) return n >= MLXD_LOGN_NET_AR_RANKS;
    if (op == MLXD_SMALL_AG) return n >= MLXD_LOGN_NET_AG_RANKS;
    return n >= MLXD_LOGN_NET_RS_RANKS;
  }
  if (n >= MLXD_LOGN_SHM_WIDE_RANKS) return true; /* a pair per peer costs more than a step */
  if (op == MLXD_SMALL_AR)
    return n >= MLXD_LOGN_SHM_AR_RANKS ||
           (n >= MLXD_LOGN_SHM_AR_MID_RANKS && bytes >= MLXD_LOGN_SHM_AR_MID_BYTES);
  if (op == MLXD_SMALL_AG)
    return n >= MLXD_LOGN_SHM_AG_RANKS && bytes <= MLXD_LOGN_SHM_AG_MAX_BYTES;
  return n >= MLXD_LOGN_SHM_RS_RANKS && bytes <= MLXD_LOGN_SHM_RS_MAX_BYTES;
}

int mlxd_algo_drain(mlxd_transport* t, mlxd_req** reqs, int n, mlxd_status* st) {
  bool any = false;
  for (int i = 0; i < n && !any; i++) any = reqs[i] != NULL;
  if (!any) return st->code;
  if (!st->code) {
    /* Nothing to keep: the wait reports straight into st (a transport
     * writes st only when it fails; a success leaves no code behind). */
    if (t->ops->waitall(t, reqs, n, st) == 0 && st->code) mlxd_status_reset(st);
    return st->code;
  }
  mlxd_status tmp;
  mlxd_status_reset(&tmp);
  t->ops->waitall(t, reqs, n, &tmp); /* st keeps its first error */
  return st->code;
}

bool mlxd_algo_bidir(int size, size_t nbytes, int bidir) {
  if (bidir >= 0) return bidir > 0 && size >= 2;
  return size >= MLXD_PIPELINE_BIDIR_MIN_RANKS && nbytes >= MLXD_PIPELINE_BIDIR_MIN_BYTES;
}

size_t* mlxd_algo_equal_blocks(int n, size_t len, mlxd_status* st) {
  size_t* ol = malloc(2 * (size_t)n * sizeof *ol);
  if (!ol) {
    mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for a pipeline schedule");
    return NULL;
  }
  for (int b = 0; b < n; b++) {
    ol[b] = (size_t)b * len;
    ol[n + b] = len;
  }
  return ol;
}

void mlxd_algo_split_blocks(const size_t* off, const size_t* len, int n, int ndir, size_t* tab,
                            size_t* boff[2], size_t* blen[2]) {
  for (int di = 0; di < ndir; di++) {
    boff[di] = tab + (size_t)di * 2 * (size_t)n;
    blen[di] = boff[di] + n;
  }
  for (int b = 0; b < n; b++) {
    size_t h = ndir == 2 ? len[b] / 2 : len[b];
    boff[0][b] = off[b];
    blen[0][b] = h;
    if (ndir == 2) {
      boff[1][b] = off[b] + h;
      blen[1][b] = len[b] - h;
    }
  }
}

/* mlxdist-bench: nccl-tests style measurements of the distributed ops,
 * through the public mlx-c API only. Run one process per rank, e.g.
 *   mlxdist-launch -n 4 -- mlxdist-bench --op all --check */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "mlx/c/array.h"
#include "mlx/c/distributed.h"
#include "mlx/c/distributed_group.h"
#include "mlx/c/error.h"
#include "mlx/c/stream.h"

static int mlxd_bench_rank = -1;

static void mlxd_bench_on_error(const char* msg, void* data) {
  (void)data;
  fprintf(stderr, "[bench] rank %d: %s\n", mlxd_bench_rank, msg);
}

static mlx_dtype mlxd_bench_mlx_dtype(const mlxd_bench_dtype* dt) {
  static const struct {
    const char* name;
    mlx_dtype t;
  } map[] = {{"bool", MLX_BOOL},        {"uint8", MLX_UINT8},     {"uint16", MLX_UINT16},
             {"uint32", MLX_UINT32},    {"uint64", MLX_UINT64},   {"int8", MLX_INT8},
             {"int16", MLX_INT16},      {"int32", MLX_INT32},     {"int64", MLX_INT64},
             {"float16", MLX_FLOAT16},  {"float32", MLX_FLOAT32}, {"float64", MLX_FLOAT64},
             {"bfloat16", MLX_BFLOAT16}};
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (strcmp(map[i].name, dt->name) == 0) return map[i].t;
  return MLX_FLOAT32;
}

/* The raw bytes of an evaluated array, whatever its dtype. */
static const void* mlxd_bench_bytes(mlx_array a) {
  switch (mlx_array_itemsize(a)) {
    case 1: return mlx_array_data_uint8(a);
    case 2: return mlx_array_data_uint16(a);
    case 4: return mlx_array_data_uint32(a);
    case 8: return mlx_array_data_uint64(a);
    default: return NULL;
  }
}

typedef struct mlxd_bench_ctx {
  mlx_distributed_group g;
  mlx_stream s;
  int rank, n;
} mlxd_bench_ctx;

/* One op, evaluated. res receives the result (sendrecv: what came back / arrived). */
static int mlxd_bench_one(const mlxd_bench_ctx* c, mlxd_bench_op op, mlx_array x, mlx_array* res,
                          mlx_array* tmp) {
  int rc = 0;
  switch (op) {
    case MLXD_OP_ALL_SUM: rc = mlx_distributed_all_sum(res, x, c->g, c->s); break;
    case MLXD_OP_ALL_MAX: rc = mlx_distributed_all_max(res, x, c->g, c->s); break;
    case MLXD_OP_ALL_GATHER: rc = mlx_distributed_all_gather(res, x, c->g, c->s); break;
    case MLXD_OP_SUM_SCATTER: rc = mlx_distributed_sum_scatter(res, x, c->g, c->s); break;
    case MLXD_OP_ALL_TO_ALL: rc = mlx_distributed_all_to_all(res, x, c->g, c->s); break;
    case MLXD_OP_SENDRECV:
      /* ping-pong between ranks 0 and 1; rank 1 echoes what it received */
      if (c->rank == 0) {
        if (mlx_distributed_send(tmp, x, 1, c->g, c->s) || mlx_array_eval(*tmp)) return -1;
        rc = mlx_distributed_recv_like(res, x, 1, c->g, c->s);
      } else if (c->rank == 1) {
        if (mlx_distributed_recv_like(res, x, 0, c->g, c->s) || mlx_array_eval(*res)) return -1;
        rc = mlx_distributed_send(tmp, *res, 0, c->g, c->s);
        if (rc == 0) rc = mlx_array_eval(*tmp);
        return rc ? -1 : 0;
      } else {
        return 0;
      }
      break;
    default: return -1;
  }
  if (rc != 0) return -1;
  return mlx_array_eval(*res) ? -1 : 0;
}

/* One window of sendrecv_bw (as osu_bw): rank 0 queues nwin sends of x to
 * rank 1 back to back (each op is queued on the stream when it is called;
 * nothing waits until all are queued), waits for them, then receives rank
 * 1's one-element ack into *res; rank 1 queues nwin receives into win[],
 * waits for them, keeps the last in *res and sends the ack. Other ranks do
 * nothing. */
static int mlxd_bench_bw(const mlxd_bench_ctx* c, mlx_array x, mlx_array ack, mlx_array* win,
                         int nwin, mlx_array* res) {
  if (c->rank == 0) {
    for (int i = 0; i < nwin; i++)
      if (mlx_distributed_send(&win[i], x, 1, c->g, c->s)) return -1;
    for (int i = 0; i < nwin; i++)
      if (mlx_array_eval(win[i])) return -1;
    if (mlx_distributed_recv_like(res, ack, 1, c->g, c->s) || mlx_array_eval(*res)) return -1;
  } else if (c->rank == 1) {
    for (int i = 0; i < nwin; i++)
      if (mlx_distributed_recv_like(&win[i], x, 0, c->g, c->s)) return -1;
    for (int i = 0; i < nwin; i++)
      if (mlx_array_eval(win[i])) return -1;
    if (mlx_array_set(res, win[nwin - 1])) return -1;
    mlx_array sent = mlx_array_new();
    int rc = mlx_distributed_send(&sent, ack, 0, c->g, c->s);
    if (rc == 0) rc = mlx_array_eval(sent);
    mlx_array_free(sent);
    if (rc) return -1;
  }
  return 0;
}

/* The element-wise maximum over the ranks of v[0..n), through the library. */
static int mlxd_bench_all_max(const mlxd_bench_ctx* c, double* v, int n) {
  mlx_array la = mlx_array_new_data(v, &n, 1, MLX_FLOAT64), ga = mlx_array_new();
  int rc = -1;
  if (mlx_distributed_all_max(&ga, la, c->g, c->s) == 0 && mlx_array_eval(ga) == 0) {
    const double* g = mlx_array_data_float64(ga);
    if (g) {
      memcpy(v, g, (size_t)n * sizeof *v);
      rc = 0;
    }
  }
  mlx_array_free(la);
  mlx_array_free(ga);
  return rc;
}

/* One row being measured: op on input x; res keeps the last result (for
 * --check). The hooks of mlxd_bench_measure. */
typedef struct mlxd_bench_row {
  const mlxd_bench_ctx* c;
  mlxd_bench_op op;
  mlx_array x, res, tmp;
  mlx_array ack;  /* sendrecv_bw: the one-element ack */
  mlx_array* win; /* sendrecv_bw: the window's sends (rank 0) or receives (rank 1) */
  int nwin;
} mlxd_bench_row;

static int mlxd_row_op(void* p) {
  mlxd_bench_row* r = p;
  if (r->op == MLXD_OP_SENDRECV_BW)
    return mlxd_bench_bw(r->c, r->x, r->ack, r->win, r->nwin, &r->res);
  return mlxd_bench_one(r->c, r->op, r->x, &r->res, &r->tmp);
}

static int mlxd_row_all_max(void* p, double* v, int n) {
  return mlxd_bench_all_max(((mlxd_bench_row*)p)->c, v, n);
}

/* 0, or -1 when the window's handles cannot be allocated (said on stderr). */
static int mlxd_row_init(mlxd_bench_row* r, const mlxd_bench_ctx* c, mlxd_bench_op op,
                         const mlxd_bench_shape* sh, const void* host, mlx_dtype mdt) {
  int shape = (int)sh->in_count, one = 1;
  r->c = c;
  r->op = op;
  r->x = mlx_array_new_data(host, &shape, 1, mdt);
  r->res = mlx_array_new();
  r->tmp = mlx_array_new();
  r->ack = mlx_array_new_data(host, &one, 1, mdt);
  r->win = NULL;
  r->nwin = 0;
  if (op == MLXD_OP_SENDRECV_BW) {
    r->nwin = mlxd_bench_bw_window(sh->row_bytes);
    r->win = malloc((size_t)r->nwin * sizeof *r->win);
    if (!r->win) {
      fprintf(stderr, "[bench] rank %d: cannot allocate a window of %d arrays.\n", c->rank,
              r->nwin);
      r->nwin = 0;
      return -1;
    }
    for (int i = 0; i < r->nwin; i++) r->win[i] = mlx_array_new();
  }
  return 0;
}

static void mlxd_row_free(mlxd_bench_row* r) {
  mlx_array_free(r->x);
  mlx_array_free(r->res);
  mlx_array_free(r->tmp);
  mlx_array_free(r->ack);
  for (int i = 0; i < r->nwin; i++) mlx_array_free(r->win[i]);
  free(r->win);
}

/* The untimed pass before any timing: every selected op at every size once,
 * so that connection set-up, the first use of the streams, the library's
 * buffer cache and the page faults of every size (the largest included) are
 * not charged to the first rows. */
static int mlxd_bench_warm_all(const mlxd_bench_ctx* c, const mlxd_bench_opts* o, const void* host,
                               mlx_dtype mdt) {
  for (int opi = 0; opi < MLXD_OP_COUNT; opi++) {
    if (!o->ops[opi] || ((opi == MLXD_OP_SENDRECV || opi == MLXD_OP_SENDRECV_BW) && c->n < 2))
      continue;
    for (size_t bytes = o->min_bytes; bytes && bytes <= o->max_bytes;
         bytes = mlxd_bench_next_size(o, bytes)) {
      mlxd_bench_shape sh;
      if (!mlxd_bench_shape_for((mlxd_bench_op)opi, bytes, o->dtype->size, c->n, &sh)) continue;
      mlxd_bench_row row;
      int rc = mlxd_row_init(&row, c, (mlxd_bench_op)opi, &sh, host, mdt);
      if (rc == 0) rc = mlxd_row_op(&row);
      mlxd_row_free(&row);
      if (rc != 0) {
        fprintf(stderr, "[bench] rank %d: %s of %zu bytes failed in the warm-up pass.\n", c->rank,
                mlxd_bench_op_name((mlxd_bench_op)opi), sh.row_bytes);
        return -1;
      }
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  mlxd_bench_opts o;
  int prc = mlxd_bench_parse(argc, argv, &o, "mlxdist-bench");
  if (prc == 1) return 0;
  if (prc == 2) return 2;

  /* before the library starts its threads, so that theirs count too */
  if (o.account) mlxd_bench_acct_open();
  mlx_set_error_handler(mlxd_bench_on_error, NULL, NULL);
  mlxd_bench_ctx c;
  c.g = mlx_distributed_group_new();
  if (mlx_distributed_init(&c.g, true, o.backend) != 0) {
    fprintf(stderr, "[bench] cannot start the distributed backend '%s' (see the error above).\n",
            o.backend);
    return 1;
  }
  if (mlx_distributed_group_get_rank(&c.rank, c.g) || mlx_distributed_group_get_size(&c.n, c.g))
    return 1;
  mlxd_bench_rank = c.rank;
  c.s = mlx_stream_new();
  mlx_dtype mdt = mlxd_bench_mlx_dtype(o.dtype);
  size_t elt = o.dtype->size;

  char impl[96];
  snprintf(impl, sizeof impl, "mlxdist-%s", o.backend);
  if (c.rank == 0) mlxd_bench_print_title(&o, impl, c.n);
  if (c.rank == 0 && o.account) mlxd_bench_acct_report();

  void* host = NULL;
  size_t host_bytes = (o.max_bytes / elt + 1) * elt;
  if (posix_memalign(&host, 64, host_bytes) != 0) {
    fprintf(stderr, "[bench] rank %d: cannot allocate %zu bytes for the input.\n", c.rank,
            host_bytes);
    return 1;
  }
  memset(host, 0, host_bytes);
  if (o.bind && mlxd_bench_bind(c.rank) != 0) return 1;

  if (o.warmup > 0 && mlxd_bench_warm_all(&c, &o, host, mdt) != 0) return 1;

  bool any_fail = false;
  for (int opi = 0; opi < MLXD_OP_COUNT; opi++) {
    if (!o.ops[opi]) continue;
    mlxd_bench_op op = (mlxd_bench_op)opi;
    bool p2p = op == MLXD_OP_SENDRECV || op == MLXD_OP_SENDRECV_BW;
    if (p2p && c.n < 2) {
      if (c.rank == 0 && !o.csv)
        printf("#\n# op: %s needs at least 2 ranks; skipped\n", mlxd_bench_op_name(op));
      continue;
    }
    if (c.rank == 0) mlxd_bench_print_header(&o, op);
    for (size_t bytes = o.min_bytes; bytes && bytes <= o.max_bytes;
         bytes = mlxd_bench_next_size(&o, bytes)) {
      mlxd_bench_shape sh;
      if (!mlxd_bench_shape_for(op, bytes, elt, c.n, &sh)) continue;
      if (o.check) mlxd_bench_fill(o.dtype, host, sh.in_count, c.rank);
      mlxd_bench_row row;
      if (mlxd_row_init(&row, &c, op, &sh, host, mdt) != 0) return 1;
      mlxd_bench_hooks hooks = {&row, mlxd_row_op, mlxd_row_all_max};
      mlxd_bench_result r;
      if (mlxd_bench_measure(&o, &hooks, &r) != 0) {
        fprintf(stderr, "[bench] rank %d: %s of %zu bytes failed; stopping.\n", c.rank,
                mlxd_bench_op_name(op), sh.row_bytes);
        return 1;
      }
      /* per message: half a round trip, or a window's time over its messages */
      double per = op == MLXD_OP_SENDRECV ? 0.5 : op == MLXD_OP_SENDRECV_BW ? 1.0 / row.nwin : 1.0;
      r.time_s *= per;
      r.min_s *= per;
      r.max_s *= per;
      if (op == MLXD_OP_SENDRECV_BW) { /* sendrecv: per round trip, as before */
        r.cpu_s *= per;
        mlxd_bench_acct_scale(&r, per);
      }
      double fail = 0.0;
      /* sendrecv: ranks 0 and 1 hold the message; sendrecv_bw: rank 1 (rank 0 the ack) */
      if (o.check && (!p2p || c.rank == 1 || (op == MLXD_OP_SENDRECV && c.rank == 0))) {
        const void* data = mlxd_bench_bytes(row.res);
        size_t want = mlx_array_size(row.res);
        if (!data || want != sh.out_count ||
            mlxd_bench_verify(o.dtype, op, data, want, c.rank, c.n, 0) != 0)
          fail = 1.0;
      }
      mlxd_row_free(&row);
      if (o.check && mlxd_bench_all_max(&c, &fail, 1) != 0) {
        fprintf(stderr, "[bench] rank %d: the all_max of the check failed; stopping.\n", c.rank);
        return 1;
      }
      any_fail |= fail != 0.0;
      if (c.rank == 0)
        mlxd_bench_print_row(&o, op, c.n, &sh, &r, o.check ? (fail != 0.0 ? "FAIL" : "ok") : "-");
    }
  }
  free(host);
  mlx_stream_free(c.s);
  mlx_distributed_group_free(c.g);
  if (any_fail && c.rank == 0)
    fprintf(stderr, "[bench] some results were wrong (check column FAIL).\n");
  return any_fail ? 1 : 0;
}

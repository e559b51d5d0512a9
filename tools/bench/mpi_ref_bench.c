/* mpi_ref_bench: the mlxdist-bench measurements with raw MPI, as a reference.
 * Same options, sizes, measurement rule (bench_measure.c) and output
 * columns. Run it with mpirun, e.g.
 *   mpirun -np 2 --mca btl self,tcp mpi_ref_bench --op all --csv */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

static MPI_Datatype mlxd_ref_type(const mlxd_bench_dtype* dt) {
  if (strcmp(dt->name, "float32") == 0) return MPI_FLOAT;
  if (strcmp(dt->name, "float64") == 0) return MPI_DOUBLE;
  if (strcmp(dt->name, "int8") == 0) return MPI_INT8_T;
  if (strcmp(dt->name, "int16") == 0) return MPI_INT16_T;
  if (strcmp(dt->name, "int32") == 0) return MPI_INT32_T;
  if (strcmp(dt->name, "int64") == 0) return MPI_INT64_T;
  if (strcmp(dt->name, "uint8") == 0) return MPI_UINT8_T;
  if (strcmp(dt->name, "uint16") == 0) return MPI_UINT16_T;
  if (strcmp(dt->name, "uint32") == 0) return MPI_UINT32_T;
  if (strcmp(dt->name, "uint64") == 0) return MPI_UINT64_T;
  return MPI_DATATYPE_NULL;
}

static int mlxd_ref_one(mlxd_bench_op op, const void* in, void* out, const mlxd_bench_shape* sh,
                        MPI_Datatype t, int rank) {
  int cnt = (int)sh->in_count;
  switch (op) {
    case MLXD_OP_ALL_SUM: return MPI_Allreduce(in, out, cnt, t, MPI_SUM, MPI_COMM_WORLD);
    case MLXD_OP_ALL_MAX: return MPI_Allreduce(in, out, cnt, t, MPI_MAX, MPI_COMM_WORLD);
    case MLXD_OP_ALL_GATHER: return MPI_Allgather(in, cnt, t, out, cnt, t, MPI_COMM_WORLD);
    case MLXD_OP_SUM_SCATTER:
      return MPI_Reduce_scatter_block(in, out, (int)sh->out_count, t, MPI_SUM, MPI_COMM_WORLD);
    case MLXD_OP_ALL_TO_ALL: {
      /* the row's size is a rank's whole input, as in mlxdist-bench: n parts */
      int n = 1;
      MPI_Comm_size(MPI_COMM_WORLD, &n);
      int part = cnt / n;
      return MPI_Alltoall(in, part, t, out, part, t, MPI_COMM_WORLD);
    }
    case MLXD_OP_SENDRECV:
      if (rank == 0) {
        int rc = MPI_Send(in, cnt, t, 1, 7, MPI_COMM_WORLD);
        return rc ? rc : MPI_Recv(out, cnt, t, 1, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      }
      if (rank == 1) {
        int rc = MPI_Recv(out, cnt, t, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        return rc ? rc : MPI_Send(out, cnt, t, 0, 8, MPI_COMM_WORLD);
      }
      return MPI_SUCCESS;
    case MLXD_OP_SENDRECV_BW: {
      /* as osu_bw: a window of nonblocking sends into one receive buffer,
       * then a one-element ack from rank 1 (mlxdist-bench: the same window) */
      int nwin = mlxd_bench_bw_window(sh->row_bytes), rc = MPI_SUCCESS;
      MPI_Request req[MLXD_BENCH_BW_WINDOW];
      MPI_Status sts[MLXD_BENCH_BW_WINDOW]; /* not MPI_STATUSES_IGNORE: gcc 12 takes MPICH's
                                             * (MPI_Status*)1 for an empty array (stringop-overflow) */
      if (rank > 1) return MPI_SUCCESS;
      for (int i = 0; i < nwin && rc == MPI_SUCCESS; i++)
        rc = rank == 0 ? MPI_Isend(in, cnt, t, 1, 9, MPI_COMM_WORLD, &req[i])
                       : MPI_Irecv(out, cnt, t, 0, 9, MPI_COMM_WORLD, &req[i]);
      if (rc == MPI_SUCCESS) rc = MPI_Waitall(nwin, req, sts);
      if (rc != MPI_SUCCESS) return rc;
      if (rank == 0) return MPI_Recv(out, 1, t, 1, 10, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      return MPI_Send(in, 1, t, 0, 10, MPI_COMM_WORLD);
    }
    default: return MPI_ERR_OTHER;
  }
}

/* One row being measured: the hooks of mlxd_bench_measure. */
typedef struct mlxd_ref_row {
  mlxd_bench_op op;
  const void* in;
  void* out;
  const mlxd_bench_shape* sh;
  MPI_Datatype t;
  int rank;
} mlxd_ref_row;

static int mlxd_ref_row_op(void* p) {
  const mlxd_ref_row* r = p;
  return mlxd_ref_one(r->op, r->in, r->out, r->sh, r->t, r->rank) == MPI_SUCCESS ? 0 : -1;
}

static int mlxd_ref_all_max(void* p, double* v, int n) {
  (void)p;
  return MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD) == MPI_SUCCESS ? 0
                                                                                               : -1;
}

/* The untimed pass before any timing, as in mlxdist-bench: every selected op
 * at every size once, so that connection set-up, Open MPI's first use of its
 * shared-memory segments and the page faults of every size (the largest
 * included) are not charged to the first rows. */
static void mlxd_ref_warm_all(const mlxd_bench_opts* o, const void* in, void* out, MPI_Datatype t,
                              int rank, int n) {
  for (int opi = 0; opi < MLXD_OP_COUNT; opi++) {
    if (!o->ops[opi] || ((opi == MLXD_OP_SENDRECV || opi == MLXD_OP_SENDRECV_BW) && n < 2))
      continue;
    for (size_t bytes = o->min_bytes; bytes && bytes <= o->max_bytes;
         bytes = mlxd_bench_next_size(o, bytes)) {
      mlxd_bench_shape sh;
      if (!mlxd_bench_shape_for((mlxd_bench_op)opi, bytes, o->dtype->size, n, &sh) ||
          sh.in_count > (size_t)0x7fffffff)
        continue;
      if (mlxd_ref_one((mlxd_bench_op)opi, in, out, &sh, t, rank) != MPI_SUCCESS) {
        fprintf(stderr, "[bench] rank %d: MPI %s failed in the warm-up.\n", rank,
                mlxd_bench_op_name((mlxd_bench_op)opi));
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char** argv) {
  /* parsed before MPI_Init (which leaves argv as it is in Open MPI and
   * MPICH) so that --account's counters are open before MPI starts its
   * threads and count them too */
  mlxd_bench_opts o;
  int prc = mlxd_bench_parse(argc, argv, &o, "mpi_ref_bench");
  if (prc == 0 && o.account) mlxd_bench_acct_open();
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (prc != 0) {
    MPI_Finalize();
    return prc == 1 ? 0 : 2;
  }
  MPI_Datatype t = mlxd_ref_type(o.dtype);
  if (t == MPI_DATATYPE_NULL) {
    if (rank == 0)
      fprintf(stderr,
              "[bench] mpi_ref_bench does not support --dtype %s (MPI has no such "
              "reduction type); use an integer type, float32 or float64.\n",
              o.dtype->name);
    MPI_Finalize();
    return 2;
  }
  size_t elt = o.dtype->size;
  if (rank == 0) mlxd_bench_print_title(&o, "MPI", n);
  if (rank == 0 && o.account) mlxd_bench_acct_report();

  size_t buf_bytes = (o.max_bytes / elt + 1) * elt;
  void *in = NULL, *out = NULL;
  if (posix_memalign(&in, 64, buf_bytes) || posix_memalign(&out, 64, buf_bytes)) {
    fprintf(stderr, "[bench] rank %d: cannot allocate 2 x %zu bytes.\n", rank, buf_bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  memset(in, 0, buf_bytes);
  memset(out, 0, buf_bytes);
  if (o.bind && mlxd_bench_bind(rank) != 0) MPI_Abort(MPI_COMM_WORLD, 1);
  if (o.warmup > 0) mlxd_ref_warm_all(&o, in, out, t, rank, n);
  int any_fail = 0;
  for (int opi = 0; opi < MLXD_OP_COUNT; opi++) {
    if (!o.ops[opi]) continue;
    mlxd_bench_op op = (mlxd_bench_op)opi;
    bool p2p = op == MLXD_OP_SENDRECV || op == MLXD_OP_SENDRECV_BW;
    if (p2p && n < 2) {
      if (rank == 0 && !o.csv)
        printf("#\n# op: %s needs at least 2 ranks; skipped\n", mlxd_bench_op_name(op));
      continue;
    }
    if (rank == 0) mlxd_bench_print_header(&o, op);
    for (size_t bytes = o.min_bytes; bytes && bytes <= o.max_bytes;
         bytes = mlxd_bench_next_size(&o, bytes)) {
      mlxd_bench_shape sh;
      if (!mlxd_bench_shape_for(op, bytes, elt, n, &sh) || sh.in_count > (size_t)0x7fffffff)
        continue;
      if (o.check) {
        mlxd_bench_fill(o.dtype, in, sh.in_count, rank);
        memset(out, 0, sh.out_count * elt);
      }
      mlxd_ref_row row = {op, in, out, &sh, t, rank};
      mlxd_bench_hooks hooks = {&row, mlxd_ref_row_op, mlxd_ref_all_max};
      mlxd_bench_result r;
      if (mlxd_bench_measure(&o, &hooks, &r) != 0) {
        fprintf(stderr, "[bench] rank %d: MPI %s failed.\n", rank, mlxd_bench_op_name(op));
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      /* per message, as mlxdist-bench */
      double per = op == MLXD_OP_SENDRECV      ? 0.5
                   : op == MLXD_OP_SENDRECV_BW ? 1.0 / mlxd_bench_bw_window(sh.row_bytes)
                                               : 1.0;
      r.time_s *= per;
      r.min_s *= per;
      r.max_s *= per;
      if (op == MLXD_OP_SENDRECV_BW) {
        r.cpu_s *= per;
        mlxd_bench_acct_scale(&r, per);
      }
      double fail = 0.0;
      if (o.check && (!p2p || rank == 1 || (op == MLXD_OP_SENDRECV && rank == 0)) &&
          mlxd_bench_verify(o.dtype, op, out, sh.out_count, rank, n, 0) != 0)
        fail = 1.0;
      if (o.check) mlxd_ref_all_max(NULL, &fail, 1);
      any_fail |= fail != 0.0;
      if (rank == 0)
        mlxd_bench_print_row(&o, op, n, &sh, &r, o.check ? (fail != 0.0 ? "FAIL" : "ok") : "-");
    }
  }
  free(in);
  free(out);
  MPI_Finalize();
  return any_fail ? 1 : 0;
}

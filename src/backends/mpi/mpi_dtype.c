/* The mpi plugin's datatypes and reductions: mlx dtypes as MPI datatypes,
 * and the user-defined MPI ops that call the core's reduction kernels (so
 * results match the ring backend bit for bit). */
#include <stdbool.h>

#include "backends/mpi/mpi_internal.h"
#include "util/clock.h"

static MPI_Op g_uops[3][14]; /* user-defined ops (host->reduce), by [op][dtype] */

MPI_Datatype mlxd_mpi_dtype(mpip_dtype d) {
  switch (d) {
    case MPIP_BOOL: return MPI_UINT8_T;
    case MPIP_UINT8: return MPI_UINT8_T;
    case MPIP_UINT16: return MPI_UINT16_T;
    case MPIP_UINT32: return MPI_UINT32_T;
    case MPIP_UINT64: return MPI_UINT64_T;
    case MPIP_INT8: return MPI_INT8_T;
    case MPIP_INT16: return MPI_INT16_T;
    case MPIP_INT32: return MPI_INT32_T;
    case MPIP_INT64: return MPI_INT64_T;
    case MPIP_FLOAT16: return MPI_UINT16_T;
    case MPIP_FLOAT32: return MPI_FLOAT;
    case MPIP_FLOAT64: return MPI_DOUBLE;
    case MPIP_BFLOAT16: return MPI_UINT16_T;
    case MPIP_COMPLEX64: return MPI_C_FLOAT_COMPLEX;
  }
  return MPI_DATATYPE_NULL;
}

/* Only float32/float64 sums use MPI's own MPI_SUM (an IEEE add is an IEEE
 * add everywhere). Every other (dtype, op) is a user-defined op calling the
 * core's kernel, so results equal the ring backend's bit for bit. Native
 * integer ops are not used on purpose: Open MPI 4.1's AVX op component
 * saturates 8/16-bit sums instead of wrapping (open-mpi/ompi#8045) and
 * 4.1.2-4.1.4 get unsigned MPI_MIN wrong (open-mpi/ompi#10525); native
 * float max/min may treat NaN differently from the core's kernels. */
static bool op_native(mpip_dtype d, mpip_op op) {
  return op == MPIP_SUM && (d == MPIP_FLOAT32 || d == MPIP_FLOAT64);
}

/* MPI's user function computes inout = in OP inout; every op here is commutative. */
#define MPI_UOP(DT, OPV, SUFFIX)                                                      \
  static void uop_##DT##_##SUFFIX(void* in, void* inout, int* len, MPI_Datatype* t) { \
    (void)t;                                                                          \
    if (*len > 0) mlxd_mpi_host.reduce(OPV, DT, inout, in, (size_t)*len);             \
  }
#define MPI_UOPS(DT) \
  MPI_UOP(DT, MPIP_SUM, sum) MPI_UOP(DT, MPIP_MAX, max) MPI_UOP(DT, MPIP_MIN, min)
MPI_UOPS(MPIP_BOOL)
MPI_UOPS(MPIP_UINT8)
MPI_UOPS(MPIP_UINT16)
MPI_UOPS(MPIP_UINT32)
MPI_UOPS(MPIP_UINT64)
MPI_UOPS(MPIP_INT8)
MPI_UOPS(MPIP_INT16)
MPI_UOPS(MPIP_INT32)
MPI_UOPS(MPIP_INT64)
MPI_UOPS(MPIP_FLOAT16)
MPI_UOPS(MPIP_FLOAT32)
MPI_UOPS(MPIP_FLOAT64)
MPI_UOPS(MPIP_BFLOAT16)
MPI_UOPS(MPIP_COMPLEX64)
#define MPI_UOP_ROW(DT)                                    \
  {                                                        \
    DT, { uop_##DT##_sum, uop_##DT##_max, uop_##DT##_min } \
  }

/* Create the user-defined ops (after MPI is initialised; g_mu held). */
int mlxd_mpi_create_user_ops(mlxd_status* st) {
  static const struct {
    mpip_dtype d;
    MPI_User_function* f[3];
  } tab[] = {
      MPI_UOP_ROW(MPIP_BOOL),     MPI_UOP_ROW(MPIP_UINT8),     MPI_UOP_ROW(MPIP_UINT16),
      MPI_UOP_ROW(MPIP_UINT32),   MPI_UOP_ROW(MPIP_UINT64),    MPI_UOP_ROW(MPIP_INT8),
      MPI_UOP_ROW(MPIP_INT16),    MPI_UOP_ROW(MPIP_INT32),     MPI_UOP_ROW(MPIP_INT64),
      MPI_UOP_ROW(MPIP_FLOAT16),  MPI_UOP_ROW(MPIP_FLOAT32),   MPI_UOP_ROW(MPIP_FLOAT64),
      MPI_UOP_ROW(MPIP_BFLOAT16), MPI_UOP_ROW(MPIP_COMPLEX64),
  };
  for (int o = 0; o < 3; o++)
    for (int d = 0; d < 14; d++) g_uops[o][d] = MPI_OP_NULL;
  for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
    for (int o = 0; o < 3; o++) {
      if (op_native(tab[i].d, (mpip_op)o)) continue;
      int rc = MPI_Op_create(tab[i].f[o], 1, &g_uops[o][tab[i].d]);
      if (rc != MPI_SUCCESS)
        return mlxd_mpi_fail_call(st, MPIP_EUNAVAIL, rc, "MPI_Op_create", NULL);
    }
  return 0;
}
void mlxd_mpi_free_user_ops(void) {
  for (int o = 0; o < 3; o++)
    for (int d = 0; d < 14; d++)
      if (g_uops[o][d] != MPI_OP_NULL) {
        MPI_Op_free(&g_uops[o][d]);
        g_uops[o][d] = MPI_OP_NULL;
      }
}

MPI_Op mlxd_mpi_op(mpip_dtype d, mpip_op op) {
  if ((int)op < 0 || (int)op > 2 || (int)d < 0 || (int)d > 13) return MPI_OP_NULL;
  return op_native(d, op) ? MPI_SUM : g_uops[op][d];
}

const char* mlxd_mpi_reduce_name(mpip_op op) {
  return op == MPIP_SUM   ? "all_sum"
         : op == MPIP_MAX ? "all_max"
         : op == MPIP_MIN ? "all_min"
                          : "all_reduce";
}
const char* mlxd_mpi_scatter_name(mpip_op op) {
  return op == MPIP_SUM ? "sum_scatter" : op == MPIP_MAX ? "max_scatter" : "min_scatter";
}

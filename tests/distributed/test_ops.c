/* The eight distributed ops on a size-one group (no launcher): results equal
 * the input for every dtype and several shapes, send/recv are errors, and
 * every argument error is reported with a clear message and queues nothing. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mlx/c/mlx.h"
#include "testutil.h"

typedef int (*coll_fn)(mlx_array*, const mlx_array, const mlx_distributed_group, const mlx_stream);
static const struct {
  const char* name;
  coll_fn fn;
} k_colls[] = {
    {"all_sum", mlx_distributed_all_sum},         {"all_max", mlx_distributed_all_max},
    {"all_min", mlx_distributed_all_min},         {"all_gather", mlx_distributed_all_gather},
    {"sum_scatter", mlx_distributed_sum_scatter},
};
#define N_COLLS 5

static const mlx_dtype k_dtypes[] = {MLX_BOOL,     MLX_UINT8,    MLX_UINT16,  MLX_UINT32,
                                     MLX_UINT64,   MLX_INT8,     MLX_INT16,   MLX_INT32,
                                     MLX_INT64,    MLX_FLOAT16,  MLX_FLOAT32, MLX_FLOAT64,
                                     MLX_BFLOAT16, MLX_COMPLEX64};
#define N_DTYPES 14

static void clear_env(void) {
  const char* vars[] = {"MLX_RANK", "MLX_HOSTFILE", "MLX_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE",
                        "PMI_SIZE", "PMIX_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

/* The bytes of an evaluated array, read through the accessor of its item size. */
static const void* raw(mlx_array a) {
  switch (mlx_array_itemsize(a)) {
    case 1: return mlx_array_data_uint8(a);
    case 2: return mlx_array_data_uint16(a);
    case 4: return mlx_array_data_uint32(a);
    case 8: return mlx_array_data_uint64(a);
    default: T_FAIL("unexpected item size %zu", mlx_array_itemsize(a));
  }
  return NULL;
}

/* Deterministic bytes that are valid values of the dtype (bool: 0/1). */
static void fill(unsigned char* buf, size_t nbytes, mlx_dtype dt, unsigned seed) {
  for (size_t i = 0; i < nbytes; i++) {
    unsigned v = (unsigned)(i * 131u + seed * 7u + 3u);
    buf[i] = dt == MLX_BOOL ? (unsigned char)(v % 2) : (unsigned char)(v % 251);
  }
}

static void expect_same(mlx_array res, const void* data, const int* shape, int ndim, mlx_dtype dt) {
  T_EQ_INT(mlx_array_eval(res), 0);
  T_EQ_INT(mlx_array_dtype(res), dt);
  T_EQ_INT(mlx_array_ndim(res), ndim);
  size_t n = 1;
  for (int i = 0; i < ndim; i++) {
    T_EQ_INT(mlx_array_shape(res)[i], shape[i]);
    n *= (size_t)shape[i];
  }
  T_EQ_INT(mlx_array_size(res), n);
  size_t nbytes = n * mlx_dtype_size(dt);
  T_EQ_INT(mlx_array_nbytes(res), nbytes);
  if (nbytes) T_ASSERT(memcmp(raw(res), data, nbytes) == 0);
}

static void test_identity(mlx_distributed_group g, mlx_stream s) {
  static const int shapes[][4] = {{0}, {0}, {5}, {3, 0}, {2, 3}, {4, 1, 2}, {1, 1, 1, 7}};
  static const int ndims[] = {0, 1, 1, 2, 2, 3, 4};
  for (int d = 0; d < N_DTYPES; d++) {
    for (int k = 0; k < 7; k++) {
      mlx_dtype dt = k_dtypes[d];
      size_t n = 1;
      for (int i = 0; i < ndims[k]; i++) n *= (size_t)shapes[k][i];
      size_t nbytes = n * mlx_dtype_size(dt);
      unsigned char* buf = malloc(nbytes + 1);
      fill(buf, nbytes, dt, (unsigned)(d * 10 + k));
      mlx_array x = mlx_array_new_data(buf, shapes[k], ndims[k], dt);
      T_ASSERT(x.ctx != NULL);
      for (int c = 0; c < N_COLLS; c++) {
        if (c == 4 && ndims[k] == 0) continue; /* sum_scatter needs an axis */
        mlx_array res = mlx_array_new();
        if (k_colls[c].fn(&res, x, g, s) != 0)
          T_FAIL("%s failed: %s", k_colls[c].name, t_last_error());
        expect_same(res, buf, shapes[k], ndims[k], dt);
        mlx_array_free(res);
      }
      mlx_array_free(x);
      free(buf);
    }
  }
  T_EXPECT_NO_ERROR();
}

/* The result stays valid after x is freed, and x may be its own result. */
static void test_lifetimes(mlx_distributed_group g) {
  int32_t v[6] = {1, -2, 3, -4, 5, -6};
  int shape[2] = {3, 2};
  mlx_array x = mlx_array_new_data(v, shape, 2, MLX_INT32);
  mlx_array res = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_sum(&res, x, g, mlx_stream_new()), 0);
  mlx_array_free(x);
  expect_same(res, v, shape, 2, MLX_INT32);
  /* res = op(res) */
  T_EQ_INT(mlx_distributed_all_max(&res, res, g, mlx_stream_new()), 0);
  expect_same(res, v, shape, 2, MLX_INT32);
  mlx_array_free(res);
  T_EXPECT_NO_ERROR();
}

/* *res that holds an array: replaced, and the old one released (its dtor runs). */
static int dtor_calls;
static void count_dtor(void* p) {
  (void)p;
  dtor_calls++;
}

static void test_res_replaced(mlx_distributed_group g) {
  static float held[3] = {1, 2, 3};
  int shape[1] = {3};
  mlx_array res = mlx_array_new_data_managed_payload(held, shape, 1, MLX_FLOAT32, NULL, count_dtor);
  float v = 2.5f;
  mlx_array x = mlx_array_new_float32(v);
  dtor_calls = 0;
  T_EQ_INT(mlx_distributed_all_min(&res, x, g, mlx_stream_new()), 0);
  T_EQ_INT(dtor_calls, 1);
  float got = 0;
  T_EQ_INT(mlx_array_item_float32(&got, res), 0);
  T_ASSERT(got == v);
  mlx_array_free(res);
  mlx_array_free(x);
  T_EXPECT_NO_ERROR();
}

static void test_streams(mlx_distributed_group g) {
  /* the default CPU stream and a new CPU stream, explicitly */
  mlx_stream cpu = mlx_default_cpu_stream_new();
  T_ASSERT(cpu.ctx != NULL);
  test_identity(g, cpu);
  mlx_device dev = mlx_device_new_type(MLX_CPU, 0);
  mlx_stream own = mlx_stream_new_device(dev);
  T_ASSERT(own.ctx != NULL);
  test_identity(g, own);
  T_EQ_INT(mlx_synchronize(own), 0);
  mlx_stream_free(own);
  mlx_stream_free(cpu);
  mlx_device_free(dev);

  /* A GPU stream cannot even be made here (no GPU backend), so the op's
   * "stream on the wrong device" check cannot be reached in this process. */
  mlx_stream gpu = mlx_default_gpu_stream_new();
  T_ASSERT(gpu.ctx == NULL);
  T_EXPECT_ERROR("GPU");
  T_EXPECT_NO_ERROR();
}

static void test_errors(mlx_distributed_group g) {
  mlx_stream s = mlx_stream_new();
  int32_t v[4] = {1, 2, 3, 4};
  int shape[1] = {4};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_INT32);
  mlx_array empty = mlx_array_new();
  mlx_array res = mlx_array_new();

  for (int c = 0; c < N_COLLS; c++) {
    T_ASSERT(k_colls[c].fn(NULL, x, g, s) != 0);
    T_EXPECT_ERROR("[distributed]", k_colls[c].name, "res is NULL");
    T_ASSERT(k_colls[c].fn(&res, empty, g, s) != 0);
    T_EXPECT_ERROR("[distributed]", k_colls[c].name, "x is an empty array handle");
    T_ASSERT(res.ctx == NULL);
  }
  mlx_array scalar = mlx_array_new_int(3);
  T_ASSERT(mlx_distributed_sum_scatter(&res, scalar, g, s) != 0);
  T_EXPECT_ERROR("[distributed] sum_scatter", "0-dimensional");
  T_ASSERT(res.ctx == NULL);

  /* send */
  T_ASSERT(mlx_distributed_send(NULL, x, 0, g, s) != 0);
  T_EXPECT_ERROR("[distributed] send: res is NULL");
  T_ASSERT(mlx_distributed_send(&res, empty, 0, g, s) != 0);
  T_EXPECT_ERROR("[distributed] send: x is an empty array handle");
  const int peers[] = {0, 1, -1, 5};
  for (int i = 0; i < 4; i++) {
    T_ASSERT(mlx_distributed_send(&res, x, peers[i], g, s) != 0);
    T_EXPECT_ERROR("[distributed] send", "at least two processes");
    T_ASSERT(mlx_distributed_recv(&res, shape, 1, MLX_INT32, peers[i], g, s) != 0);
    T_EXPECT_ERROR("[distributed] recv", "at least two processes");
    T_ASSERT(mlx_distributed_recv_like(&res, x, peers[i], g, s) != 0);
    T_EXPECT_ERROR("[distributed] recv_like", "at least two processes");
  }
  /* with the default group too */
  T_ASSERT(mlx_distributed_send(&res, x, 1, mlx_distributed_group_new(), s) != 0);
  T_EXPECT_ERROR("at least two processes");

  /* recv arguments, checked before anything else */
  T_ASSERT(mlx_distributed_recv(NULL, shape, 1, MLX_INT32, 1, g, s) != 0);
  T_EXPECT_ERROR("[distributed] recv: res is NULL");
  T_ASSERT(mlx_distributed_recv(&res, NULL, 2, MLX_INT32, 1, g, s) != 0);
  T_EXPECT_ERROR("[distributed] recv: shape is NULL but shape_num is 2");
  int neg[3] = {2, -3, 4};
  T_ASSERT(mlx_distributed_recv(&res, neg, 3, MLX_INT32, 1, g, s) != 0);
  T_EXPECT_ERROR("[distributed] recv: shape[1] is -3");
  T_ASSERT(mlx_distributed_recv(&res, shape, 1, (mlx_dtype)99, 1, g, s) != 0);
  T_EXPECT_ERROR("[distributed] recv: dtype 99 is not a valid mlx_dtype");
  T_ASSERT(mlx_distributed_recv(&res, shape, 1, (mlx_dtype)-1, 1, g, s) != 0);
  T_EXPECT_ERROR("[distributed] recv: dtype -1");
  static int many[5000];
  T_ASSERT(mlx_distributed_recv(&res, many, 5000, MLX_INT32, 1, g, s) != 0);
  T_EXPECT_ERROR("[distributed] recv: shape_num is 5000");
  int huge[4] = {1 << 30, 1 << 30, 1 << 30, 1 << 30};
  T_ASSERT(mlx_distributed_recv(&res, huge, 4, MLX_INT32, 1, g, s) != 0);
  T_EXPECT_ERROR("[distributed] recv", "more elements than fit");
  T_ASSERT(mlx_distributed_recv_like(NULL, x, 1, g, s) != 0);
  T_EXPECT_ERROR("[distributed] recv_like: res is NULL");
  T_ASSERT(mlx_distributed_recv_like(&res, empty, 1, g, s) != 0);
  T_EXPECT_ERROR("[distributed] recv_like: x is an empty array handle");
  T_ASSERT(res.ctx == NULL);

  mlx_array_free(scalar);
  mlx_array_free(x);
}

int main(void) {
  clear_env();
  t_capture_errors();

  mlx_distributed_group g = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init(&g, false, NULL), 0);
  T_EQ_INT(mlx_distributed_group_size(g), 1);

  test_identity(g, mlx_stream_new());
  /* the empty group: the default group (a size-one group here) */
  test_identity(mlx_distributed_group_new(), mlx_stream_new());
  test_lifetimes(g);
  test_lifetimes(mlx_distributed_group_new());
  test_res_replaced(g);
  test_streams(g);
  test_errors(g);
  test_errors(mlx_distributed_group_new());

  mlx_distributed_group_free(g);
  printf("test_dist_ops: ok\n");
  return 0;
}

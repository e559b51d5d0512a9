/* A C99 program written against the installed mlxdist headers only. It calls
 * every function of the API contract with mlx-c's signatures and checks what
 * they return in a single process (the size-one group). Compiled by
 * check_install.sh with -std=c99 -pedantic -Wall -Wextra -Werror through
 * pkg-config, and run under valgrind. */
#include <mlx/c/mlx.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int n_errors;
static char last_error[1024];
static int handler_dtor_calls;

static void on_error(const char* msg, void* data) {
  (void)data;
  n_errors++;
  strncpy(last_error, msg, sizeof last_error - 1);
}
static void on_handler_dtor(void* data) {
  (void)data;
  handler_dtor_calls++;
}

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "consumer.c:%d: check failed: %s\n", __LINE__, #cond); \
      exit(1);                                                               \
    }                                                                        \
  } while (0)
#define EXPECT_ERROR(call)          \
  do {                              \
    int before_ = n_errors;         \
    (void)(call);                   \
    CHECK(n_errors == before_ + 1); \
  } while (0)

static int gather_calls;
static int dtor_calls;
static int my_all_gather(void* dst, const void* src, size_t n, int rank, int size, void* payload) {
  (void)payload;
  gather_calls++;
  if (rank != 0 || size != 1) return 1;
  memcpy(dst, src, n);
  return 0;
}
static void my_dtor(void* payload) {
  (void)payload;
  dtor_calls++;
}
static int managed_frees;
static void free_managed(void* p) {
  managed_frees++;
  free(p);
}

int main(void) {
  mlx_set_error_handler(on_error, NULL, on_handler_dtor);

  /* version, strings */
  mlx_string s = mlx_string_new();
  CHECK(mlx_version(&s) == 0);
  CHECK(strcmp(mlx_string_data(s), MLXDIST_VERSION_STRING) == 0);
  mlx_string s2 = mlx_string_new_data("hello");
  CHECK(mlx_string_set(&s, s2) == 0);
  CHECK(strcmp(mlx_string_data(s), "hello") == 0);
  mlx_string_free(s2);

  /* dtypes */
  CHECK(mlx_dtype_size(MLX_BOOL) == 1 && mlx_dtype_size(MLX_COMPLEX64) == 8);
  CHECK(mlx_dtype_size(MLX_BFLOAT16) == 2 && mlx_dtype_size(MLX_INT64) == 8);

  /* devices */
  mlx_device dev = mlx_device_new_type(MLX_CPU, 0);
  mlx_device dflt = mlx_device_new();
  CHECK(mlx_get_default_device(&dflt) == 0);
  CHECK(mlx_device_equal(dev, dflt));
  mlx_device_type dt;
  int idx = -1, count = -1;
  CHECK(mlx_device_get_type(&dt, dev) == 0 && dt == MLX_CPU);
  CHECK(mlx_device_get_index(&idx, dev) == 0 && idx == 0);
  CHECK(mlx_device_count(&count, MLX_CPU) == 0 && count >= 1);
  bool avail = false;
  CHECK(mlx_device_is_available(&avail, dev) == 0 && avail);
  CHECK(mlx_device_tostring(&s, dev) == 0 && strstr(mlx_string_data(s), "cpu"));
  CHECK(mlx_set_default_device(dev) == 0);
  mlx_device dcopy = mlx_device_new();
  CHECK(mlx_device_set(&dcopy, dev) == 0 && mlx_device_equal(dcopy, dev));

  /* streams */
  mlx_stream cpu = mlx_default_cpu_stream_new();
  mlx_stream mine = mlx_stream_new_device(dev);
  mlx_stream null_stream = mlx_stream_new();
  mlx_stream ds = mlx_stream_new();
  CHECK(mlx_get_default_stream(&ds, dev) == 0 && mlx_stream_equal(ds, cpu));
  CHECK(!mlx_stream_equal(mine, cpu));
  CHECK(mlx_stream_tostring(&s, mine) == 0 && strstr(mlx_string_data(s), "Stream"));
  CHECK(mlx_stream_get_index(&idx, cpu) == 0);
  mlx_device sdev = mlx_device_new();
  CHECK(mlx_stream_get_device(&sdev, mine) == 0 && mlx_device_equal(sdev, dev));
  CHECK(mlx_set_default_stream(cpu) == 0);
  mlx_stream scopy = mlx_stream_new();
  CHECK(mlx_stream_set(&scopy, mine) == 0 && mlx_stream_equal(scopy, mine));
  CHECK(mlx_synchronize(mine) == 0);
  {
    mlx_stream gpu = mlx_default_gpu_stream_new();
    bool gpu_ok = gpu.ctx != NULL;
    int gpus = 0;
    CHECK(mlx_device_count(&gpus, MLX_GPU) == 0);
    CHECK(gpu_ok == (gpus > 0));
    if (!gpu_ok) n_errors--; /* the expected "no GPU" error */
    mlx_stream_free(gpu);
  }

  /* arrays */
  int shape[2] = {2, 3};
  float fdata[6] = {1, 2, 3, 4, 5, 6};
  mlx_array a = mlx_array_new_data(fdata, shape, 2, MLX_FLOAT32);
  CHECK(mlx_array_ndim(a) == 2 && mlx_array_size(a) == 6 && mlx_array_nbytes(a) == 24);
  CHECK(mlx_array_itemsize(a) == 4 && mlx_array_dtype(a) == MLX_FLOAT32);
  CHECK(mlx_array_shape(a)[1] == 3 && mlx_array_strides(a)[0] == 3 && mlx_array_dim(a, -1) == 3);
  CHECK(mlx_array_eval(a) == 0 && mlx_array_data_float32(a)[5] == 6.0f);
  CHECK(mlx_array_tostring(&s, a) == 0 && strstr(mlx_string_data(s), "float32"));
  float* owned = malloc(4 * sizeof *owned);
  owned[0] = 7;
  int one = 1;
  mlx_array m = mlx_array_new_data_managed(owned, &one, 1, MLX_FLOAT32, free_managed);
  float* owned2 = malloc(sizeof *owned2);
  *owned2 = 8;
  mlx_array mp =
      mlx_array_new_data_managed_payload(owned2, &one, 1, MLX_FLOAT32, owned2, free_managed);
  float fv = 0;
  CHECK(mlx_array_item_float32(&fv, m) == 0 && fv == 7.0f);
  CHECK(mlx_array_item_float32(&fv, mp) == 0 && fv == 8.0f);
  mlx_array sc = mlx_array_new();
  bool bv;
  uint8_t u8;
  uint16_t u16;
  uint32_t u32;
  uint64_t u64;
  int8_t i8;
  int16_t i16;
  int32_t i32;
  int64_t i64;
  double dv;
  mlx_complex64_t cv;
  CHECK(mlx_array_set_bool(&sc, true) == 0 && mlx_array_item_bool(&bv, sc) == 0 && bv);
  CHECK(*mlx_array_data_bool(sc));
  CHECK(mlx_array_set_int(&sc, -3) == 0 && mlx_array_item_int32(&i32, sc) == 0 && i32 == -3);
  CHECK(*mlx_array_data_int32(sc) == -3);
  CHECK(mlx_array_set_float32(&sc, 1.5f) == 0 && mlx_array_item_float32(&fv, sc) == 0);
  CHECK(mlx_array_set_float(&sc, 2.5f) == 0 && *mlx_array_data_float32(sc) == 2.5f);
  CHECK(mlx_array_set_float64(&sc, 0.25) == 0 && mlx_array_item_float64(&dv, sc) == 0);
  CHECK(mlx_array_set_double(&sc, 0.5) == 0 && *mlx_array_data_float64(sc) == 0.5);
  CHECK(mlx_array_set_complex(&sc, 1, 2) == 0 && mlx_array_item_complex64(&cv, sc) == 0);
  CHECK(mlx_array_data_complex64(sc) != NULL);
  {
    mlx_array b = mlx_array_new_bool(false), i = mlx_array_new_int(4), f = mlx_array_new_float32(1),
              f2 = mlx_array_new_float(2), d = mlx_array_new_float64(3),
              d2 = mlx_array_new_double(4), c = mlx_array_new_complex(1, -1);
    CHECK(mlx_array_ndim(b) == 0 && mlx_array_dtype(i) == MLX_INT32);
    CHECK(mlx_array_dtype(c) == MLX_COMPLEX64 && mlx_array_dtype(d2) == MLX_FLOAT64);
    mlx_array_free(b), mlx_array_free(i), mlx_array_free(f), mlx_array_free(f2);
    mlx_array_free(d), mlx_array_free(d2), mlx_array_free(c);
  }
  {
    uint8_t raw[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int n1 = 1, n2 = 2, n4 = 4, n8 = 8;
    CHECK(mlx_array_set_data(&sc, raw, &n1, 1, MLX_UINT8) == 0);
    CHECK(mlx_array_item_uint8(&u8, sc) == 0 && u8 == 1 && mlx_array_data_uint8(sc)[0] == 1);
    CHECK(mlx_array_set_data(&sc, raw, &n1, 1, MLX_INT8) == 0);
    CHECK(mlx_array_item_int8(&i8, sc) == 0 && mlx_array_data_int8(sc)[0] == 1);
    CHECK(mlx_array_set_data(&sc, raw, &n1, 1, MLX_UINT16) == 0);
    CHECK(mlx_array_item_uint16(&u16, sc) == 0 && mlx_array_data_uint16(sc) != NULL);
    CHECK(mlx_array_set_data(&sc, raw, &n1, 1, MLX_INT16) == 0);
    CHECK(mlx_array_item_int16(&i16, sc) == 0 && mlx_array_data_int16(sc) != NULL);
    CHECK(mlx_array_set_data(&sc, raw, &n1, 1, MLX_UINT32) == 0);
    CHECK(mlx_array_item_uint32(&u32, sc) == 0 && mlx_array_data_uint32(sc) != NULL);
    CHECK(mlx_array_set_data(&sc, raw, &n1, 1, MLX_UINT64) == 0);
    CHECK(mlx_array_item_uint64(&u64, sc) == 0 && mlx_array_data_uint64(sc) != NULL);
    CHECK(mlx_array_set_data(&sc, raw, &n1, 1, MLX_INT64) == 0);
    CHECK(mlx_array_item_int64(&i64, sc) == 0 && mlx_array_data_int64(sc) != NULL);
    CHECK(mlx_array_set_data(&sc, raw, &n4, 1, MLX_FLOAT16) == 0 && mlx_array_size(sc) == 4);
#ifdef HAS_FLOAT16
    CHECK(mlx_array_data_float16(sc) != NULL);
    {
      float16_t h;
      EXPECT_ERROR(mlx_array_item_float16(&h, sc)); /* four elements, not one */
    }
#endif
    CHECK(mlx_array_set_data(&sc, raw, &n2, 1, MLX_BFLOAT16) == 0);
    CHECK(mlx_array_data_uint16(sc) != NULL); /* bfloat16 bits read as uint16 */
#ifdef HAS_BFLOAT16
    CHECK(mlx_array_data_bfloat16(sc) != NULL);
    {
      bfloat16_t h;
      EXPECT_ERROR(mlx_array_item_bfloat16(&h, sc));
    }
#endif
    EXPECT_ERROR(mlx_array_data_float32(sc)); /* 4-byte type on a 2-byte dtype */
    (void)n8;
  }
  {
    int bad = -1;
    mlx_array e = mlx_array_new();
    EXPECT_ERROR(e = mlx_array_new_data(fdata, &bad, 1, MLX_FLOAT32));
    CHECK(e.ctx == NULL);
  }

  /* vectors and eval */
  mlx_vector_array vec = mlx_vector_array_new_value(a);
  CHECK(mlx_vector_array_append_value(vec, m) == 0);
  CHECK(mlx_vector_array_append_data(vec, &mp, 1) == 0);
  CHECK(mlx_vector_array_size(vec) == 3);
  mlx_array got = mlx_array_new();
  CHECK(mlx_vector_array_get(&got, vec, 1) == 0 && mlx_array_size(got) == 1);
  CHECK(mlx_eval(vec) == 0);
  mlx_vector_array vec2 = mlx_vector_array_new_data(&a, 1);
  CHECK(mlx_vector_array_set(&vec2, vec) == 0 && mlx_vector_array_size(vec2) == 3);
  CHECK(mlx_vector_array_set_data(&vec2, &a, 1) == 0 && mlx_vector_array_size(vec2) == 1);
  CHECK(mlx_vector_array_set_value(&vec2, m) == 0 && mlx_vector_array_size(vec2) == 1);
  mlx_vector_array vec3 = mlx_vector_array_new();
  CHECK(mlx_vector_array_size(vec3) == 0);

  /* distributed: no launcher environment here, so everything is size one */
  CHECK(mlx_distributed_is_available("ring"));
  CHECK(mlx_distributed_is_available(NULL));
  CHECK(!mlx_distributed_is_available("bogus"));
  mlx_distributed_group g = mlx_distributed_group_new();
  CHECK(mlx_distributed_init(&g, false, NULL) == 0);
  int rank = -1, size = -1;
  CHECK(mlx_distributed_group_get_rank(&rank, g) == 0 && rank == 0);
  CHECK(mlx_distributed_group_get_size(&size, g) == 0 && size == 1);
  CHECK(mlx_distributed_group_rank(g) == 0 && mlx_distributed_group_size(g) == 1);
  mlx_distributed_group strict_g = mlx_distributed_group_new();
  EXPECT_ERROR(mlx_distributed_init(&strict_g, true, "ring"));
  CHECK(strstr(last_error, "MLX_RANK") && strstr(last_error, "MLX_HOSTFILE"));
  mlx_distributed_group sub = mlx_distributed_group_new();
  CHECK(mlx_distributed_group_split(&sub, g, 0, -1) == 0);
  CHECK(mlx_distributed_group_size(sub) == 1);

  mlx_array r = mlx_array_new();
  CHECK(mlx_distributed_all_sum(&r, a, g, null_stream) == 0 && mlx_array_eval(r) == 0);
  CHECK(memcmp(mlx_array_data_float32(r), fdata, sizeof fdata) == 0);
  CHECK(mlx_distributed_all_max(&r, a, g, cpu) == 0 && mlx_array_data_float32(r)[2] == 3.0f);
  CHECK(mlx_distributed_all_min(&r, a, g, mine) == 0 && mlx_array_data_float32(r)[0] == 1.0f);
  CHECK(mlx_distributed_all_gather(&r, a, g, null_stream) == 0 && mlx_array_dim(r, 0) == 2);
  CHECK(mlx_distributed_sum_scatter(&r, a, g, null_stream) == 0 && mlx_array_size(r) == 6);
  mlx_distributed_group empty_g = mlx_distributed_group_new();
  CHECK(mlx_distributed_all_sum(&r, a, empty_g, null_stream) == 0); /* the default group */
  EXPECT_ERROR(mlx_distributed_send(&r, a, 0, g, null_stream));
  EXPECT_ERROR(mlx_distributed_recv(&r, shape, 2, MLX_FLOAT32, 0, g, null_stream));
  EXPECT_ERROR(mlx_distributed_recv_like(&r, a, 0, g, null_stream));

  mlx_distributed_group bg = mlx_distributed_group_new();
  EXPECT_ERROR(mlx_distributed_init_with_all_gather(&bg, true, "ring", my_all_gather, NULL,
                                                    my_dtor)); /* no MLX_RANK / MLX_WORLD_SIZE */
  CHECK(dtor_calls == 1);
  EXPECT_ERROR(
      mlx_distributed_init_with_all_gather(&bg, true, "nope", my_all_gather, NULL, my_dtor));
  CHECK(dtor_calls == 2);
  CHECK(mlx_distributed_clear_backends() == 0);

  /* tear down */
  mlx_distributed_group_free(bg);
  mlx_distributed_group_free(empty_g);
  mlx_distributed_group_free(strict_g);
  mlx_distributed_group_free(sub);
  mlx_distributed_group_free(g);
  mlx_array_free(r);
  mlx_array_free(got);
  mlx_vector_array_free(vec);
  mlx_vector_array_free(vec2);
  mlx_vector_array_free(vec3);
  mlx_array_free(sc);
  mlx_array_free(a);
  mlx_array_free(m);
  mlx_array_free(mp);
  CHECK(managed_frees == 2);
  mlx_stream_free(cpu);
  mlx_stream_free(mine);
  mlx_stream_free(null_stream);
  mlx_stream_free(ds);
  mlx_stream_free(scopy);
  mlx_device_free(dev);
  mlx_device_free(dflt);
  mlx_device_free(dcopy);
  mlx_device_free(sdev);
  mlx_string_free(s);
  CHECK(gather_calls == 0);
  mlx_set_error_handler(NULL, NULL, NULL);
  CHECK(handler_dtor_calls == 1);
  printf("consumer: every API function called, %d expected errors reported\n", n_errors);
  return 0;
}

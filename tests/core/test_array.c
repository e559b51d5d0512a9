/* Arrays: every constructor and accessor, error paths, managed data,
 * 0-element and large shapes, pending/failed arrays, tostring. */
#include <complex.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/array_impl.h"
#include "mlx/c/mlx.h"
#include "testutil.h"

static int g_dtor_calls;
static void* g_dtor_arg;
static void count_dtor(void* p) {
  g_dtor_calls++;
  g_dtor_arg = p;
}

static void expect_str(mlx_array a, const char* want) {
  mlx_string s = mlx_string_new();
  T_EQ_INT(mlx_array_tostring(&s, a), 0);
  if (strcmp(mlx_string_data(s), want) != 0)
    T_FAIL("tostring: got '%s', want '%s'", mlx_string_data(s), want);
  mlx_string_free(s);
}

static bool aligned(const void* p) { return ((uintptr_t)p % 64) == 0; }

static void test_new_data_all_dtypes(void) {
  unsigned char src[6 * 8];
  for (size_t i = 0; i < sizeof src; i++) src[i] = (unsigned char)(i * 7 + 1);
  int shape[2] = {2, 3};
  for (int dt = MLX_BOOL; dt <= MLX_COMPLEX64; dt++) {
    size_t isz = mlx_dtype_size((mlx_dtype)dt);
    T_ASSERT(isz == 1 || isz == 2 || isz == 4 || isz == 8);
    mlx_array a = mlx_array_new_data(src, shape, 2, (mlx_dtype)dt);
    T_EXPECT_NO_ERROR();
    T_ASSERT(a.ctx);
    T_EQ_INT(mlx_array_dtype(a), dt);
    T_EQ_INT(mlx_array_itemsize(a), isz);
    T_EQ_INT(mlx_array_size(a), 6);
    T_EQ_INT(mlx_array_nbytes(a), 6 * isz);
    T_EQ_INT(mlx_array_ndim(a), 2);
    T_EQ_INT(mlx_array_shape(a)[0], 2);
    T_EQ_INT(mlx_array_shape(a)[1], 3);
    T_EQ_INT(mlx_array_strides(a)[0], 3);
    T_EQ_INT(mlx_array_strides(a)[1], 1);
    T_EQ_INT(mlx_array_dim(a, 0), 2);
    T_EQ_INT(mlx_array_dim(a, -1), 3);
    T_EQ_INT(mlx_array_dim(a, -2), 2);
    T_EQ_INT(mlx_array_eval(a), 0);
    const void* d = NULL;
    switch (isz) {
      case 1: d = mlx_array_data_uint8(a); break;
      case 2: d = mlx_array_data_uint16(a); break;
      case 4: d = mlx_array_data_uint32(a); break;
      case 8: d = mlx_array_data_uint64(a); break;
    }
    T_EXPECT_NO_ERROR();
    T_ASSERT(d && aligned(d));
    T_ASSERT(d != (const void*)src);
    T_ASSERT(memcmp(d, src, 6 * isz) == 0);
    mlx_array_free(a);
  }
  /* a copy: changing the source afterwards does not change the array */
  int32_t v[3] = {1, 2, 3};
  int n3 = 3;
  mlx_array a = mlx_array_new_data(v, &n3, 1, MLX_INT32);
  v[0] = 99;
  T_EQ_INT(mlx_array_data_int32(a)[0], 1);
  /* typed accessors of every dtype */
  const int32_t* p32 = mlx_array_data_int32(a);
  T_ASSERT(p32 && p32[2] == 3);
  T_ASSERT(mlx_array_data_uint32(a) == (const uint32_t*)p32); /* same size: reinterpret */
  T_ASSERT(mlx_array_data_float32(a) == (const float*)p32);
  T_EXPECT_NO_ERROR();
  mlx_array_free(a);
}

static void test_scalars(void) {
  bool b;
  int32_t i;
  float f;
  double d;
  mlx_complex64_t c;
  mlx_array a = mlx_array_new_bool(true);
  T_EQ_INT(mlx_array_dtype(a), MLX_BOOL);
  T_EQ_INT(mlx_array_ndim(a), 0);
  T_ASSERT(mlx_array_shape(a) == NULL);
  T_EQ_INT(mlx_array_size(a), 1);
  T_EQ_INT(mlx_array_item_bool(&b, a), 0);
  T_ASSERT(b == true);
  expect_str(a, "array(True, dtype=bool)");
  mlx_array_free(a);

  a = mlx_array_new_int(-42);
  T_EQ_INT(mlx_array_dtype(a), MLX_INT32);
  T_EQ_INT(mlx_array_item_int32(&i, a), 0);
  T_EQ_INT(i, -42);
  expect_str(a, "array(-42, dtype=int32)");
  mlx_array_free(a);

  a = mlx_array_new_float32(1.5f);
  T_EQ_INT(mlx_array_dtype(a), MLX_FLOAT32);
  T_EQ_INT(mlx_array_item_float32(&f, a), 0);
  T_ASSERT(f == 1.5f);
  mlx_array_free(a);
  a = mlx_array_new_float(-0.25f);
  T_EQ_INT(mlx_array_dtype(a), MLX_FLOAT32);
  T_EQ_INT(mlx_array_item_float32(&f, a), 0);
  T_ASSERT(f == -0.25f);
  expect_str(a, "array(-0.25, dtype=float32)");
  mlx_array_free(a);

  a = mlx_array_new_float64(1e300);
  T_EQ_INT(mlx_array_dtype(a), MLX_FLOAT64);
  T_EQ_INT(mlx_array_item_float64(&d, a), 0);
  T_ASSERT(d == 1e300);
  mlx_array_free(a);
  a = mlx_array_new_double(2.5);
  T_EQ_INT(mlx_array_dtype(a), MLX_FLOAT64);
  T_EQ_INT(mlx_array_item_float64(&d, a), 0);
  T_ASSERT(d == 2.5);
  mlx_array_free(a);

  a = mlx_array_new_complex(1.0f, -2.0f);
  T_EQ_INT(mlx_array_dtype(a), MLX_COMPLEX64);
  T_EQ_INT(mlx_array_item_complex64(&c, a), 0);
  T_ASSERT(crealf(c) == 1.0f && cimagf(c) == -2.0f);
  expect_str(a, "array(1-2j, dtype=complex64)");
  mlx_array_free(a);
  T_EXPECT_NO_ERROR();

  /* set_* replace what the handle held */
  a = mlx_array_new();
  T_EQ_INT(mlx_array_set_bool(&a, false), 0);
  T_EQ_INT(mlx_array_item_bool(&b, a), 0);
  T_ASSERT(!b);
  T_EQ_INT(mlx_array_set_int(&a, 7), 0);
  T_EQ_INT(mlx_array_item_int32(&i, a), 0);
  T_EQ_INT(i, 7);
  T_EQ_INT(mlx_array_set_float32(&a, 3.0f), 0);
  T_EQ_INT(mlx_array_item_float32(&f, a), 0);
  T_ASSERT(f == 3.0f);
  T_EQ_INT(mlx_array_set_float(&a, 4.0f), 0);
  T_EQ_INT(mlx_array_item_float32(&f, a), 0);
  T_ASSERT(f == 4.0f);
  T_EQ_INT(mlx_array_set_float64(&a, 5.0), 0);
  T_EQ_INT(mlx_array_item_float64(&d, a), 0);
  T_ASSERT(d == 5.0);
  T_EQ_INT(mlx_array_set_double(&a, 6.0), 0);
  T_EQ_INT(mlx_array_item_float64(&d, a), 0);
  T_ASSERT(d == 6.0);
  T_EQ_INT(mlx_array_set_complex(&a, 0.5f, 0.25f), 0);
  T_EQ_INT(mlx_array_item_complex64(&c, a), 0);
  T_ASSERT(crealf(c) == 0.5f && cimagf(c) == 0.25f);
  int64_t v64[2] = {INT64_MIN, INT64_MAX};
  int two = 2;
  T_EQ_INT(mlx_array_set_data(&a, v64, &two, 1, MLX_INT64), 0);
  T_EQ_INT(mlx_array_dtype(a), MLX_INT64);
  T_ASSERT(mlx_array_data_int64(a)[0] == INT64_MIN && mlx_array_data_int64(a)[1] == INT64_MAX);
  /* a failing set_data leaves the handle as it was */
  int neg = -1;
  T_ASSERT(mlx_array_set_data(&a, v64, &neg, 1, MLX_INT64) != 0);
  T_EXPECT_ERROR("[array]", "-1");
  T_EQ_INT(mlx_array_dtype(a), MLX_INT64);
  T_EQ_INT(mlx_array_size(a), 2);
  /* mlx_array_set shares */
  mlx_array b2 = mlx_array_new();
  T_EQ_INT(mlx_array_set(&b2, a), 0);
  T_ASSERT(b2.ctx == a.ctx);
  mlx_array_free(a);
  T_ASSERT(mlx_array_data_int64(b2)[1] == INT64_MAX); /* still alive */
  mlx_array_free(b2);
  T_EXPECT_NO_ERROR();
}

static void test_item_every_dtype(void) {
  int one = 1;
  uint8_t u8 = 200;
  uint16_t u16 = 60000;
  uint32_t u32 = 4000000000u;
  uint64_t u64 = UINT64_MAX - 5;
  int8_t i8 = -100;
  int16_t i16 = -30000;
  int64_t i64 = INT64_MIN + 3;
  mlx_array a;
#define ITEM_CHECK(T, DT, VAL, NAME)              \
  do {                                            \
    T got_;                                       \
    a = mlx_array_new_data(&VAL, &one, 1, DT);    \
    T_EQ_INT(mlx_array_item_##NAME(&got_, a), 0); \
    T_ASSERT(got_ == VAL);                        \
    T_ASSERT(mlx_array_data_##NAME(a)[0] == VAL); \
    mlx_array_free(a);                            \
  } while (0)
  ITEM_CHECK(uint8_t, MLX_UINT8, u8, uint8);
  ITEM_CHECK(uint16_t, MLX_UINT16, u16, uint16);
  ITEM_CHECK(uint32_t, MLX_UINT32, u32, uint32);
  ITEM_CHECK(uint64_t, MLX_UINT64, u64, uint64);
  ITEM_CHECK(int8_t, MLX_INT8, i8, int8);
  ITEM_CHECK(int16_t, MLX_INT16, i16, int16);
  ITEM_CHECK(int64_t, MLX_INT64, i64, int64);
  T_EXPECT_NO_ERROR();
  /* 16-bit floats: raw bits through the uint16 accessors (same size) */
  uint16_t h = 0x3e00; /* float16 1.5 */
  a = mlx_array_new_data(&h, &one, 1, MLX_FLOAT16);
  uint16_t hb = 0;
  T_EQ_INT(mlx_array_item_uint16(&hb, a), 0);
  T_EQ_INT(hb, 0x3e00);
  expect_str(a, "array([1.5], dtype=float16)");
#ifdef HAS_FLOAT16
  float16_t hf;
  T_EQ_INT(mlx_array_item_float16(&hf, a), 0);
  T_ASSERT((float)hf == 1.5f);
  T_ASSERT((float)mlx_array_data_float16(a)[0] == 1.5f);
#endif
  mlx_array_free(a);
  uint16_t bf = 0xc040; /* bfloat16 -3 */
  a = mlx_array_new_data(&bf, &one, 1, MLX_BFLOAT16);
  T_EQ_INT(mlx_array_item_uint16(&hb, a), 0);
  T_EQ_INT(hb, 0xc040);
  expect_str(a, "array([-3], dtype=bfloat16)");
#ifdef HAS_BFLOAT16
  bfloat16_t bv;
  T_EQ_INT(mlx_array_item_bfloat16(&bv, a), 0);
  T_ASSERT(mlx_array_data_bfloat16(a) != NULL);
#endif
  mlx_array_free(a);
  T_EXPECT_NO_ERROR();
}

static void test_errors(void) {
  int32_t v[4] = {1, 2, 3, 4};
  int shape[2] = {2, 2};
  mlx_array a;

  int negshape[2] = {2, -3};
  a = mlx_array_new_data(v, negshape, 2, MLX_INT32);
  T_ASSERT(a.ctx == NULL);
  T_EXPECT_ERROR("[array]", "dimension 1", "-3");

  a = mlx_array_new_data(NULL, shape, 2, MLX_INT32);
  T_ASSERT(a.ctx == NULL);
  T_EXPECT_ERROR("[array]", "NULL", "4 elements");

  a = mlx_array_new_data(v, shape, 2, (mlx_dtype)99);
  T_ASSERT(a.ctx == NULL);
  T_EXPECT_ERROR("[array]", "unknown dtype 99");
  a = mlx_array_new_data(v, shape, 2, (mlx_dtype)-1);
  T_ASSERT(a.ctx == NULL);
  T_EXPECT_ERROR("[array]", "unknown dtype -1");

  a = mlx_array_new_data(v, NULL, 2, MLX_INT32);
  T_ASSERT(a.ctx == NULL);
  T_EXPECT_ERROR("[array]", "shape is NULL");

  a = mlx_array_new_data(v, shape, -1, MLX_INT32);
  T_ASSERT(a.ctx == NULL);
  T_EXPECT_ERROR("[array]", "-1", "dimensions");

  int huge[3] = {INT_MAX, INT_MAX, INT_MAX};
  a = mlx_array_new_data(v, huge, 3, MLX_INT64);
  T_ASSERT(a.ctx == NULL);
  T_EXPECT_ERROR("[array]", "overflows");

  a = mlx_array_new_data_managed(NULL, shape, 2, MLX_INT32, count_dtor);
  T_ASSERT(a.ctx == NULL);
  T_EXPECT_ERROR("[array]", "NULL");
  a = mlx_array_new_data_managed(v, negshape, 2, MLX_INT32, count_dtor);
  T_ASSERT(a.ctx == NULL);
  T_EXPECT_ERROR("[array]", "-3");
  a = mlx_array_new_data_managed_payload(v, shape, 2, (mlx_dtype)14, v, count_dtor);
  T_ASSERT(a.ctx == NULL);
  T_EXPECT_ERROR("[array]", "unknown dtype 14");
  T_EQ_INT(g_dtor_calls, 0); /* a rejected buffer stays the caller's */

  /* empty handle */
  mlx_array e = mlx_array_new();
  T_ASSERT(e.ctx == NULL);
  T_EQ_INT(mlx_array_free(e), 0);
  T_EQ_INT(mlx_array_size(e), 0);
  T_EQ_INT(mlx_array_nbytes(e), 0);
  T_EQ_INT(mlx_array_ndim(e), 0);
  T_EQ_INT(mlx_array_itemsize(e), 0);
  T_ASSERT(mlx_array_shape(e) == NULL && mlx_array_strides(e) == NULL);
  T_EXPECT_NO_ERROR();
  T_ASSERT(mlx_array_eval(e) != 0);
  T_EXPECT_ERROR("[array]", "empty array handle", "mlx_array_eval");
  T_ASSERT(mlx_array_data_float32(e) == NULL);
  T_EXPECT_ERROR("[array]", "empty array handle", "mlx_array_data_float32");
  float f;
  T_ASSERT(mlx_array_item_float32(&f, e) != 0);
  T_EXPECT_ERROR("[array]", "empty array handle");
  mlx_string s = mlx_string_new();
  T_ASSERT(mlx_array_tostring(&s, e) != 0);
  T_EXPECT_ERROR("[array]", "empty array handle");
  T_EQ_INT(mlx_array_dim(e, 0), 0);
  T_EXPECT_ERROR("[array]", "empty array handle");
  T_ASSERT(mlx_array_tostring(NULL, e) != 0);
  T_EXPECT_ERROR("[array]", "NULL");
  T_ASSERT(mlx_array_set(NULL, e) != 0);
  T_EXPECT_ERROR("[array]", "NULL destination");
  T_ASSERT(mlx_array_set_int(NULL, 1) != 0);
  T_EXPECT_ERROR("[array]", "NULL destination");

  /* item needs exactly one element; sizes must match */
  a = mlx_array_new_data(v, shape, 2, MLX_INT32);
  int32_t i32;
  T_ASSERT(mlx_array_item_int32(&i32, a) != 0);
  T_EXPECT_ERROR("[array]", "exactly one element", "4 elements");
  T_ASSERT(mlx_array_item_int32(NULL, a) != 0);
  T_EXPECT_ERROR("[array]", "NULL result");
  T_ASSERT(mlx_array_data_int64(a) == NULL);
  T_EXPECT_ERROR("[array]", "int32", "int64");
  T_ASSERT(mlx_array_data_uint8(a) == NULL);
  T_EXPECT_ERROR("[array]", "int32", "uint8");
  double d;
  T_ASSERT(mlx_array_item_float64(&d, a) != 0);
  T_EXPECT_ERROR("[array]", "float64");
  T_EQ_INT(mlx_array_dim(a, 2), 0);
  T_EXPECT_ERROR("[array]", "axis 2", "2 dimensions");
  T_EQ_INT(mlx_array_dim(a, -3), 0);
  T_EXPECT_ERROR("[array]", "axis -3");
  mlx_array_free(a);
  mlx_string_free(s);
}

static void test_managed(void) {
  int shape[1] = {4};
  float* buf = malloc(4 * sizeof(float));
  for (int i = 0; i < 4; i++) buf[i] = (float)i * 0.5f;
  g_dtor_calls = 0;
  g_dtor_arg = NULL;
  mlx_array a = mlx_array_new_data_managed(buf, shape, 1, MLX_FLOAT32, count_dtor);
  T_ASSERT(a.ctx);
  T_ASSERT(mlx_array_data_float32(a) == buf); /* no copy */
  mlx_array b = mlx_array_new();
  mlx_array_set(&b, a);
  mlx_array_free(a);
  T_EQ_INT(g_dtor_calls, 0);
  T_ASSERT(mlx_array_data_float32(b)[3] == 1.5f);
  mlx_array_free(b);
  T_EQ_INT(g_dtor_calls, 1);
  T_ASSERT(g_dtor_arg == buf);
  free(buf);

  /* payload variant: dtor(payload) */
  int payload_obj = 5;
  int32_t data[2] = {10, 20};
  int two = 2;
  g_dtor_calls = 0;
  a = mlx_array_new_data_managed_payload(data, &two, 1, MLX_INT32, &payload_obj, count_dtor);
  T_ASSERT(mlx_array_data_int32(a) == data);
  mlx_array_free(a);
  T_EQ_INT(g_dtor_calls, 1);
  T_ASSERT(g_dtor_arg == &payload_obj);

  /* NULL dtor: borrowed memory, nothing runs */
  a = mlx_array_new_data_managed(data, &two, 1, MLX_INT32, NULL);
  T_EQ_INT(mlx_array_data_int32(a)[1], 20);
  mlx_array_free(a);
  /* 0 elements with NULL data */
  int zero = 0;
  g_dtor_calls = 0;
  a = mlx_array_new_data_managed(NULL, &zero, 1, MLX_FLOAT32, count_dtor);
  T_ASSERT(a.ctx);
  T_EQ_INT(mlx_array_size(a), 0);
  mlx_array_free(a);
  T_EQ_INT(g_dtor_calls, 1);
  T_EXPECT_NO_ERROR();
}

static void test_empty_and_large(void) {
  int z1[1] = {0};
  mlx_array a = mlx_array_new_data(NULL, z1, 1, MLX_FLOAT32);
  T_ASSERT(a.ctx);
  T_EQ_INT(mlx_array_size(a), 0);
  T_EQ_INT(mlx_array_nbytes(a), 0);
  T_EQ_INT(mlx_array_eval(a), 0);
  T_ASSERT(mlx_array_data_float32(a) != NULL);
  expect_str(a, "array([], dtype=float32)");
  mlx_array_free(a);
  int z3[3] = {2, 0, 3};
  a = mlx_array_new_data(NULL, z3, 3, MLX_INT8);
  T_EQ_INT(mlx_array_size(a), 0);
  T_EQ_INT(mlx_array_strides(a)[0], 0);
  T_EQ_INT(mlx_array_strides(a)[1], 3);
  expect_str(a, "array([[],\n\n       []], dtype=int8)");
  mlx_array_free(a);
  /* a zero dimension makes even an overflowing product empty */
  int zbig[3] = {INT_MAX, 0, INT_MAX};
  a = mlx_array_new_data(NULL, zbig, 3, MLX_INT64);
  T_ASSERT(a.ctx);
  T_EQ_INT(mlx_array_size(a), 0);
  mlx_array_free(a);
  T_EXPECT_NO_ERROR();
  /* ... also when the product overflowed before the zero (one-pass check) */
  int zlate[4] = {INT_MAX, INT_MAX, INT_MAX, 0};
  a = mlx_array_new_data(NULL, zlate, 4, MLX_INT64);
  T_ASSERT(a.ctx);
  T_EQ_INT(mlx_array_size(a), 0);
  mlx_array_free(a);
  T_EXPECT_NO_ERROR();
  /* a negative dimension after a zero one still fails, naming it */
  int zneg[3] = {2, 0, -3};
  a = mlx_array_new_data(NULL, zneg, 3, MLX_INT8);
  T_ASSERT(a.ctx == NULL);
  T_EXPECT_ERROR("[array]", "dimension 2", "-3");

  /* > 2^31 bytes: sizes are size_t end to end (pages are touched sparsely) */
  int big[2] = {3, 1 << 30};
  mlxd_status st;
  mlxd_array* p = mlxd_array_alloc(big, 2, MLX_UINT8, false, &st);
  if (!p) T_FAIL("alloc of 3 GiB failed: %s", st.msg);
  mlx_array h = mlxd_array_handle(p);
  T_ASSERT(mlx_array_nbytes(h) == (size_t)3 << 30);
  T_ASSERT(mlx_array_size(h) == (size_t)3 << 30);
  T_EQ_INT(mlx_array_strides(h)[0], 1 << 30);
  uint8_t* raw = p->data;
  raw[0] = 1;
  raw[((size_t)3 << 30) - 1] = 77;
  const uint8_t* d = mlx_array_data_uint8(h);
  T_ASSERT(d == raw && d[((size_t)3 << 30) - 1] == 77);
  mlx_array_free(h);
  int big32[2] = {1 << 16, 1 << 15}; /* 2^31 float32 elements = 8 GiB, managed (not touched) */
  static float dummy[1];
  a = mlx_array_new_data_managed(dummy, big32, 2, MLX_FLOAT32, NULL);
  T_ASSERT(mlx_array_size(a) == (size_t)1 << 31);
  T_ASSERT(mlx_array_nbytes(a) == (size_t)1 << 33);
  mlx_array_free(a);
  T_EXPECT_NO_ERROR();
}

static void test_tostring(void) {
  int32_t v[6] = {1, 2, 3, 4, 5, 6};
  int s1 = 3, s2[2] = {2, 3}, s3[3] = {2, 1, 3};
  mlx_array a = mlx_array_new_data(v, &s1, 1, MLX_INT32);
  expect_str(a, "array([1, 2, 3], dtype=int32)");
  mlx_array_free(a);
  a = mlx_array_new_data(v, s2, 2, MLX_INT32);
  expect_str(a, "array([[1, 2, 3],\n       [4, 5, 6]], dtype=int32)");
  mlx_array_free(a);
  a = mlx_array_new_data(v, s3, 3, MLX_INT32);
  expect_str(a, "array([[[1, 2, 3]],\n\n       [[4, 5, 6]]], dtype=int32)");
  mlx_array_free(a);
  bool bv[2] = {true, false};
  int two = 2;
  a = mlx_array_new_data(bv, &two, 1, MLX_BOOL);
  expect_str(a, "array([True, False], dtype=bool)");
  mlx_array_free(a);
  float fv[4] = {1.0f, -2.5f, 0.1f, NAN};
  int four = 4;
  a = mlx_array_new_data(fv, &four, 1, MLX_FLOAT32);
  expect_str(a, "array([1, -2.5, 0.1, nan], dtype=float32)");
  mlx_array_free(a);
  double dv[2] = {INFINITY, 1e20};
  a = mlx_array_new_data(dv, &two, 1, MLX_FLOAT64);
  expect_str(a, "array([inf, 1e+20], dtype=float64)");
  mlx_array_free(a);
  float cv[4] = {1, 2, 0, -1};
  a = mlx_array_new_data(cv, &two, 1, MLX_COMPLEX64);
  expect_str(a, "array([1+2j, 0-1j], dtype=complex64)");
  mlx_array_free(a);
  uint64_t uv[2] = {UINT64_MAX, 0};
  a = mlx_array_new_data(uv, &two, 1, MLX_UINT64);
  expect_str(a, "array([18446744073709551615, 0], dtype=uint64)");
  mlx_array_free(a);
  int8_t i8[2] = {-128, 127};
  a = mlx_array_new_data(i8, &two, 1, MLX_INT8);
  expect_str(a, "array([-128, 127], dtype=int8)");
  mlx_array_free(a);

  /* abbreviation beyond 1000 elements */
  int n = 2000;
  int32_t* big = malloc((size_t)n * sizeof *big);
  for (int i = 0; i < n; i++) big[i] = i;
  a = mlx_array_new_data(big, &n, 1, MLX_INT32);
  expect_str(a, "array([0, 1, 2, ..., 1997, 1998, 1999], dtype=int32)");
  mlx_array_free(a);
  int s2d[2] = {100, 20};
  a = mlx_array_new_data(big, s2d, 2, MLX_INT32);
  mlx_string s = mlx_string_new();
  T_EQ_INT(mlx_array_tostring(&s, a), 0);
  const char* txt = mlx_string_data(s);
  T_ASSERT(strncmp(txt, "array([[0, 1, 2, ..., 17, 18, 19],\n       [20, 21, 22, ..., 37, 38, 39],",
                   72) == 0);
  T_ASSERT(strstr(txt, "\n       ...,\n       [1940, 1941, 1942, ..., 1957, 1958, 1959],"));
  T_ASSERT(strstr(txt, "[1980, 1981, 1982, ..., 1997, 1998, 1999]], dtype=int32)"));
  mlx_string_free(s);
  mlx_array_free(a);
  /* 1000 elements exactly: not abbreviated */
  n = 1000;
  a = mlx_array_new_data(big, &n, 1, MLX_INT32);
  s = mlx_string_new();
  T_EQ_INT(mlx_array_tostring(&s, a), 0);
  T_ASSERT(strstr(mlx_string_data(s), "...") == NULL);
  T_ASSERT(strstr(mlx_string_data(s), ", 500, 501, "));
  mlx_string_free(s);
  mlx_array_free(a);
  free(big);
  T_EXPECT_NO_ERROR();
}

/* ---- pending and failed arrays ---- */

typedef struct {
  mlxd_array* a;
  int fail;
} completer_arg;

static void* completer(void* p) {
  completer_arg* c = p;
  struct timespec ts = {0, 50 * 1000 * 1000};
  nanosleep(&ts, NULL);
  if (c->fail) {
    mlxd_status st;
    mlxd_fail(&st, MLXD_EREMOTE, "[test] the producer lost its peer");
    mlxd_array_complete(c->a, &st);
  } else {
    int32_t* d = c->a->data;
    for (size_t i = 0; i < c->a->size; i++) d[i] = (int32_t)(i * 3);
    mlxd_array_complete(c->a, NULL);
  }
  return NULL;
}

static void test_pending(void) {
  int shape[1] = {5};
  mlxd_status st;
  for (int mode = 0; mode < 4; mode++) {
    mlxd_array* p = mlxd_array_alloc(shape, 1, MLX_INT32, true, &st);
    T_ASSERT(p && atomic_load(&p->state) == MLXD_ARRAY_PENDING);
    mlx_array h = mlxd_array_handle(p);
    /* metadata never waits */
    T_EQ_INT(mlx_array_size(h), 5);
    completer_arg c = {p, 0};
    pthread_t th;
    pthread_create(&th, NULL, completer, &c);
    if (mode == 0) {
      T_EQ_INT(mlx_array_eval(h), 0);
    } else if (mode == 1) {
      const int32_t* d = mlx_array_data_int32(h);
      T_ASSERT(d && d[4] == 12);
    } else if (mode == 2) {
      mlx_string s = mlx_string_new();
      T_EQ_INT(mlx_array_tostring(&s, h), 0);
      T_ASSERT(strcmp(mlx_string_data(s), "array([0, 3, 6, 9, 12], dtype=int32)") == 0);
      mlx_string_free(s);
    } else {
      mlx_vector_array v = mlx_vector_array_new_value(h);
      T_EQ_INT(mlx_eval(v), 0);
      mlx_vector_array_free(v);
    }
    T_EQ_INT(atomic_load(&p->state), MLXD_ARRAY_READY);
    T_EQ_INT(mlx_array_data_int32(h)[2], 6);
    pthread_join(th, NULL);
    mlx_array_free(h);
  }
  T_EXPECT_NO_ERROR();

  /* a failure: every reader reports the producer's message */
  mlxd_array* p = mlxd_array_alloc(shape, 1, MLX_INT32, true, &st);
  mlx_array h = mlxd_array_handle(p);
  completer_arg c = {p, 1};
  pthread_t th;
  pthread_create(&th, NULL, completer, &c);
  T_ASSERT(mlx_array_eval(h) != 0);
  T_EXPECT_ERROR("[test] the producer lost its peer");
  pthread_join(th, NULL);
  T_ASSERT(mlx_array_data_int32(h) == NULL);
  T_EXPECT_ERROR("[test] the producer lost its peer");
  int32_t x;
  int one = 1;
  T_ASSERT(mlx_array_item_int32(&x, h) != 0);
  T_EXPECT_ERROR("[test] the producer lost its peer");
  mlx_string s = mlx_string_new();
  T_ASSERT(mlx_array_tostring(&s, h) != 0);
  T_EXPECT_ERROR("[test] the producer lost its peer");
  T_ASSERT(mlxd_array_wait(p, &st) == MLXD_EREMOTE);
  T_ASSERT(strstr(st.msg, "lost its peer"));
  /* mlx_eval waits for all and reports the first failure */
  mlx_array ok = mlx_array_new_data(&x, &one, 1, MLX_INT32);
  mlx_array arr[3] = {ok, h, ok};
  mlx_vector_array v = mlx_vector_array_new_data(arr, 3);
  T_ASSERT(mlx_eval(v) != 0);
  T_EXPECT_ERROR("lost its peer");
  mlx_vector_array_free(v);
  mlx_array_free(ok);
  mlx_array_free(h);
  /* a completion with a code but no message still explains itself */
  p = mlxd_array_alloc(shape, 1, MLX_INT32, true, &st);
  mlxd_status bare = {.code = MLXD_ETIMEDOUT};
  mlxd_array_complete(p, &bare);
  h = mlxd_array_handle(p);
  T_ASSERT(mlx_array_eval(h) != 0);
  T_EXPECT_ERROR("[array]", "failed");
  mlx_array_free(h);
}

int main(void) {
  t_capture_errors();
  test_new_data_all_dtypes();
  test_scalars();
  test_item_every_dtype();
  test_errors();
  test_managed();
  test_empty_and_large();
  test_tostring();
  test_pending();
  printf("test_array: OK\n");
  return 0;
}

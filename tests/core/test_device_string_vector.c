/* Devices, strings, version and vectors of arrays. */
#include <string.h>

#include "mlx/c/mlx.h"
#include "testutil.h"

static void expect_dev_str(mlx_device d, const char* want) {
  mlx_string s = mlx_string_new();
  T_EQ_INT(mlx_device_tostring(&s, d), 0);
  if (strcmp(mlx_string_data(s), want)) T_FAIL("got '%s' want '%s'", mlx_string_data(s), want);
  mlx_string_free(s);
}

static void test_devices(void) {
  mlx_device cpu = mlx_device_new_type(MLX_CPU, 0);
  mlx_device gpu = mlx_device_new_type(MLX_GPU, 0);
  mlx_device gpu3 = mlx_device_new_type(MLX_GPU, 3);
  T_ASSERT(cpu.ctx && gpu.ctx && gpu3.ctx);
  expect_dev_str(cpu, "Device(cpu, 0)");
  expect_dev_str(gpu3, "Device(gpu, 3)");
  mlx_device_type t;
  int idx;
  T_EQ_INT(mlx_device_get_type(&t, gpu3), 0);
  T_EQ_INT(t, MLX_GPU);
  T_EQ_INT(mlx_device_get_index(&idx, gpu3), 0);
  T_EQ_INT(idx, 3);
  T_ASSERT(!mlx_device_equal(cpu, gpu));
  T_ASSERT(!mlx_device_equal(gpu, gpu3));
  mlx_device cpu_b = mlx_device_new_type(MLX_CPU, 0);
  T_ASSERT(mlx_device_equal(cpu, cpu_b));
  T_ASSERT(mlx_device_equal(mlx_device_new(), mlx_device_new()));
  T_ASSERT(!mlx_device_equal(cpu, mlx_device_new()));
  mlx_device copy = mlx_device_new();
  T_EQ_INT(mlx_device_set(&copy, gpu3), 0);
  T_ASSERT(copy.ctx == gpu3.ctx);
  mlx_device_free(gpu3);
  T_EQ_INT(mlx_device_get_index(&idx, copy), 0); /* still alive */
  T_EQ_INT(idx, 3);
  mlx_device_free(copy);

  bool avail = false;
  T_EQ_INT(mlx_device_is_available(&avail, cpu), 0);
  T_ASSERT(avail);
  T_EQ_INT(mlx_device_is_available(&avail, gpu), 0);
  T_ASSERT(!avail);
  mlx_device cpu1 = mlx_device_new_type(MLX_CPU, 1);
  T_EQ_INT(mlx_device_is_available(&avail, cpu1), 0);
  T_ASSERT(!avail);
  int count = -1;
  T_EQ_INT(mlx_device_count(&count, MLX_CPU), 0);
  T_EQ_INT(count, 1);
  T_EQ_INT(mlx_device_count(&count, MLX_GPU), 0);
  T_EQ_INT(count, 0);
  T_EXPECT_NO_ERROR();

  mlx_device def = mlx_device_new();
  T_EQ_INT(mlx_get_default_device(&def), 0);
  T_ASSERT(mlx_device_equal(def, cpu));
  T_EQ_INT(mlx_set_default_device(cpu), 0);
  T_ASSERT(mlx_set_default_device(gpu) != 0);
  T_EXPECT_ERROR("[device]", "Device(gpu, 0)", "not available");
  T_ASSERT(mlx_set_default_device(cpu1) != 0);
  T_EXPECT_ERROR("[device]", "Device(cpu, 1)");
  T_ASSERT(mlx_set_default_device(mlx_device_new()) != 0);
  T_EXPECT_ERROR("[device]", "empty device handle");
  T_EQ_INT(mlx_get_default_device(&def), 0); /* unchanged */
  T_ASSERT(mlx_device_equal(def, cpu));

  /* errors */
  mlx_device bad = mlx_device_new_type((mlx_device_type)5, 0);
  T_ASSERT(bad.ctx == NULL);
  T_EXPECT_ERROR("[device]", "unknown device type 5");
  bad = mlx_device_new_type(MLX_CPU, -2);
  T_ASSERT(bad.ctx == NULL);
  T_EXPECT_ERROR("[device]", "-2");
  T_ASSERT(mlx_device_count(&count, (mlx_device_type)9) != 0);
  T_EXPECT_ERROR("[device]", "unknown device type 9");
  T_ASSERT(mlx_device_count(NULL, MLX_CPU) != 0);
  T_EXPECT_ERROR("[device]", "NULL");
  T_ASSERT(mlx_device_get_index(&idx, mlx_device_new()) != 0);
  T_EXPECT_ERROR("[device]", "empty device handle");
  T_ASSERT(mlx_device_get_type(&t, mlx_device_new()) != 0);
  T_EXPECT_ERROR("[device]", "empty device handle");
  T_ASSERT(mlx_device_is_available(&avail, mlx_device_new()) != 0);
  T_EXPECT_ERROR("[device]", "empty device handle");
  mlx_string s = mlx_string_new();
  T_ASSERT(mlx_device_tostring(&s, mlx_device_new()) != 0);
  T_EXPECT_ERROR("[device]", "empty device handle");
  T_ASSERT(mlx_device_set(NULL, cpu) != 0);
  T_EXPECT_ERROR("[device]", "NULL");
  T_EQ_INT(mlx_device_free(mlx_device_new()), 0);
  mlx_device_free(cpu);
  mlx_device_free(cpu_b);
  mlx_device_free(cpu1);
  mlx_device_free(gpu);
  mlx_device_free(def);
}

static void test_strings(void) {
  mlx_string a = mlx_string_new();
  T_ASSERT(a.ctx == NULL && mlx_string_data(a) == NULL);
  T_EQ_INT(mlx_string_free(a), 0);
  char buf[16] = "hello";
  a = mlx_string_new_data(buf);
  buf[0] = 'J';
  T_ASSERT(strcmp(mlx_string_data(a), "hello") == 0); /* a copy */
  mlx_string b = mlx_string_new();
  T_EQ_INT(mlx_string_set(&b, a), 0);
  mlx_string_free(a);
  T_ASSERT(strcmp(mlx_string_data(b), "hello") == 0);
  mlx_string e = mlx_string_new_data("");
  T_ASSERT(e.ctx && strcmp(mlx_string_data(e), "") == 0);
  T_EQ_INT(mlx_string_set(&b, e), 0);
  T_ASSERT(strcmp(mlx_string_data(b), "") == 0);
  mlx_string_free(e);
  mlx_string_free(b);
  T_EXPECT_NO_ERROR();
  a = mlx_string_new_data(NULL);
  T_ASSERT(a.ctx == NULL);
  T_EXPECT_ERROR("[string]", "NULL");
  T_ASSERT(mlx_string_set(NULL, a) != 0);
  T_EXPECT_ERROR("[string]", "NULL");

  mlx_string v = mlx_string_new();
  T_EQ_INT(mlx_version(&v), 0);
  T_ASSERT(strcmp(mlx_string_data(v), MLXDIST_VERSION_STRING) == 0);
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", MLXDIST_VERSION_MAJOR, MLXDIST_VERSION_MINOR,
           MLXDIST_VERSION_PATCH);
  T_ASSERT(strcmp(mlx_string_data(v), want) == 0);
  T_EQ_INT(mlx_version(&v), 0); /* replaces, no leak */
  mlx_string_free(v);
  T_ASSERT(mlx_version(NULL) != 0);
  T_EXPECT_ERROR("[version]", "NULL");
}

static void test_vectors(void) {
  mlx_vector_array v = mlx_vector_array_new();
  T_ASSERT(v.ctx != NULL);
  T_EQ_INT(mlx_vector_array_size(v), 0);
  T_EQ_INT(mlx_eval(v), 0); /* nothing to wait for */
  mlx_array a = mlx_array_new_int(1), b = mlx_array_new_float(2.0f), c = mlx_array_new_bool(true);
  T_EQ_INT(mlx_vector_array_append_value(v, a), 0);
  mlx_array bc[2] = {b, c};
  T_EQ_INT(mlx_vector_array_append_data(v, bc, 2), 0);
  T_EQ_INT(mlx_vector_array_size(v), 3);
  for (int i = 0; i < 40; i++) T_EQ_INT(mlx_vector_array_append_value(v, a), 0); /* growth */
  T_EQ_INT(mlx_vector_array_size(v), 43);
  mlx_array got = mlx_array_new();
  T_EQ_INT(mlx_vector_array_get(&got, v, 1), 0);
  T_ASSERT(got.ctx == b.ctx);
  T_EQ_INT(mlx_vector_array_get(&got, v, 42), 0);
  T_ASSERT(got.ctx == a.ctx);
  T_EQ_INT(mlx_eval(v), 0);
  T_EXPECT_NO_ERROR();
  T_ASSERT(mlx_vector_array_get(&got, v, 43) != 0);
  T_EXPECT_ERROR("[vector]", "index 43", "43 arrays");
  T_ASSERT(got.ctx == a.ctx); /* unchanged on error */

  /* the vector holds references */
  mlx_array_free(b);
  mlx_array tmp = mlx_array_new();
  T_EQ_INT(mlx_vector_array_get(&tmp, v, 1), 0);
  float f;
  T_EQ_INT(mlx_array_item_float32(&f, tmp), 0);
  T_ASSERT(f == 2.0f);
  mlx_array_free(tmp);

  mlx_vector_array w = mlx_vector_array_new_data(bc, 2);
  T_EQ_INT(mlx_vector_array_size(w), 2);
  mlx_vector_array x = mlx_vector_array_new_value(c);
  T_EQ_INT(mlx_vector_array_size(x), 1);
  T_EQ_INT(mlx_vector_array_set(&x, w), 0);
  T_ASSERT(x.ctx == w.ctx);
  T_EQ_INT(mlx_vector_array_set_value(&x, a), 0);
  T_EQ_INT(mlx_vector_array_size(x), 1);
  T_EQ_INT(mlx_vector_array_size(w), 2); /* set_value made a new vector */
  T_EQ_INT(mlx_vector_array_set_data(&x, bc, 2), 0);
  T_EQ_INT(mlx_vector_array_size(x), 2);
  mlx_vector_array z = mlx_vector_array_new_data(NULL, 0);
  T_ASSERT(z.ctx && mlx_vector_array_size(z) == 0);
  T_EXPECT_NO_ERROR();

  /* errors */
  mlx_vector_array bad = mlx_vector_array_new_data(NULL, 3);
  T_ASSERT(bad.ctx == NULL);
  T_EXPECT_ERROR("[vector]", "NULL");
  T_ASSERT(mlx_vector_array_append_value(bad, a) != 0);
  T_EXPECT_ERROR("[vector]", "empty vector handle");
  T_ASSERT(mlx_vector_array_get(&got, bad, 0) != 0);
  T_EXPECT_ERROR("[vector]", "empty vector handle");
  T_EQ_INT(mlx_vector_array_size(bad), 0);
  T_ASSERT(mlx_eval(bad) != 0);
  T_EXPECT_ERROR("[eval]", "empty vector handle");
  T_ASSERT(mlx_vector_array_append_data(v, NULL, 2) != 0);
  T_EXPECT_ERROR("[vector]", "NULL");
  T_ASSERT(mlx_vector_array_set(NULL, v) != 0);
  T_EXPECT_ERROR("[vector]", "NULL");
  T_ASSERT(mlx_vector_array_get(NULL, v, 0) != 0);
  T_EXPECT_ERROR("[vector]", "NULL");
  mlx_vector_array withnull = mlx_vector_array_new_value(mlx_array_new());
  T_EQ_INT(mlx_vector_array_size(withnull), 1);
  T_ASSERT(mlx_eval(withnull) != 0);
  T_EXPECT_ERROR("[eval]", "entry 0", "empty array handle");
  T_EQ_INT(mlx_vector_array_free(bad), 0);

  mlx_vector_array_free(withnull);
  mlx_vector_array_free(z);
  mlx_vector_array_free(x);
  mlx_vector_array_free(w);
  mlx_vector_array_free(v);
  mlx_array_free(got);
  mlx_array_free(a);
  mlx_array_free(c);
}

int main(void) {
  t_capture_errors();
  test_devices();
  test_strings();
  test_vectors();
  printf("test_device_string_vector: OK\n");
  return 0;
}

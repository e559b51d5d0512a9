/* Streams: independent workers, in-order execution, synchronize, failure
 * propagation through inputs, pending arrays, lifetime, the public API. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/gpu.h"
#include "core/stream_impl.h"
#include "mlx/c/mlx.h"
#include "testutil.h"
#include "util/clock.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- two streams are two queues ---- */

static atomic_int g_flag;

static void wait_flag_task(void* arg, mlxd_status* st) {
  (void)arg;
  double deadline = mlxd_now() + 20.0;
  while (!atomic_load(&g_flag)) {
    if (mlxd_now() > deadline) {
      mlxd_fail(st, MLXD_ETIMEDOUT, "[test] the flag was never set: streams are not independent");
      return;
    }
    sleep_ms(1);
  }
}
static void set_flag_task(void* arg, mlxd_status* st) {
  (void)arg;
  (void)st;
  atomic_store(&g_flag, 1);
}

static void test_independent(void) {
  mlx_device cpu = mlx_device_new_type(MLX_CPU, 0);
  mlx_stream a = mlx_stream_new_device(cpu);
  mlx_stream b = mlx_stream_new_device(cpu);
  T_ASSERT(a.ctx && b.ctx && !mlx_stream_equal(a, b));
  mlxd_status st;
  int one = 1;
  mlxd_array* out = mlxd_array_alloc(&one, 1, MLX_INT32, true, &st);
  /* A's task blocks until B's task runs: one shared queue would time out. */
  T_EQ_INT(mlxd_stream_submit(mlxd_stream_of(a), wait_flag_task, NULL, NULL, NULL, 0, &out, 1, &st),
           0);
  T_EQ_INT(mlxd_stream_submit(mlxd_stream_of(b), set_flag_task, NULL, NULL, NULL, 0, NULL, 0, &st),
           0);
  mlx_array h = mlxd_array_handle(out);
  T_EQ_INT(mlx_array_eval(h), 0);
  mlx_array_free(h);
  /* and the same with the default stream as the waiting one */
  atomic_store(&g_flag, 0);
  mlxd_stream* def = mlxd_default_stream(MLX_CPU, &st);
  T_ASSERT(def);
  out = mlxd_array_alloc(&one, 1, MLX_INT32, true, &st);
  T_EQ_INT(mlxd_stream_submit(def, wait_flag_task, NULL, NULL, NULL, 0, &out, 1, &st), 0);
  T_EQ_INT(mlxd_stream_submit(mlxd_stream_of(b), set_flag_task, NULL, NULL, NULL, 0, NULL, 0, &st),
           0);
  h = mlxd_array_handle(out);
  T_EQ_INT(mlx_array_eval(h), 0);
  mlx_array_free(h);
  mlx_stream_free(a);
  mlx_stream_free(b);
  mlx_device_free(cpu);
  T_EXPECT_NO_ERROR();
}

/* ---- order, synchronize, drain on release ---- */

#define N_ORDER 2000
static int g_order[N_ORDER];
static atomic_int g_order_n;
static atomic_int g_cleanups;

static void record_task(void* arg, mlxd_status* st) {
  (void)st;
  int i = atomic_fetch_add(&g_order_n, 1);
  g_order[i] = (int)(intptr_t)arg;
}
static void slow_record_task(void* arg, mlxd_status* st) {
  sleep_ms(5);
  record_task(arg, st);
}
static void count_cleanup(void* arg) {
  (void)arg;
  atomic_fetch_add(&g_cleanups, 1);
}

static void test_order_and_sync(void) {
  mlxd_status st;
  mlxd_stream* s = mlxd_default_stream(MLX_CPU, &st);
  atomic_store(&g_order_n, 0);
  atomic_store(&g_cleanups, 0);
  for (int i = 0; i < N_ORDER; i++)
    T_EQ_INT(mlxd_stream_submit(s, i % 100 == 0 ? slow_record_task : record_task, count_cleanup,
                                (void*)(intptr_t)i, NULL, 0, NULL, 0, &st),
             0);
  mlx_stream null_stream = mlx_stream_new();
  T_EQ_INT(mlx_synchronize(null_stream), 0); /* the default stream of the default device */
  T_EQ_INT(atomic_load(&g_order_n), N_ORDER);
  for (int i = 0; i < N_ORDER; i++) T_EQ_INT(g_order[i], i);
  T_EQ_INT(atomic_load(&g_cleanups), N_ORDER);

  /* synchronize on an explicit stream */
  mlx_stream d = mlx_default_cpu_stream_new();
  atomic_store(&g_order_n, 0);
  for (int i = 0; i < 10; i++)
    mlxd_stream_submit(s, slow_record_task, NULL, (void*)(intptr_t)i, NULL, 0, NULL, 0, &st);
  T_EQ_INT(mlx_synchronize(d), 0);
  T_EQ_INT(atomic_load(&g_order_n), 10);
  mlx_stream_free(d);

  /* the last release of a stream drains its queue first */
  mlx_device cpu = mlx_device_new_type(MLX_CPU, 0);
  mlx_stream n = mlx_stream_new_device(cpu);
  atomic_store(&g_order_n, 0);
  atomic_store(&g_cleanups, 0);
  for (int i = 0; i < 8; i++)
    mlxd_stream_submit(mlxd_stream_of(n), slow_record_task, count_cleanup, (void*)(intptr_t)i, NULL,
                       0, NULL, 0, &st);
  mlx_stream_free(n);
  T_EQ_INT(atomic_load(&g_order_n), 8);
  T_EQ_INT(atomic_load(&g_cleanups), 8);
  mlx_device_free(cpu);
  T_EXPECT_NO_ERROR();
}

/* ---- failures flow through inputs ---- */

static atomic_int g_ran;
static void fail_task(void* arg, mlxd_status* st) {
  (void)arg;
  mlxd_fail(st, MLXD_EREMOTE, "[test] boom from the producer");
}
static void must_not_run(void* arg, mlxd_status* st) {
  (void)arg;
  (void)st;
  atomic_fetch_add(&g_ran, 1);
}
typedef struct {
  mlxd_array* in;
  mlxd_array* out;
} copy_arg;
static void copy_plus_one(void* p, mlxd_status* st) {
  (void)st;
  copy_arg* c = p;
  const int32_t* src = c->in->data;
  int32_t* dst = c->out->data;
  for (size_t i = 0; i < c->in->size; i++) dst[i] = src[i] + 1;
}
static void produce_slowly(void* p, mlxd_status* st) {
  (void)st;
  sleep_ms(30);
  mlxd_array* a = p;
  int32_t* d = a->data;
  for (size_t i = 0; i < a->size; i++) d[i] = (int32_t)i * 10;
}

static void test_failure_and_dependencies(void) {
  mlxd_status st;
  int four = 4;
  mlx_device cpu = mlx_device_new_type(MLX_CPU, 0);
  mlx_stream sa = mlx_stream_new_device(cpu);
  mlx_stream sb = mlx_stream_new_device(cpu);
  mlxd_stream* A = mlxd_stream_of(sa);
  mlxd_stream* B = mlxd_stream_of(sb);

  /* success across streams: B's task waits for A's output */
  mlxd_array* x = mlxd_array_alloc(&four, 1, MLX_INT32, true, &st);
  mlxd_array* y = mlxd_array_alloc(&four, 1, MLX_INT32, true, &st);
  copy_arg c = {x, y};
  T_EQ_INT(mlxd_stream_submit(B, copy_plus_one, NULL, &c, &x, 1, &y, 1, &st), 0);
  T_EQ_INT(mlxd_stream_submit(A, produce_slowly, NULL, x, NULL, 0, &x, 1, &st), 0);
  mlx_array hy = mlxd_array_handle(y);
  const int32_t* yd = mlx_array_data_int32(hy);
  T_ASSERT(yd);
  for (int i = 0; i < 4; i++) T_EQ_INT(yd[i], i * 10 + 1);
  mlx_array_free(hy);
  mlxd_array_release(x);

  /* failure: the dependent task does not run and fails with the input's message */
  atomic_store(&g_ran, 0);
  atomic_store(&g_cleanups, 0);
  x = mlxd_array_alloc(&four, 1, MLX_INT32, true, &st);
  y = mlxd_array_alloc(&four, 1, MLX_INT32, true, &st);
  T_EQ_INT(mlxd_stream_submit(A, fail_task, count_cleanup, NULL, NULL, 0, &x, 1, &st), 0);
  T_EQ_INT(mlxd_stream_submit(B, must_not_run, count_cleanup, NULL, &x, 1, &y, 1, &st), 0);
  hy = mlxd_array_handle(y);
  T_ASSERT(mlx_array_eval(hy) != 0);
  T_EXPECT_ERROR("[test] boom from the producer");
  mlx_stream_free(sb); /* drains B: the cleanups have run */
  T_EQ_INT(atomic_load(&g_ran), 0);
  mlx_synchronize(sa);
  T_EQ_INT(atomic_load(&g_cleanups), 2);
  mlx_array hx = mlxd_array_handle(x);
  T_ASSERT(mlx_array_eval(hx) != 0);
  T_EXPECT_ERROR("[test] boom from the producer");
  mlx_array_free(hx);
  mlx_array_free(hy);

  /* many inputs and outputs (beyond the inline storage) */
  mlxd_array* ins[10];
  mlxd_array* outs[10];
  for (int i = 0; i < 10; i++) {
    ins[i] = mlxd_array_alloc(&four, 1, MLX_INT32, false, &st);
    outs[i] = mlxd_array_alloc(&four, 1, MLX_INT32, true, &st);
  }
  T_EQ_INT(mlxd_stream_submit(A, set_flag_task, NULL, NULL, ins, 10, outs, 10, &st), 0);
  for (int i = 0; i < 10; i++) {
    mlxd_array_release(ins[i]);
    T_EQ_INT(mlxd_array_wait(outs[i], &st), 0);
    mlxd_array_release(outs[i]);
  }
  mlx_stream_free(sa);

  /* submit errors: nothing queued, cleanup not called, pending outputs failed */
  atomic_store(&g_cleanups, 0);
  mlxd_status est;
  mlxd_array* o = mlxd_array_alloc(&four, 1, MLX_INT32, true, &st);
  T_ASSERT(mlxd_stream_submit(NULL, must_not_run, count_cleanup, NULL, NULL, 0, &o, 1, &est) != 0);
  T_ASSERT(strstr(est.msg, "[stream]") && strstr(est.msg, "NULL stream"));
  T_ASSERT(mlxd_array_wait(o, &st) != 0); /* not left pending forever */
  mlxd_array_release(o);
  mlxd_stream* def = mlxd_default_stream(MLX_CPU, &st);
  T_ASSERT(mlxd_stream_submit(def, NULL, count_cleanup, NULL, NULL, 0, NULL, 0, &est) != 0);
  T_ASSERT(strstr(est.msg, "run function"));
  T_ASSERT(mlxd_stream_submit(def, must_not_run, count_cleanup, NULL, NULL, 2, NULL, 0, &est) != 0);
  T_ASSERT(strstr(est.msg, "2 inputs"));
  T_EQ_INT(atomic_load(&g_cleanups), 0);
  mlx_device_free(cpu);
  T_EXPECT_NO_ERROR();
}

/* ---- the public stream API ---- */

static void sync_self_task(void* arg, mlxd_status* st) {
  (void)st;
  mlx_stream* h = arg;
  if (mlx_synchronize(*h) != 0) atomic_store(&g_ran, 42);
}

static void test_api(void) {
  mlx_string str = mlx_string_new();
  mlx_stream d = mlx_default_cpu_stream_new();
  int idx = -1;
  T_EQ_INT(mlx_stream_get_index(&idx, d), 0);
  T_EQ_INT(idx, 0);
  T_EQ_INT(mlx_stream_tostring(&str, d), 0);
  T_ASSERT(strcmp(mlx_string_data(str), "Stream(Device(cpu, 0), 0)") == 0);
  mlx_device dev = mlx_device_new();
  T_EQ_INT(mlx_stream_get_device(&dev, d), 0);
  T_EQ_INT(mlx_device_tostring(&str, dev), 0);
  T_ASSERT(strcmp(mlx_string_data(str), "Device(cpu, 0)") == 0);

  mlx_stream g = mlx_stream_new();
  T_EQ_INT(mlx_get_default_stream(&g, dev), 0);
  T_ASSERT(mlx_stream_equal(g, d));
  T_ASSERT(mlx_stream_equal(mlx_stream_new(), mlx_stream_new()));
  T_ASSERT(!mlx_stream_equal(g, mlx_stream_new()));

  /* new streams get increasing indices */
  mlx_stream n1 = mlx_stream_new_device(dev);
  mlx_stream n2 = mlx_stream_new_device(dev);
  int i1, i2;
  T_EQ_INT(mlx_stream_get_index(&i1, n1), 0);
  T_EQ_INT(mlx_stream_get_index(&i2, n2), 0);
  T_ASSERT(i1 > 0 && i2 > i1);
  char want[64];
  snprintf(want, sizeof want, "Stream(Device(cpu, 0), %d)", i2);
  T_EQ_INT(mlx_stream_tostring(&str, n2), 0);
  T_ASSERT(strcmp(mlx_string_data(str), want) == 0);
  mlx_stream copy = mlx_stream_new();
  T_EQ_INT(mlx_stream_set(&copy, n1), 0);
  T_ASSERT(mlx_stream_equal(copy, n1));
  mlx_stream_free(copy);

  /* set the default stream, then back */
  mlxd_status st;
  T_EQ_INT(mlx_set_default_stream(n1), 0);
  T_ASSERT(mlxd_default_stream(MLX_CPU, &st) == mlxd_stream_of(n1));
  mlx_stream g2 = mlx_stream_new();
  T_EQ_INT(mlx_get_default_stream(&g2, dev), 0);
  T_ASSERT(mlx_stream_equal(g2, n1));
  mlx_stream_free(g2);
  T_EQ_INT(mlx_set_default_stream(d), 0);
  T_ASSERT(mlxd_default_stream(MLX_CPU, &st) == mlxd_stream_of(d));
  mlx_stream_free(n1); /* still kept alive as a former default */
  mlx_stream_free(n2);

  /* synchronize from a task on the same stream is an error, not a hang */
  atomic_store(&g_ran, 0);
  mlxd_stream_submit(mlxd_stream_of(d), sync_self_task, NULL, &d, NULL, 0, NULL, 0, &st);
  T_EQ_INT(mlx_synchronize(d), 0);
  T_EQ_INT(atomic_load(&g_ran), 42);
  T_EXPECT_ERROR("[stream]", "wait for itself");

  /* GPU (where the GPU provider finds none: every machine this suite runs on
   * in CI; scripts/gpu-check.sh tests GPU streams on a GPU) and bad handles */
  mlx_device gpu = mlx_device_new_type(MLX_GPU, 0);
  mlx_stream bad = mlx_stream_new(); /* the null handle */
  if (mlxd_gpu_count() == 0) {
    const char* why = mlxd_gpu_probe()->why;
    T_ASSERT(strstr(why, "no CUDA runtime (could not load") == why ||
             strstr(why, "loaded but cudaGetDeviceCount: ") != NULL);
    bad = mlx_stream_new_device(gpu);
    T_ASSERT(bad.ctx == NULL);
    T_EXPECT_ERROR("[stream] no GPU is available: ", why, "use a CPU stream");
    bad = mlx_default_gpu_stream_new();
    T_ASSERT(bad.ctx == NULL);
    T_EXPECT_ERROR("[stream] no GPU is available: ", why);
    T_ASSERT(mlx_get_default_stream(&g, gpu) != 0);
    T_EXPECT_ERROR("no GPU is available: ", why);
    T_ASSERT(mlxd_default_stream(MLX_GPU, &st) == NULL);
    T_ASSERT(strstr(st.msg, "no GPU is available: "));
    int count = -1;
    T_EQ_INT(mlx_device_count(&count, MLX_GPU), 0);
    T_EQ_INT(count, 0);
    bool avail = true;
    T_EQ_INT(mlx_device_is_available(&avail, gpu), 0);
    T_ASSERT(!avail);
    T_ASSERT(mlx_set_default_device(gpu) != 0);
    T_EXPECT_ERROR("[device] Device(gpu, 0) is not available: no GPU is available: ", why);
  }
  mlx_device cpu1 = mlx_device_new_type(MLX_CPU, 1);
  bad = mlx_stream_new_device(cpu1);
  T_ASSERT(bad.ctx == NULL);
  T_EXPECT_ERROR("Device(cpu, 1)");
  bad = mlx_stream_new_device(mlx_device_new());
  T_ASSERT(bad.ctx == NULL);
  T_EXPECT_ERROR("[device]", "empty device handle");
  T_ASSERT(mlx_stream_tostring(&str, mlx_stream_new()) != 0);
  T_EXPECT_ERROR("[stream]", "null stream");
  T_ASSERT(mlx_stream_get_index(&idx, mlx_stream_new()) != 0);
  T_EXPECT_ERROR("[stream]", "null stream");
  T_ASSERT(mlx_stream_get_device(&dev, mlx_stream_new()) != 0);
  T_EXPECT_ERROR("[stream]", "null stream");
  T_ASSERT(mlx_set_default_stream(mlx_stream_new()) != 0);
  T_EXPECT_ERROR("[stream]", "null stream");
  T_EQ_INT(mlx_stream_free(mlx_stream_new()), 0);
  mlx_device_free(cpu1);
  mlx_device_free(gpu);
  mlx_device_free(dev);
  mlx_stream_free(g);
  mlx_stream_free(d);
  mlx_string_free(str);
  T_EXPECT_NO_ERROR();
}

/* ---- a stream released from one of its own tasks ---- */

static void release_stream_cleanup(void* arg) { mlxd_stream_release(arg); }

static void test_self_release(void) {
  mlx_device cpu = mlx_device_new_type(MLX_CPU, 0);
  mlx_stream s = mlx_stream_new_device(cpu);
  mlxd_status st;
  int one = 1;
  mlxd_array* out = mlxd_array_alloc(&one, 1, MLX_INT32, true, &st);
  mlxd_stream* p = mlxd_stream_retain(mlxd_stream_of(s));
  T_EQ_INT(mlxd_stream_submit(p, slow_record_task, release_stream_cleanup, p, NULL, 0, &out, 1,
                              &st),
           0);
  mlx_stream_free(s); /* the task's reference is now the last one */
  T_EQ_INT(mlxd_array_wait(out, &st), 0);
  mlxd_array_release(out);
  sleep_ms(50); /* the detached worker frees the stream */
  mlx_device_free(cpu);
}

/* ---- latency and idle CPU ---- */

static void noop_task(void* arg, mlxd_status* st) {
  (void)arg;
  (void)st;
}

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_latency_and_idle(void) {
  mlxd_status st;
  mlxd_stream* s = mlxd_default_stream(MLX_CPU, &st);
  int one = 1;
  const int n = 5000;
  double t0 = mlxd_now();
  for (int i = 0; i < n; i++) {
    mlxd_array* out = mlxd_array_alloc(&one, 1, MLX_INT32, true, &st);
    T_EQ_INT(mlxd_stream_submit(s, noop_task, NULL, NULL, NULL, 0, &out, 1, &st), 0);
    T_EQ_INT(mlxd_array_wait(out, &st), 0);
    mlxd_array_release(out);
  }
  double per = (mlxd_now() - t0) / n;
  printf("submit + completion round trip: %.2f us\n", per * 1e6); /* information, not a test */

  /* idle workers block: the process uses (almost) no CPU while sleeping */
  mlx_device cpu = mlx_device_new_type(MLX_CPU, 0);
  mlx_stream extra = mlx_stream_new_device(cpu);
  sleep_ms(20);
  double c0 = cpu_seconds();
  sleep_ms(300);
  double used = cpu_seconds() - c0;
  printf("CPU used over 300 ms idle with two workers: %.1f ms\n", used * 1e3);
  T_ASSERT(used < 0.05);
  mlx_stream_free(extra);
  mlx_device_free(cpu);
}

/* ---- many threads submitting to one stream ---- */

static atomic_int g_sum;
static void add_task(void* arg, mlxd_status* st) {
  (void)st;
  atomic_fetch_add(&g_sum, (int)(intptr_t)arg);
}
static void* submitter(void* p) {
  mlxd_stream* s = p;
  mlxd_status st;
  for (int i = 1; i <= 500; i++)
    if (mlxd_stream_submit(s, add_task, NULL, (void*)(intptr_t)i, NULL, 0, NULL, 0, &st)) abort();
  mlxd_stream_sync(s);
  return NULL;
}
static void test_concurrent_submit(void) {
  mlxd_status st;
  mlxd_stream* s = mlxd_default_stream(MLX_CPU, &st);
  atomic_store(&g_sum, 0);
  pthread_t th[4];
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, submitter, s);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  mlxd_stream_sync(s);
  T_EQ_INT(atomic_load(&g_sum), 4 * 500 * 501 / 2);
}

/* ---- a waiter whose task is behind the worker's runs it itself ---- */

static atomic_int g_worker_go;
static atomic_int g_seq;
static pthread_t g_main_thread;
typedef struct {
  atomic_int started;
  atomic_int seen;    /* its place in the order the tasks ran, from 1; 0: not run */
  atomic_int on_main; /* it ran on the main thread */
} step_arg;
static void held_by_worker(void* p, mlxd_status* st) {
  step_arg* a = p;
  atomic_store(&a->on_main, pthread_equal(pthread_self(), g_main_thread));
  atomic_store(&a->started, 1);
  double deadline = mlxd_now() + 20.0;
  while (!atomic_load(&g_worker_go)) {
    if (mlxd_now() > deadline) {
      mlxd_fail(st, MLXD_ETIMEDOUT, "[test] the releasing thread never ran");
      return;
    }
    sleep_ms(1);
  }
  atomic_store(&a->seen, atomic_fetch_add(&g_seq, 1) + 1);
}
static void step_task(void* p, mlxd_status* st) {
  (void)st;
  step_arg* a = p;
  atomic_store(&a->on_main, pthread_equal(pthread_self(), g_main_thread));
  atomic_store(&a->seen, atomic_fetch_add(&g_seq, 1) + 1);
}
static void* release_worker_later(void* p) {
  (void)p;
  sleep_ms(100);
  atomic_store(&g_worker_go, 1);
  return NULL;
}

static void test_wait_behind_worker(void) {
  mlxd_status st;
  mlxd_stream* s = mlxd_default_stream(MLX_CPU, &st);
  g_main_thread = pthread_self();
  atomic_store(&g_worker_go, 0);
  atomic_store(&g_seq, 0);
  int one = 1;
  step_arg a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
  /* the worker takes the first task (nobody waits for it) and holds it */
  T_EQ_INT(mlxd_stream_submit(s, held_by_worker, NULL, &a0, NULL, 0, NULL, 0, &st), 0);
  double deadline = mlxd_now() + 20.0;
  while (!atomic_load(&a0.started) && mlxd_now() < deadline) sleep_ms(1);
  T_EQ_INT(atomic_load(&a0.started), 1);
  mlxd_array* out = mlxd_array_alloc(&one, 1, MLX_INT32, true, &st);
  T_EQ_INT(mlxd_stream_submit(s, step_task, NULL, &a1, NULL, 0, NULL, 0, &st), 0);
  T_EQ_INT(mlxd_stream_submit(s, step_task, NULL, &a2, NULL, 0, &out, 1, &st), 0);
  T_EQ_INT(mlxd_stream_submit(s, step_task, NULL, &a3, NULL, 0, NULL, 0, &st), 0);
  pthread_t th;
  pthread_create(&th, NULL, release_worker_later, NULL);
  T_EQ_INT(mlxd_array_wait(out, &st), 0);
  /* queue order kept; the worker ran the first, the waiter the ones up to its array */
  T_EQ_INT(atomic_load(&a0.seen), 1);
  T_EQ_INT(atomic_load(&a0.on_main), 0);
  T_EQ_INT(atomic_load(&a1.seen), 2);
  T_EQ_INT(atomic_load(&a2.seen), 3);
  T_EQ_INT(atomic_load(&a1.on_main), 1);
  T_EQ_INT(atomic_load(&a2.on_main), 1);
  /* what the waiter left in the queue is the worker's: it runs without anyone waiting */
  deadline = mlxd_now() + 20.0;
  while (!atomic_load(&a3.seen) && mlxd_now() < deadline) sleep_ms(1);
  T_EQ_INT(atomic_load(&a3.seen), 4);
  T_EQ_INT(atomic_load(&a3.on_main), 0);
  pthread_join(th, NULL);
  mlxd_array_release(out);
  T_EXPECT_NO_ERROR();
}

/* ---- a forked child gets a working default stream ---- */

#if defined(__SANITIZE_THREAD__)
#define T_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define T_TSAN 1
#endif
#endif

#ifndef T_TSAN
static void fill_task(void* p, mlxd_status* st) {
  (void)st;
  mlxd_array* a = p;
  ((int32_t*)a->data)[0] = 1234;
}
#endif

static void test_fork_child(void) {
#ifndef T_TSAN /* TSan does not support threads started after a multi-threaded fork */
  mlxd_status st;
  mlxd_stream* s = mlxd_default_stream(MLX_CPU, &st);
  T_ASSERT(s);
  fflush(stdout);
  pid_t pid = fork();
  T_ASSERT(pid >= 0);
  if (pid == 0) {
    alarm(20);
    int one = 1;
    mlxd_array* out = mlxd_array_alloc(&one, 1, MLX_INT32, true, &st);
    mlxd_stream* cs = mlxd_default_stream(MLX_CPU, &st);
    if (!cs || mlxd_stream_submit(cs, fill_task, NULL, out, NULL, 0, &out, 1, &st)) _exit(2);
    if (mlxd_array_wait(out, &st) || ((int32_t*)out->data)[0] != 1234) _exit(3);
    mlxd_array_release(out);
    exit(0); /* runs the teardown, which must join the child's own worker */
  }
  int status = 0;
  T_ASSERT(waitpid(pid, &status, 0) == pid);
  T_ASSERT(WIFEXITED(status));
  T_EQ_INT(WEXITSTATUS(status), 0);
#endif
}

/* queued work at exit is drained: this task's array is checked by nobody,
 * but its cleanup must run (valgrind/ASan see no leak of arg) */
static void free_cleanup(void* arg) { free(arg); }

int main(void) {
  t_capture_errors();
  test_independent();
  test_order_and_sync();
  test_failure_and_dependencies();
  test_api();
  test_self_release();
  test_latency_and_idle();
  test_concurrent_submit();
  test_wait_behind_worker();
  test_fork_child();
  mlxd_status st;
  mlxd_stream* s = mlxd_default_stream(MLX_CPU, &st);
  mlxd_stream_submit(s, slow_record_task, free_cleanup, malloc(16), NULL, 0, NULL, 0, &st);
  printf("test_stream: OK\n");
  return 0;
}

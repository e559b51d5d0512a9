/* The per-thread free lists (core/pool.h) and what is built on them: a
 * block given back is handed out again on the same thread; a thread's kept
 * blocks are finalised and freed when it exits; at most the documented
 * number is kept; small buffers in every size class are aligned, writable
 * and reused; an array header reused after a failure carries nothing of it;
 * arrays and small buffers made on one thread and freed on another. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/array_impl.h"
#include "core/buffer.h"
#include "core/pool.h"
#include "testutil.h"

static atomic_int g_fini;
static void count_fini(void* p) {
  (void)p;
  atomic_fetch_add(&g_fini, 1);
}

#define BLOCK 200

static void test_reuse(void) {
  int fresh;
  void* a = mlxd_pool_get(MLXD_POOL_TASK, BLOCK, &fresh);
  T_REQUIRE(a);
  T_EQ_INT((int)((uintptr_t)a % MLXD_ALIGN), 0);
  memset(a, 0xab, BLOCK);
  mlxd_pool_put(MLXD_POOL_TASK, a, BLOCK, NULL);
  void* b = mlxd_pool_get(MLXD_POOL_TASK, BLOCK, &fresh);
  T_REQUIRE(b);
  if (mlxd_pool_keeps()) {
    T_CHECK(b == a);
    T_EQ_INT(fresh, 0);
  } else {
    T_EQ_INT(fresh, 1);
  }
  mlxd_pool_put(MLXD_POOL_TASK, b, BLOCK, NULL);
}

/* Take n blocks and give them back on this thread, then exit. */
static void* put_and_exit(void* arg) {
  int n = (int)(intptr_t)arg;
  void* blocks[2 * MLXD_POOL_KEEP];
  int fresh;
  for (int i = 0; i < n; i++) {
    blocks[i] = mlxd_pool_get(MLXD_POOL_TASK, BLOCK, &fresh);
    T_REQUIRE(blocks[i]);
  }
  for (int i = 0; i < n; i++) mlxd_pool_put(MLXD_POOL_TASK, blocks[i], BLOCK, count_fini);
  /* beyond the limit (or with the lists off) the block goes back at once */
  int now = atomic_load(&g_fini);
  int over = n > MLXD_POOL_KEEP ? n - MLXD_POOL_KEEP : 0;
  T_EQ_INT(now, mlxd_pool_keeps() ? over : n);
  return NULL;
}

static void test_thread_exit_and_limit(void) {
  for (int n = 3; n <= MLXD_POOL_KEEP + 7; n += MLXD_POOL_KEEP + 4) {
    atomic_store(&g_fini, 0);
    pthread_t th;
    T_REQUIRE(pthread_create(&th, NULL, put_and_exit, (void*)(intptr_t)n) == 0);
    T_REQUIRE(pthread_join(th, NULL) == 0);
    /* every block was finalised exactly once: the kept ones when the thread ended */
    T_EQ_INT(atomic_load(&g_fini), n);
  }
}

static void test_buffers(void) {
  static const size_t sizes[] = {0,    1,    63,   64,   65,   127,   128,   129,   1000,
                                 2048, 4095, 4096, 4097, 8192, 65535, 65536, 100000};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    unsigned char* p = mlxd_buffer_alloc(n);
    T_REQUIREF(p, "mlxd_buffer_alloc(%zu) failed", n);
    T_CHECKF((uintptr_t)p % MLXD_ALIGN == 0, "buffer of %zu bytes not %d-aligned", n, MLXD_ALIGN);
    memset(p, (int)i, n);
    for (size_t k = 0; k < n; k += 511) T_CHECK_EQ(p[k], (unsigned char)i);
    mlxd_buffer_free(p, n);
  }
  /* same size class (65..128 bytes): the block comes back */
  void* a = mlxd_buffer_alloc(100);
  mlxd_buffer_free(a, 100);
  void* b = mlxd_buffer_alloc(128);
  if (mlxd_pool_keeps()) T_CHECK(a == b);
  mlxd_buffer_free(b, 128);
}

static void test_array_reuse_after_failure(void) {
  int shape[3] = {2, 3, 4};
  mlxd_status st;
  for (int round = 0; round < 3; round++) {
    mlxd_array* p = mlxd_array_alloc(shape, 3, MLX_FLOAT32, true, &st);
    T_REQUIRE(p);
    T_CHECK(p->data_inline); /* 96 bytes: inside the header */
    T_EQ_INT((int)((uintptr_t)p->data % MLXD_ALIGN), 0);
    T_EQ_INT((int)p->strides[0], 12);
    T_EQ_INT((int)p->strides[2], 1);
    if (round == 0) {
      mlxd_status bad = {.code = MLXD_EREMOTE};
      snprintf(bad.msg, sizeof bad.msg, "round %d failed", round);
      mlxd_array_complete(p, &bad);
      mlxd_status got;
      T_EQ_INT(mlxd_array_wait(p, &got), MLXD_EREMOTE);
      T_CHECK(strstr(got.msg, "round 0 failed") != NULL);
    } else {
      /* a header reused after the failure above: ready, no failure left in it */
      mlxd_array_complete(p, NULL);
      T_EQ_INT(mlxd_array_wait(p, NULL), 0);
      T_CHECK(p->error == NULL);
    }
    mlxd_array_release(p);
  }
  /* more dimensions than fit in the header, and data that does not */
  int big[6] = {2, 1, 2, 1, 2, 9};
  mlxd_array* q = mlxd_array_alloc(big, 6, MLX_FLOAT64, false, &st);
  T_REQUIRE(q);
  T_CHECK(!q->data_inline);
  T_EQ_INT((int)q->strides[0], 36);
  T_EQ_INT(q->shape[5], 9);
  T_EQ_INT((int)((uintptr_t)q->data % MLXD_ALIGN), 0);
  memset(q->data, 1, q->nbytes);
  mlxd_array_release(q);
}

/* Arrays and buffers made here, released on other threads (into their lists). */
static void* release_all(void* arg) {
  void** items = arg;
  for (int i = 0; i < 100; i++) mlxd_array_release(items[i]);
  for (int i = 100; i < 200; i++) mlxd_buffer_free(items[i], 300);
  return NULL;
}

static void test_cross_thread(void) {
  for (int round = 0; round < 4; round++) {
    void* items[200];
    int shape[1] = {round * 20 + 1};
    mlxd_status st;
    for (int i = 0; i < 100; i++) {
      items[i] = mlxd_array_alloc(shape, 1, MLX_INT32, false, &st);
      T_REQUIRE(items[i]);
    }
    for (int i = 100; i < 200; i++) {
      items[i] = mlxd_buffer_alloc(300);
      T_REQUIRE(items[i]);
    }
    pthread_t th;
    T_REQUIRE(pthread_create(&th, NULL, release_all, items) == 0);
    T_REQUIRE(pthread_join(th, NULL) == 0);
  }
}

int main(void) {
  t_capture_errors();
  test_reuse();
  test_thread_exit_and_limit();
  test_buffers();
  test_array_reuse_after_failure();
  test_cross_thread();
  printf("test_pool: OK\n");
  return 0;
}

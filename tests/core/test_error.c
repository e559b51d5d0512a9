/* The error handler: the default one (prints "MLX error: ..." and exits 255,
 * also from a stream's worker thread, and after draining queued work), a
 * custom handler with data and dtor (dtor exactly once per replaced handler,
 * also under concurrent reporting), _mlx_error, mlxd_fail. */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/stream_impl.h"
#include "mlx/c/mlx.h"
#include "testutil.h"

typedef struct child_result {
  int status;
  char out[4096];
  char err[4096];
} child_result;

static void read_into(int fd, char* buf, size_t cap, size_t* len) {
  ssize_t n = read(fd, buf + *len, cap - 1 - *len);
  if (n > 0) *len += (size_t)n;
  buf[*len] = '\0';
}

/* Run fn in a forked child with stdout/stderr captured; the child gets 20 s. */
static child_result run_child(void (*fn)(void)) {
  child_result r;
  memset(&r, 0, sizeof r);
  int po[2], pe[2];
  T_ASSERT(pipe(po) == 0 && pipe(pe) == 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  T_ASSERT(pid >= 0);
  if (pid == 0) {
    dup2(po[1], 1);
    dup2(pe[1], 2);
    close(po[0]);
    close(pe[0]);
    alarm(20);
    fn();
    fflush(stdout);
    _exit(0);
  }
  close(po[1]);
  close(pe[1]);
  size_t lo = 0, le = 0;
  bool open_o = true, open_e = true;
  while (open_o || open_e) {
    struct pollfd p[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
    int n = poll(p, 2, 30000);
    T_ASSERT(n > 0);
    if (p[0].revents) {
      size_t before = lo;
      read_into(po[0], r.out, sizeof r.out, &lo);
      if (lo == before) open_o = false;
      if (!open_o) p[0].fd = -1;
    }
    if (p[1].revents) {
      size_t before = le;
      read_into(pe[0], r.err, sizeof r.err, &le);
      if (le == before) open_e = false;
    }
    if (!open_o) po[0] = po[0] >= 0 ? (close(po[0]), -1) : -1;
    if (!open_e) pe[0] = pe[0] >= 0 ? (close(pe[0]), -1) : -1;
  }
  T_ASSERT(waitpid(pid, &r.status, 0) == pid);
  return r;
}

static void expect_exit_255(const child_result* r, const char* what) {
  if (!WIFEXITED(r->status))
    T_FAIL("%s: child did not exit normally (status 0x%x)", what, r->status);
  if (WEXITSTATUS(r->status) != 255)
    T_FAIL("%s: exit status %d, want 255 (stderr: %s)", what, WEXITSTATUS(r->status), r->err);
  if (strncmp(r->err, "MLX error: ", 11) != 0)
    T_FAIL("%s: stderr does not start with 'MLX error: ': '%s'", what, r->err);
}

/* ---- children ---- */

static void child_bad_array(void) {
  int shape[1] = {2};
  mlx_array a = mlx_array_new_data(NULL, shape, 1, MLX_INT32);
  (void)a;
  printf("still running after the error\n");
}

static void child_restored_default(void) {
  t_capture_errors();
  mlx_set_error_handler(NULL, NULL, NULL); /* back to the default */
  mlx_device_new_type(MLX_GPU, -1);
  printf("still running after the error\n");
}

static void bad_call_task(void* arg, mlxd_status* st) {
  (void)arg;
  (void)st;
  int shape[1] = {-5};
  mlx_array_new_data(NULL, shape, 1, MLX_FLOAT32); /* default handler exits on the worker */
}

static void child_error_on_worker(void) {
  mlxd_status st;
  mlxd_stream* s = mlxd_default_stream(MLX_CPU, &st);
  mlxd_stream_submit(s, bad_call_task, NULL, NULL, NULL, 0, NULL, 0, &st);
  for (;;) pause(); /* the worker's exit() ends the process */
}

static void slow_print_task(void* arg, mlxd_status* st) {
  (void)arg;
  (void)st;
  struct timespec ts = {0, 200 * 1000 * 1000};
  nanosleep(&ts, NULL);
  printf("queued task ran\n");
  fflush(stdout);
}

static void child_error_with_queued_work(void) {
  mlxd_status st;
  mlxd_stream* s = mlxd_default_stream(MLX_CPU, &st);
  mlxd_stream_submit(s, slow_print_task, NULL, NULL, NULL, 0, NULL, 0, &st);
  mlx_stream_new_device(mlx_device_new()); /* error on the main thread: exit(255) drains */
}

static void child_exit_with_pending_wait(void) {
  /* exit from another application thread while the main thread waits on a stream */
  mlxd_status st;
  mlxd_stream* s = mlxd_default_stream(MLX_CPU, &st);
  mlxd_stream_submit(s, slow_print_task, NULL, NULL, NULL, 0, NULL, 0, &st);
  _mlx_error(NULL, 0, "[test] reported with %s", "_mlx_error");
}

/* ---- custom handlers ---- */

static atomic_int g_dtor_a, g_dtor_b, g_calls_a, g_calls_b;
static char g_last[1024];
static void handler_a(const char* msg, void* data) {
  atomic_fetch_add(&g_calls_a, 1);
  T_ASSERT(data == &g_dtor_a);
  snprintf(g_last, sizeof g_last, "%s", msg);
}
static void handler_b(const char* msg, void* data) {
  (void)msg;
  T_ASSERT(data == &g_dtor_b);
  atomic_fetch_add(&g_calls_b, 1);
}
static void dtor(void* data) { atomic_fetch_add((atomic_int*)data, 1); }

static void test_custom_handlers(void) {
  mlx_set_error_handler(handler_a, &g_dtor_a, dtor);
  mlx_device_new_type((mlx_device_type)7, 0);
  T_EQ_INT(atomic_load(&g_calls_a), 1);
  T_ASSERT(strstr(g_last, "[device] unknown device type 7"));
  _mlx_error("file.c", 12, "[test] value %d", 5);
  T_ASSERT(strstr(g_last, "[test] value 5") && strstr(g_last, "file.c:12"));
  mlxd_error("[test] %s", "direct");
  T_ASSERT(strcmp(g_last, "[test] direct") == 0);
  mlxd_status st;
  T_EQ_INT(mlxd_fail(&st, MLXD_ETIMEDOUT, "[test] timed out after %d s", 3), MLXD_ETIMEDOUT);
  T_EQ_INT(mlxd_error_status(&st), MLXD_ETIMEDOUT);
  T_ASSERT(strcmp(g_last, "[test] timed out after 3 s") == 0);
  T_EQ_INT(atomic_load(&g_dtor_a), 0);
  /* replacing runs the old dtor once */
  mlx_set_error_handler(handler_b, &g_dtor_b, dtor);
  T_EQ_INT(atomic_load(&g_dtor_a), 1);
  mlxd_error("[test] to b");
  T_EQ_INT(atomic_load(&g_calls_b), 1);
  T_EQ_INT(atomic_load(&g_calls_a), 4);
  mlx_set_error_handler(handler_b, &g_dtor_b, NULL); /* same data, no dtor this time */
  T_EQ_INT(atomic_load(&g_dtor_b), 1);
  t_capture_errors();
  T_EQ_INT(atomic_load(&g_dtor_b), 1); /* the last one had no dtor */
  T_EQ_INT(atomic_load(&g_dtor_a), 1);

  /* a long message is kept whole by the handler path, truncated safely in a status */
  char longmsg[2000];
  memset(longmsg, 'x', sizeof longmsg - 1);
  longmsg[sizeof longmsg - 1] = '\0';
  t_clear_errors();
  mlxd_error("[test] %s", longmsg);
  T_EQ_INT(strlen(t_last_error()), 7 + 1999);
  t_clear_errors();
  mlxd_fail(&st, MLXD_EINVAL, "[test] %s", longmsg);
  T_EQ_INT(strlen(st.msg), MLXD_MSG_MAX - 1);
  T_EQ_INT(mlxd_fail(NULL, MLXD_ESYS, "ignored"), MLXD_ESYS);
}

/* The rendered form of a structured status: op, number and this rank (as the
 * mpi plugin renders it), each piece only when set. */
static void test_render(void) {
  mlxd_status st;
  mlxd_fail_at(&st, MLXD_ETIMEDOUT, MLXD_LAYER_BACKEND, "timed out after %d s", 2);
  mlxd_status_set_op(&st, "all_sum", 17);
  mlxd_status_set_self(&st, 3);
  mlxd_status_set_peer(&st, 1, NULL);
  mlxd_status_render(&st, "mpi");
  T_REQUIREF(strcmp(st.msg, "[mpi] all_sum #17 on rank 3: timed out after 2 s") == 0, "'%s'",
             st.msg);
  mlxd_status_render(&st, "mpi"); /* idempotent */
  T_REQUIREF(strcmp(st.msg, "[mpi] all_sum #17 on rank 3: timed out after 2 s") == 0, "'%s'",
             st.msg);
  mlxd_fail_at(&st, MLXD_EUNAVAIL, MLXD_LAYER_BACKEND, "no launcher");
  mlxd_status_set_self(&st, 0);
  mlxd_status_render(&st, "mpi");
  T_REQUIREF(strcmp(st.msg, "[mpi] rank 0: no launcher") == 0, "'%s'", st.msg);
  mlxd_fail_at(&st, MLXD_EREMOTE, MLXD_LAYER_TCP, "lost connection to rank %d", 2);
  mlxd_status_set_op(&st, "recv", 4);
  mlxd_status_render(&st, "ring"); /* no rank: the ring's form is unchanged */
  T_REQUIREF(strcmp(st.msg, "[ring] recv #4: lost connection to rank 2") == 0, "'%s'", st.msg);
  mlxd_status_reset(&st);
  T_ASSERT(!st.has_self && st.self == 0);
}

/* many threads report while another keeps replacing the handler */
static atomic_int g_installed, g_destroyed, g_stop;
static void counting_handler(const char* msg, void* data) {
  (void)msg;
  atomic_fetch_add((atomic_int*)data, 1);
}
static void counting_dtor(void* data) {
  atomic_fetch_add(&g_destroyed, 1);
  free(data);
}
static void* reporter(void* p) {
  (void)p;
  while (!atomic_load(&g_stop)) mlxd_error("[test] concurrent report");
  return NULL;
}
static void test_concurrent(void) {
  pthread_t th[3];
  for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, reporter, NULL);
  for (int i = 0; i < 2000; i++) {
    atomic_int* c = malloc(sizeof *c);
    atomic_init(c, 0);
    mlx_set_error_handler(counting_handler, c, counting_dtor);
    atomic_fetch_add(&g_installed, 1);
  }
  atomic_store(&g_stop, 1);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  t_capture_errors(); /* replaces the last counting handler */
  T_EQ_INT(atomic_load(&g_destroyed), atomic_load(&g_installed));
}

int main(void) {
  test_render();
  child_result r = run_child(child_bad_array);
  expect_exit_255(&r, "error on the main thread");
  T_ASSERT(strstr(r.err, "[array]") && strstr(r.err, "NULL"));
  T_ASSERT(strstr(r.out, "still running") == NULL);

  r = run_child(child_restored_default);
  expect_exit_255(&r, "restored default handler");
  T_ASSERT(strstr(r.err, "[device]"));

  r = run_child(child_error_on_worker);
  expect_exit_255(&r, "error on a stream worker");
  T_ASSERT(strstr(r.err, "[array]") && strstr(r.err, "-5"));

  r = run_child(child_error_with_queued_work);
  expect_exit_255(&r, "error with queued work");
  T_ASSERT(strstr(r.err, "[device]"));
  T_ASSERT(strstr(r.out, "queued task ran")); /* drained at exit */

  r = run_child(child_exit_with_pending_wait);
  expect_exit_255(&r, "_mlx_error");
  T_ASSERT(strstr(r.err, "MLX error: [test] reported with _mlx_error"));
  T_ASSERT(strstr(r.out, "queued task ran"));

  test_custom_handlers();
  test_concurrent();
  printf("test_error: OK\n");
  return 0;
}

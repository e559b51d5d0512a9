/* The operation record (core/oprec.h): the note in each state, the dump's
 * heading and lines, the history keeping only the last MLXD_OPREC_N ops,
 * a handle that fell out being ignored, the failure dump once per cascade,
 * and writers on several threads while a reader dumps. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/oprec.h"
#include "mlx/c/array.h"
#include "testutil.h"
#include "util/status.h"

/* The dump of the record on a pipe, as a string (caller frees). */
static char* dump_text(const char* why) {
  int p[2];
  T_REQUIRE(pipe(p) == 0);
  mlxd_oprec_dump(p[1], why);
  close(p[1]);
  size_t cap = 1 << 16, n = 0;
  char* buf = malloc(cap);
  T_REQUIRE(buf);
  ssize_t r;
  while ((r = read(p[0], buf + n, cap - 1 - n)) > 0) n += (size_t)r;
  close(p[0]);
  buf[n] = 0;
  return buf;
}

static int count_lines(const char* s) {
  int n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

static void test_states(void) {
  char note[64];
  mlxd_oprec_note(note, sizeof note);
  T_CHECKF(strcmp(note, "idle") == 0, "note before any op: '%s'", note);
  char* d = dump_text("signal");
  T_CHECKF(strstr(d, "[mlxdist] record rank -1/0 pid ") == d, "%s", d);
  T_CHECKF(strstr(d, "(signal): idle; colls 0\n"), "%s", d);
  T_CHECKF(strstr(d, "(no operation yet)"), "%s", d);
  free(d);

  uint64_t a = mlxd_oprec_begin(1, 1, 4, 0, "all_sum", MLX_FLOAT32, 16, -1);
  T_CHECK(a != 0);
  mlxd_oprec_note(note, sizeof note);
  T_CHECKF(strncmp(note, "queued all_sum #0 for ", 22) == 0, "'%s'", note);
  mlxd_oprec_running(a);
  mlxd_oprec_note(note, sizeof note);
  T_CHECKF(strncmp(note, "in all_sum #0 for ", 18) == 0, "'%s'", note);
  uint64_t b = mlxd_oprec_begin(1, 1, 4, 0, "recv", MLX_INT32, 8, 2);
  mlxd_oprec_end(a, 0);
  mlxd_oprec_note(note, sizeof note); /* the oldest op not done: the recv */
  T_CHECKF(strncmp(note, "queued recv #0 for ", 19) == 0, "'%s'", note);
  mlxd_oprec_running(b);
  d = dump_text("warning");
  T_CHECKF(strstr(d, "[mlxdist] record rank 1/4 pid ") == d, "%s", d);
  T_CHECKF(strstr(d, "(warning): in recv #0 for "), "%s", d);
  T_CHECKF(strstr(d, "; colls 1\n"), "%s", d);
  T_CHECKF(strstr(d, "\n[mlxdist]   all_sum #0 float32 16 B: done after "), "%s", d);
  T_CHECKF(strstr(d, "\n[mlxdist]   recv #0 from 2 int32 8 B: running for "), "%s", d);
  T_CHECK_EQ(count_lines(d), 3);
  free(d);
  mlxd_oprec_end(b, MLXD_EREMOTE);
  mlxd_oprec_note(note, sizeof note);
  T_CHECKF(strncmp(note, "failed recv #0, ", 16) == 0 && strstr(note, " s ago"), "'%s'", note);
  d = dump_text("failure");
  T_CHECKF(strstr(d, "recv #0 from 2 int32 8 B: failed: peer lost after "), "%s", d);
  free(d);

  /* A larger group becomes the heading's identity. */
  uint64_t c = mlxd_oprec_begin(2, 5, 8, 3, "all_gather", MLX_FLOAT16, 64, -1);
  mlxd_oprec_end(c, 0);
  mlxd_oprec_note(note, sizeof note);
  T_CHECKF(strncmp(note, "after all_gather #3, ", 21) == 0, "'%s'", note);
  d = dump_text("signal");
  T_CHECKF(strstr(d, "record rank 5/8 ") && strstr(d, "; colls 4\n"), "%s", d);
  T_CHECKF(strstr(d, "\n[mlxdist]   g2 all_gather #3 float16 64 B: done"), "%s", d);
  T_CHECKF(strstr(d, "\n[mlxdist]   g1 all_sum #0"), "%s", d);
  free(d);
}

static void test_wraps(void) {
  uint64_t first = mlxd_oprec_begin(2, 5, 8, 4, "all_max", MLX_FLOAT32, 4, -1);
  for (int i = 0; i < 3 * MLXD_OPREC_N; i++) {
    uint64_t h = mlxd_oprec_begin(2, 5, 8, (uint64_t)(5 + i), "all_sum", MLX_FLOAT32, 4, -1);
    mlxd_oprec_running(h);
    mlxd_oprec_end(h, 0);
  }
  /* first fell out of the history: its calls are ignored */
  mlxd_oprec_running(first);
  mlxd_oprec_end(first, MLXD_ETIMEDOUT);
  char* d = dump_text("signal");
  T_CHECK_EQ(count_lines(d), 1 + MLXD_OPREC_N);
  T_CHECKF(!strstr(d, "all_max") && !strstr(d, "failed"), "%s", d);
  char last[64];
  snprintf(last, sizeof last, "all_sum #%d ", 5 + 3 * MLXD_OPREC_N - 1);
  T_CHECKF(strstr(d, last), "no '%s' in %s", last, d);
  free(d);
}

/* The failure dump goes to stderr: redirect it to a pipe and count blocks. */
static int failure_blocks(void (*fn)(void)) {
  int p[2];
  T_REQUIRE(pipe(p) == 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(p[1], 2);
  close(p[1]);
  fn();
  dup2(saved, 2);
  close(saved);
  char buf[1 << 15];
  size_t n = 0;
  ssize_t r;
  while ((r = read(p[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
  close(p[0]);
  buf[n] = 0;
  int k = 0;
  for (const char* s = buf; (s = strstr(s, "(failure):")); s++) k++;
  return k;
}

static void cascade(void) {
  for (int i = 0; i < 5; i++) mlxd_oprec_dump_failure(); /* five pending ops fail */
  uint64_t h = mlxd_oprec_begin(2, 5, 8, 100, "all_sum", MLX_FLOAT32, 4, -1);
  mlxd_oprec_end(h, 0); /* a success ends the cascade */
  mlxd_oprec_dump_failure();
  mlxd_oprec_dump_failure();
}

static void test_once_per_cascade(void) { T_CHECK_EQ(failure_blocks(cascade), 2); }

static void* writer(void* arg) {
  int id = (int)(long)arg;
  for (int i = 0; i < 20000; i++) {
    uint64_t h = mlxd_oprec_begin((unsigned)(3 + id), 0, 2, (uint64_t)i, "send", MLX_UINT8, 1, 1);
    mlxd_oprec_running(h);
    mlxd_oprec_end(h, i % 7 == 0 ? MLXD_EABORTED : 0);
  }
  return NULL;
}

static void test_threads(void) {
  pthread_t th[3];
  for (long i = 0; i < 3; i++) T_REQUIRE(pthread_create(&th[i], NULL, writer, (void*)i) == 0);
  for (int k = 0; k < 200; k++) {
    char* d = dump_text("signal");
    T_CHECKF(count_lines(d) >= 1 && count_lines(d) <= 1 + MLXD_OPREC_N, "%s", d);
    free(d);
    char note[64];
    mlxd_oprec_note(note, sizeof note);
    T_CHECK(note[0] != 0);
  }
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
}

int main(void) {
  test_states();
  test_wraps();
  test_once_per_cascade();
  test_threads();
  return t_exit_status();
}

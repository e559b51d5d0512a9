/* Mismatched calls are errors, not hangs or garbage (issue 11, item 2):
 * two ranks of a real ring group (MLX_RANK + MLX_HOSTFILE written here, as
 * MLX's launcher does; MLXDIST_TRANSPORT from the environment picks tcp or
 * shm) make different calls for the same operation, and every rank must
 * fail at eval, within a few seconds although MLXDIST_TIMEOUT is 30 s, with
 * one message that shows both calls, lower rank first, prefixed by its own
 * op: "[ring] all_sum #1: mismatched calls: rank 0 called all_sum(float32 x
 * 10), rank 1 called all_gather(int32 x 20)". Its group then stays failed:
 * the next all_sum fails fast with the same text.
 * MISMATCH_BACKEND=jaccl: the jaccl backend instead (a device matrix naming
 * rxe0 in every off-diagonal cell, the coordinator on 127.0.0.1; messages
 * "[jaccl] ..."): inside the soft-RoCE VM (tests/vm/vm_jaccl_fail.sh).
 *
 *   test_mismatch count        all_sum of 10 vs 11 float32
 *   test_mismatch count_large  all_sum of 1M vs 1M+1 float32 (used to wait out the timeout)
 *   test_mismatch dtype        all_sum float32 vs int32, same bytes
 *   test_mismatch reduce_op    all_sum vs all_max
 *   test_mismatch op_kind      all_sum vs all_gather
 *   test_mismatch sendrecv     send 10 float32, recv 11: the receiver fails at the recv, the
 *                              sender at the recv or (its send had completed) at its next op
 *   test_mismatch a2a_gather   all_to_all of 20 int32 vs all_gather of 10: the same 40-byte
 *                              message each way
 *   test_mismatch a2a_parts    all_to_all of 10 vs 12 float32 (parts of 5 and 6)
 *   test_mismatch match N      matching calls of every op still work (no false positive):
 *                              all_sum/max/min, all_gather, sum_scatter, all_to_all, send/recv
 *                              both ways, split, sizes from 0 to 1M+1, either rank late
 *
 * Expected texts are written out here, not built with the library's code. */
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "mlx/c/mlx.h"
#include "ranks.h"
#include "testutil.h"

#define LIMIT_S 10.0 /* every failure must come this fast (MLXDIST_TIMEOUT is 30 s) */

static char g_hostfile[300]; /* ring: the hostfile; jaccl: the device matrix */
static char g_coord[64];     /* jaccl: the coordinator's address */
static const char* g_backend = "ring";

static void write_hostfile(int n) {
  char dir[] = "/tmp/mlxdist-mismatch-XXXXXX";
  T_REQUIRE(mkdtemp(dir) != NULL);
  bool jaccl = strcmp(g_backend, "jaccl") == 0;
  snprintf(g_hostfile, sizeof g_hostfile, "%s/%s.json", dir, jaccl ? "devices" : "hostfile");
  FILE* f = fopen(g_hostfile, "w");
  T_REQUIRE(f);
  fputs("[", f);
  for (int r = 0; r < n; r++) {
    if (!jaccl) {
      fprintf(f, "%s[\"127.0.0.1:%d\"]", r ? ", " : "", t_free_port());
      continue;
    }
    fputs(r ? ", [" : "[", f);
    for (int j = 0; j < n; j++) {
      if (j) fputs(", ", f);
      fputs(j == r ? "null" : "\"rxe0\"", f);
    }
    fputs("]", f);
  }
  fputs("]\n", f);
  fclose(f);
  if (jaccl) snprintf(g_coord, sizeof g_coord, "127.0.0.1:%d", t_free_port());
}

static mlx_distributed_group join(int rank) {
  char rs[16];
  snprintf(rs, sizeof rs, "%d", rank);
  setenv("MLX_RANK", rs, 1);
  if (strcmp(g_backend, "jaccl") == 0) {
    setenv("MLX_IBV_DEVICES", g_hostfile, 1);
    setenv("MLX_JACCL_COORDINATOR", g_coord, 1);
    /* each rank its own emulated host: the pair talks over verbs, the path these
     * cases are for (on one host the router would pick shared memory) */
    char host[32];
    snprintf(host, sizeof host, "vmhost%d", rank);
    setenv("MLXDIST_HOST_ID", host, 1);
  } else {
    setenv("MLX_HOSTFILE", g_hostfile, 1);
  }
  unsetenv("MLX_WORLD_SIZE");
  setenv("MLXDIST_TIMEOUT", "30", 1);
  t_capture_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, g_backend) != 0)
    T_FAIL("init %s: %s", g_backend, t_last_error());
  return g;
}

/* ---- one call ---- */

typedef enum { K_SUM, K_MAX, K_MIN, K_GATHER, K_SCATTER, K_A2A, K_SEND, K_RECV } kind;

typedef struct call {
  kind k;
  mlx_dtype dtype;
  int count;
  const char* name; /* the op's name in the message prefix */
} call;

/* An array of n elements of dtype, element i = base + i (as that type). */
static mlx_array make_array(mlx_dtype dtype, int n, int base) {
  int shape[1] = {n};
  if (dtype == MLX_FLOAT32) {
    float* v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) v[i] = (float)(base + i % 1000);
    mlx_array a = mlx_array_new_data(v, shape, 1, MLX_FLOAT32);
    free(v);
    return a;
  }
  int32_t* v = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  for (int i = 0; i < n; i++) v[i] = base + i % 1000;
  mlx_array a = mlx_array_new_data(v, shape, 1, MLX_INT32);
  free(v);
  return a;
}

/* Queue c on g (peer for send/recv); 0 or the queuing error. */
static int queue_call(mlx_array* res, const call* c, mlx_distributed_group g, int peer, int base) {
  mlx_stream s = mlx_stream_new();
  if (c->k == K_RECV) {
    int shape[1] = {c->count};
    return mlx_distributed_recv(res, shape, 1, c->dtype, peer, g, s);
  }
  mlx_array x = make_array(c->dtype, c->count, base);
  int rc;
  switch (c->k) {
    case K_SUM: rc = mlx_distributed_all_sum(res, x, g, s); break;
    case K_MAX: rc = mlx_distributed_all_max(res, x, g, s); break;
    case K_MIN: rc = mlx_distributed_all_min(res, x, g, s); break;
    case K_GATHER: rc = mlx_distributed_all_gather(res, x, g, s); break;
    case K_SCATTER: rc = mlx_distributed_sum_scatter(res, x, g, s); break;
    case K_A2A: rc = mlx_distributed_all_to_all(res, x, g, s); break;
    default: rc = mlx_distributed_send(res, x, peer, g, s); break;
  }
  mlx_array_free(x);
  return rc;
}

/* ---- the mismatch cases ---- */

typedef struct mm_case {
  const char* name;
  call c[2];        /* rank 0's call, rank 1's call */
  const char* text; /* what both ranks' messages contain */
} mm_case;

static const mm_case g_cases[] = {
    {"count",
     {{K_SUM, MLX_FLOAT32, 10, "all_sum"}, {K_SUM, MLX_FLOAT32, 11, "all_sum"}},
     "mismatched calls: rank 0 called all_sum(float32 x 10), rank 1 called all_sum(float32 x 11)"},
    {"count_large",
     {{K_SUM, MLX_FLOAT32, 1 << 20, "all_sum"}, {K_SUM, MLX_FLOAT32, (1 << 20) + 1, "all_sum"}},
     "mismatched calls: rank 0 called all_sum(float32 x 1048576), rank 1 called "
     "all_sum(float32 x 1048577)"},
    {"dtype",
     {{K_SUM, MLX_FLOAT32, 10, "all_sum"}, {K_SUM, MLX_INT32, 10, "all_sum"}},
     "mismatched calls: rank 0 called all_sum(float32 x 10), rank 1 called all_sum(int32 x 10)"},
    {"reduce_op",
     {{K_SUM, MLX_FLOAT32, 10, "all_sum"}, {K_MAX, MLX_FLOAT32, 10, "all_max"}},
     "mismatched calls: rank 0 called all_sum(float32 x 10), rank 1 called all_max(float32 x 10)"},
    {"op_kind",
     {{K_SUM, MLX_FLOAT32, 10, "all_sum"}, {K_GATHER, MLX_INT32, 20, "all_gather"}},
     "mismatched calls: rank 0 called all_sum(float32 x 10), rank 1 called "
     "all_gather(int32 x 20)"},
    {"sendrecv",
     {{K_SEND, MLX_FLOAT32, 10, "send"}, {K_RECV, MLX_FLOAT32, 11, "recv"}},
     "mismatched calls: rank 0 called send(float32 x 10, 40 bytes), rank 1 called "
     "recv(float32 x 11, 44 bytes)"},
    {"a2a_gather",
     {{K_A2A, MLX_INT32, 20, "all_to_all"}, {K_GATHER, MLX_INT32, 10, "all_gather"}},
     "mismatched calls: rank 0 called all_to_all(int32 x 20), rank 1 called "
     "all_gather(int32 x 10)"},
    {"a2a_parts",
     {{K_A2A, MLX_FLOAT32, 10, "all_to_all"}, {K_A2A, MLX_FLOAT32, 12, "all_to_all"}},
     "mismatched calls: rank 0 called all_to_all(float32 x 10), rank 1 called "
     "all_to_all(float32 x 12)"},
    /* no bytes on one rank: its empty messages carry its call (algo/all_to_all.c
     * mlxd_algo_empty), so neither rank waits for the other until the op timeout */
    {"count_zero",
     {{K_SUM, MLX_FLOAT32, 0, "all_sum"}, {K_SUM, MLX_FLOAT32, 10, "all_sum"}},
     "mismatched calls: rank 0 called all_sum(float32 x 0), rank 1 called all_sum(float32 x 10)"},
    {"a2a_zero",
     {{K_A2A, MLX_FLOAT32, 0, "all_to_all"}, {K_A2A, MLX_FLOAT32, 10, "all_to_all"}},
     "mismatched calls: rank 0 called all_to_all(float32 x 0), rank 1 called "
     "all_to_all(float32 x 10)"},
};

/* Eval res; it must fail within LIMIT_S of t0 with a message that starts
 * with `prefix` and has `text` (when not NULL). Returns whether the text
 * was there. */
static bool expect_failure(mlx_array res, double t0, const char* prefix, const char* text,
                           const char* what) {
  t_clear_errors();
  int rc = mlx_array_eval(res);
  double el = t_now() - t0;
  T_CHECKF(rc != 0, "%s: eval succeeded", what);
  T_CHECKF(el < LIMIT_S, "%s: took %.1f s to fail (limit %.0f s)", what, el, LIMIT_S);
  if (rc == 0) return false;
  const char* msg = t_last_error();
  fprintf(stderr, "rank %d: %s failed after %.2f s: %s\n", t_rank(), what, el, msg);
  T_CHECKF(strstr(msg, prefix) == msg, "%s: message does not start with \"%s\": %s", what, prefix,
           msg);
  bool has = !text || strstr(msg, text) != NULL;
  T_CHECKF(has, "%s: message lacks \"%s\": %s", what, text, msg);
  return has;
}

static int mismatch_rank(int rank, int size, const char* session, void* arg) {
  (void)size;
  (void)session;
  const mm_case* mc = arg;
  mlx_distributed_group g = join(rank);
  int peer = 1 - rank;
  /* a matching all_sum first (#0): the group works and both ranks are in it */
  mlx_array warm = mlx_array_new();
  T_EQ_INT(queue_call(&warm, &(call){K_SUM, MLX_INT32, 4, "all_sum"}, g, peer, rank), 0);
  if (mlx_array_eval(warm) != 0) T_FAIL("warm-up all_sum failed: %s", t_last_error());
  mlx_array_free(warm);

  const call* me = &mc->c[rank];
  bool p2p = me->k == K_SEND || me->k == K_RECV;
  int seq = p2p ? 0 : 1; /* p2p numbers per peer and direction, from 0 */
  char prefix[64], what[96];
  snprintf(prefix, sizeof prefix, "[%s] %s #%d: ", g_backend, me->name, seq);
  snprintf(what, sizeof what, "%s %s", mc->name, me->name);
  double t0 = t_now();
  mlx_array res = mlx_array_new();
  T_EQ_INT(queue_call(&res, me, g, peer, rank), 0);
  bool has_text = true, late = false;
  if (me->k == K_SEND) {
    /* The send may complete before the receiver compares (it only hands the
     * bytes over): then it is the next op that fails. */
    t_clear_errors();
    if (mlx_array_eval(res) == 0) {
      late = true;
    } else {
      T_CHECKF(t_now() - t0 < LIMIT_S, "%s: took %.1f s to fail", what, t_now() - t0);
      const char* msg = t_last_error();
      T_CHECKF(strstr(msg, prefix) == msg, "%s: message is %s", what, msg);
      has_text = strstr(msg, mc->text) != NULL;
      T_CHECKF(has_text, "%s: message lacks \"%s\": %s", what, mc->text, msg);
    }
  } else {
    has_text = expect_failure(res, t0, prefix, mc->text, what);
  }
  mlx_array_free(res);

  /* The group stays failed: the next op fails fast, with the same text. */
  mlx_array next = mlx_array_new();
  double t1 = t_now();
  T_EQ_INT(queue_call(&next, &(call){K_SUM, MLX_INT32, 4, "all_sum"}, g, peer, rank), 0);
  snprintf(prefix, sizeof prefix, "[%s] all_sum #%d: ", g_backend, seq + 1);
  snprintf(what, sizeof what, "%s: the all_sum after it%s", mc->name,
           late ? " (the sender's first failure)" : "");
  bool next_text = expect_failure(next, late ? t1 : t0, prefix, mc->text, what);
  mlx_array_free(next);
  mlx_distributed_group_free(g);
  if (late) has_text = next_text;
  return has_text ? 0 : 1;
}

/* ---- matching calls: no false positive ---- */

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* The sum over ranks of element i of make_array(..., base = rank). */
static void check_reduce(mlx_array res, kind k, mlx_dtype dtype, int n, int size, const char* w) {
  if (mlx_array_eval(res) != 0) {
    T_CHECKF(false, "%s: eval failed: %s", w, t_last_error());
    return;
  }
  T_CHECK_EQ(mlx_array_size(res), (size_t)n);
  for (int i = 0; i < n; i++) {
    double e = k == K_SUM   ? (double)size * (i % 1000) + (double)size * (size - 1) / 2
               : k == K_MAX ? (double)(size - 1 + i % 1000)
                            : (double)(i % 1000);
    double got = dtype == MLX_FLOAT32 ? (double)mlx_array_data_float32(res)[i]
                                      : (double)mlx_array_data_int32(res)[i];
    if (got != e) {
      T_CHECKF(false, "%s: element %d is %g, expected %g", w, i, got, e);
      return;
    }
  }
}

static int match_rank(int rank, int size, const char* session, void* arg) {
  (void)session;
  (void)arg;
  mlx_distributed_group g = join(rank);
  static const int counts[] = {0, 1, 10, 1000, 300001, (1 << 20) + 1};
  static const kind reds[] = {K_SUM, K_MAX, K_MIN};
  static const mlx_dtype dts[] = {MLX_FLOAT32, MLX_INT32};
  int round = 0;
  for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
    int n = counts[ci];
    for (size_t ri = 0; ri < 3; ri++)
      for (size_t di = 0; di < 2; di++) {
        /* either rank late, so messages arrive before and after their receives */
        if (rank == round % size) sleep_s(0.02);
        round++;
        char w[96];
        snprintf(w, sizeof w, "reduce %zu dtype %zu of %d", ri, di, n);
        mlx_array res = mlx_array_new();
        call c = {reds[ri], dts[di], n, ""};
        T_EQ_INT(queue_call(&res, &c, g, -1, rank), 0);
        check_reduce(res, reds[ri], dts[di], n, size, w);
        mlx_array_free(res);
      }
    /* all_gather: rank r's block is make_array(n, base r) */
    mlx_array res = mlx_array_new();
    T_EQ_INT(queue_call(&res, &(call){K_GATHER, MLX_INT32, n, ""}, g, -1, rank), 0);
    if (mlx_array_eval(res) != 0) {
      T_CHECKF(false, "all_gather of %d: %s", n, t_last_error());
    } else {
      T_CHECK_EQ(mlx_array_size(res), (size_t)n * (size_t)size);
      const int32_t* d = mlx_array_data_int32(res);
      for (int r = 0; r < size && d; r++)
        for (int i = 0; i < n; i++)
          if (d[(size_t)r * (size_t)n + (size_t)i] != r + i % 1000) {
            T_CHECKF(false, "all_gather of %d: rank %d's element %d", n, r, i);
            r = size;
            break;
          }
    }
    mlx_array_free(res);
    /* sum_scatter of n * size elements */
    if (n <= 300001) {
      res = mlx_array_new();
      int m = n * size;
      T_EQ_INT(queue_call(&res, &(call){K_SCATTER, MLX_FLOAT32, m, ""}, g, -1, rank), 0);
      if (mlx_array_eval(res) != 0) {
        T_CHECKF(false, "sum_scatter of %d: %s", m, t_last_error());
      } else {
        const float* d = mlx_array_data_float32(res);
        for (int i = 0; i < n && d; i++) {
          int j = rank * n + i;
          float e = (float)(size * (j % 1000)) + (float)(size * (size - 1) / 2);
          if (d[i] != e) {
            T_CHECKF(false, "sum_scatter of %d: element %d is %g, expected %g", m, i, d[i], e);
            break;
          }
        }
      }
      mlx_array_free(res);
    }
    /* all_to_all of n * size elements: part j of rank r's input (make_array, base r) goes
     * to rank j, so part r' of this rank's output is rank r''s elements [rank * n, +n) */
    if (n <= 300001) {
      res = mlx_array_new();
      int m = n * size;
      T_EQ_INT(queue_call(&res, &(call){K_A2A, MLX_INT32, m, ""}, g, -1, rank), 0);
      if (mlx_array_eval(res) != 0) {
        T_CHECKF(false, "all_to_all of %d: %s", m, t_last_error());
      } else {
        T_CHECK_EQ(mlx_array_size(res), (size_t)m);
        const int32_t* d = mlx_array_data_int32(res);
        for (int r = 0; r < size && d; r++)
          for (int i = 0; i < n; i++)
            if (d[(size_t)r * (size_t)n + (size_t)i] != r + (rank * n + i) % 1000) {
              T_CHECKF(false, "all_to_all of %d: element %d of rank %d's part", m, i, r);
              r = size;
              break;
            }
      }
      mlx_array_free(res);
    }
    /* send / recv with every other rank, both ways (sends first) */
    mlx_array sent[T_MAX_RANKS], got[T_MAX_RANKS];
    for (int p = 0; p < size; p++) {
      if (p == rank) continue;
      sent[p] = mlx_array_new();
      T_EQ_INT(queue_call(&sent[p], &(call){K_SEND, MLX_INT32, n, ""}, g, p, rank * 100 + p), 0);
    }
    for (int p = 0; p < size; p++) {
      if (p == rank) continue;
      got[p] = mlx_array_new();
      T_EQ_INT(queue_call(&got[p], &(call){K_RECV, MLX_INT32, n, ""}, g, p, 0), 0);
    }
    for (int p = 0; p < size; p++) {
      if (p == rank) continue;
      T_CHECKF(mlx_array_eval(sent[p]) == 0, "send of %d to %d: %s", n, p, t_last_error());
      if (mlx_array_eval(got[p]) != 0) {
        T_CHECKF(false, "recv of %d from %d: %s", n, p, t_last_error());
      } else {
        const int32_t* d = mlx_array_data_int32(got[p]);
        for (int i = 0; i < n && d; i++)
          if (d[i] != p * 100 + rank + i % 1000) {
            T_CHECKF(false, "recv of %d from %d: element %d is %d", n, p, i, d[i]);
            break;
          }
      }
      mlx_array_free(sent[p]);
      mlx_array_free(got[p]);
    }
  }
  /* split (an all_gather of records, signed as split) and a collective in the child */
  mlx_distributed_group h = mlx_distributed_group_new();
  if (mlx_distributed_group_split(&h, g, 0, size - rank) != 0) T_FAIL("split: %s", t_last_error());
  T_EQ_INT(mlx_distributed_group_size(h), size);
  mlx_array res = mlx_array_new();
  T_EQ_INT(queue_call(&res, &(call){K_SUM, MLX_INT32, 1000, ""}, h, -1, size - 1 - rank), 0);
  check_reduce(res, K_SUM, MLX_INT32, 1000, size, "all_sum in the split group");
  mlx_array_free(res);
  mlx_distributed_group_free(h);
  mlx_distributed_group_free(g);
  T_EXPECT_NO_ERROR();
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_mismatch <case> | match <ranks>\n");
    return 2;
  }
  const char* bk = getenv("MISMATCH_BACKEND");
  if (bk && strcmp(bk, "jaccl") == 0) g_backend = "jaccl";
  const char* tp = strcmp(g_backend, "jaccl") == 0 ? "jaccl (verbs)" : getenv("MLXDIST_TRANSPORT");
  t_ranks_opts opts = {.timeout_s = 120, .grace_s = 30, .what = argv[1]};
  if (strcmp(argv[1], "match") == 0) {
    int n = argc > 2 ? atoi(argv[2]) : 2;
    T_REQUIRE(n >= 2 && n <= 4);
    write_hostfile(n);
    printf("matching calls on %d ranks over %s\n", n, tp ? tp : "auto");
    int bad = t_run_ranks(n, match_rank, NULL, &opts, NULL);
    unlink(g_hostfile);
    return bad ? 1 : 0;
  }
  for (size_t i = 0; i < sizeof g_cases / sizeof g_cases[0]; i++) {
    if (strcmp(argv[1], g_cases[i].name) != 0) continue;
    write_hostfile(2);
    printf("%s over %s\n", g_cases[i].name, tp ? tp : "auto");
    t_rank_exit ex[2];
    t_run_ranks(2, mismatch_rank, (void*)&g_cases[i], &opts, ex);
    unlink(g_hostfile);
    int named = 0, bad = 0;
    for (int r = 0; r < 2; r++) {
      if (ex[r].code == 0)
        named++;
      else
        bad++;
    }
    if (!bad && named == 0) fprintf(stderr, "no rank named the mismatched calls\n");
    return bad || named == 0 ? 1 : 0;
  }
  fprintf(stderr, "unknown case %s\n", argv[1]);
  return 2;
}

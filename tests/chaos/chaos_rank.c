/* Rank program of the chaos soak (scripts/chaos.sh starts one per rank with MLX_RANK and
 * MLX_HOSTFILE; public API only).
 *
 *   chaos_rank SEED PER_HOST MAX_BYTES DEADLINE_MS READY_DIR
 *
 * Runs one operation per iteration until one fails: all_sum, all_max, all_min, all_gather,
 * sum_scatter, a send/recv exchange (every rank sends to rank + s and receives from rank - s)
 * or a split followed by an all_sum on the child group. The op, the dtype (all 14) and the
 * size (1 element to MAX_BYTES bytes, log-uniform) come from (SEED, iteration), so every rank
 * makes the same calls; element j of rank r's input comes from (SEED, iteration, r, j), so
 * every rank computes the exact expected result of every op and compares it bit for bit.
 * Every value is an integer or a multiple of 1/4 small enough that sums are exact in its
 * dtype whatever the order of the additions (up to 8 ranks).
 *
 * Output (stdout, one line each, for the driver):
 *   CHAOS READY rank R pid P              after init (and READY_DIR/ready.R appears)
 *   CHAOS PROGRESS rank R it I t_ms T     every 2 s while ops complete
 *   CHAOS WRONG rank R it I op O ...      a result that differs (the run goes on)
 *   CHAOS FAIL rank R it I op O t_ms T: MESSAGE   the first failed call or eval; exit 3
 *   CHAOS SUMMARY rank R ops N wrong W bytes B all_sum .. split ..   at exit
 * T is CLOCK_REALTIME in ms (the driver compares it with the time of its kill). Exit 4: no
 * failure by DEADLINE_MS (realtime ms; the driver kills a rank well before). */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mlx/c/mlx.h"
#include "testutil.h"

enum { OP_SUM, OP_MAX, OP_MIN, OP_GATHER, OP_SCATTER, OP_SENDRECV, OP_SPLIT, OP_COUNT };
static const char* const k_op_names[OP_COUNT] = {"all_sum",     "all_max",  "all_min", "all_gather",
                                                 "sum_scatter", "sendrecv", "split"};
static const char* const k_dtype_names[14] = {"bool",     "uint8",    "uint16",  "uint32",
                                              "uint64",   "int8",     "int16",   "int32",
                                              "int64",    "float16",  "float32", "float64",
                                              "bfloat16", "complex64"};

static uint64_t g_seed;
static int g_rank, g_size;
static long g_ops[OP_COUNT], g_wrong, g_it;
static uint64_t g_bytes;

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* The key of rank r's data at iteration it (r = -1: the iteration's own choices). */
static uint64_t data_key(long it, int r) {
  return mix64(g_seed * 0x2545f4914f6cdd1dULL ^
               mix64((uint64_t)it * 0x100000001b3ULL + (uint64_t)(r + 1)));
}

/* One element's value: integers (i) or exact doubles (re, im). */
typedef struct {
  int64_t i;
  double re, im;
} val_t;

static bool is_float(mlx_dtype d) {
  return d == MLX_FLOAT16 || d == MLX_FLOAT32 || d == MLX_FLOAT64 || d == MLX_BFLOAT16 ||
         d == MLX_COMPLEX64;
}

static val_t gen(mlx_dtype d, uint64_t key, size_t j) {
  uint64_t u = mix64(key ^ ((uint64_t)j * 0xd6e8feb86659fd93ULL));
  val_t v = {0, 0, 0};
  switch (d) {
    case MLX_BOOL: v.i = (int64_t)(u & 1); break;
    case MLX_UINT8: v.i = (int64_t)(u % 32); break;
    case MLX_UINT16: v.i = (int64_t)(u % 4096); break;
    case MLX_UINT32: v.i = (int64_t)(u % (1u << 28)); break;
    case MLX_UINT64: v.i = (int64_t)(u >> 4); break;
    case MLX_INT8: v.i = (int64_t)(u % 31) - 15; break;
    case MLX_INT16: v.i = (int64_t)(u % 8191) - 4095; break;
    case MLX_INT32: v.i = (int64_t)(u % (1u << 28)) - (1 << 27); break;
    case MLX_INT64: v.i = (int64_t)(u >> 5) - ((int64_t)1 << 58); break;
    case MLX_FLOAT16:
    case MLX_BFLOAT16: v.re = (double)((int64_t)(u % 33) - 16); break;
    case MLX_FLOAT32: v.re = (double)((int64_t)(u % 2049) - 1024) * 0.25; break;
    case MLX_FLOAT64: v.re = (double)((int64_t)(u >> 15) - ((int64_t)1 << 48)) * 0.5; break;
    case MLX_COMPLEX64:
      v.re = (double)((int64_t)(u % 2049) - 1024) * 0.25;
      v.im = (double)((int64_t)((u >> 32) % 2049) - 1024) * 0.25;
      break;
  }
  return v;
}

/* a op b; bool's sum is "or" (its values are 0 and 1, so max), complex compares the real
 * part, then the imaginary one. */
static val_t combine(int op, mlx_dtype d, val_t a, val_t b) {
  if (op == OP_SUM && d != MLX_BOOL) {
    a.i += b.i;
    a.re += b.re;
    a.im += b.im;
    return a;
  }
  bool b_greater;
  if (!is_float(d))
    b_greater = b.i > a.i;
  else if (d == MLX_COMPLEX64)
    b_greater = b.re > a.re || (b.re == a.re && b.im > a.im);
  else
    b_greater = b.re > a.re;
  bool want_max = op != OP_MIN;
  bool equal = !is_float(d) ? b.i == a.i : (b.re == a.re && b.im == a.im);
  if (equal) return a;
  return (b_greater == want_max) ? b : a;
}

/* IEEE half bits of a small integer (|k| <= 2048: exact). */
static uint16_t half_bits(double x) {
  if (x == 0) return 0;
  uint16_t sign = x < 0 ? 0x8000 : 0;
  uint32_t k = (uint32_t)fabs(x);
  int e = 31 - __builtin_clz(k);
  uint32_t mant = (k << (10 - e)) & 0x3ff;
  return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)mant);
}

static void store(mlx_dtype d, unsigned char* buf, size_t j, val_t v) {
  size_t w = mlx_dtype_size(d);
  unsigned char* p = buf + j * w;
  switch (d) {
    case MLX_BOOL:
    case MLX_UINT8:
    case MLX_INT8: {
      uint8_t x = (uint8_t)v.i;
      memcpy(p, &x, 1);
      break;
    }
    case MLX_UINT16:
    case MLX_INT16: {
      uint16_t x = (uint16_t)v.i;
      memcpy(p, &x, 2);
      break;
    }
    case MLX_UINT32:
    case MLX_INT32: {
      uint32_t x = (uint32_t)v.i;
      memcpy(p, &x, 4);
      break;
    }
    case MLX_UINT64:
    case MLX_INT64: {
      uint64_t x = (uint64_t)v.i;
      memcpy(p, &x, 8);
      break;
    }
    case MLX_FLOAT16: {
      uint16_t x = half_bits(v.re);
      memcpy(p, &x, 2);
      break;
    }
    case MLX_BFLOAT16: {
      float f = (float)v.re; /* a small integer: its upper 16 bits are exact */
      uint32_t b;
      memcpy(&b, &f, 4);
      uint16_t x = (uint16_t)(b >> 16);
      memcpy(p, &x, 2);
      break;
    }
    case MLX_FLOAT32: {
      float f = (float)v.re;
      memcpy(p, &f, 4);
      break;
    }
    case MLX_FLOAT64: memcpy(p, &v.re, 8); break;
    case MLX_COMPLEX64: {
      float f[2] = {(float)v.re, (float)v.im};
      memcpy(p, f, 8);
      break;
    }
  }
}

/* Rank r's input: n elements from index 'first' of its data at iteration it. */
static unsigned char* make_input(mlx_dtype d, long it, int r, size_t n) {
  unsigned char* buf = malloc(n * mlx_dtype_size(d) + 1);
  T_ASSERT(buf);
  uint64_t key = data_key(it, r);
  for (size_t j = 0; j < n; j++) store(d, buf, j, gen(d, key, j));
  return buf;
}

/* Expected reduction over 'members' ranks (their parent ranks) of elements [first, first+n). */
static unsigned char* make_reduced(int op, mlx_dtype d, long it, const int* members, int m,
                                   size_t first, size_t n) {
  unsigned char* buf = malloc(n * mlx_dtype_size(d) + 1);
  T_ASSERT(buf);
  uint64_t keys[64];
  for (int k = 0; k < m; k++) keys[k] = data_key(it, members[k]);
  for (size_t j = 0; j < n; j++) {
    val_t acc = gen(d, keys[0], first + j);
    for (int k = 1; k < m; k++) acc = combine(op, d, acc, gen(d, keys[k], first + j));
    store(d, buf, j, acc);
  }
  return buf;
}

static const void* result_bytes(mlx_array y) {
  switch (mlx_array_itemsize(y)) {
    case 1: return mlx_array_data_uint8(y);
    case 2: return mlx_array_data_uint16(y);
    case 4: return mlx_array_data_uint32(y);
    case 8: return mlx_array_data_uint64(y);
    default: return NULL;
  }
}

static void fail(int op, const char* what) {
  printf("CHAOS FAIL rank %d it %ld op %s t_ms %" PRId64 ": %s%s\n", g_rank, g_it, k_op_names[op],
         now_ms(), what, t_last_error());
}

static void summary(void) {
  long total = 0;
  for (int k = 0; k < OP_COUNT; k++) total += g_ops[k];
  printf("CHAOS SUMMARY rank %d ops %ld wrong %ld bytes %" PRIu64, g_rank, total, g_wrong, g_bytes);
  for (int k = 0; k < OP_COUNT; k++) printf(" %s %ld", k_op_names[k], g_ops[k]);
  printf("\n");
  fflush(stdout);
}

/* Compares result y (n elements of dtype d, expected bytes 'want'); prints the first
 * differing element. Returns false when y is wrong. */
static bool check(int op, mlx_dtype d, mlx_array y, size_t n, const unsigned char* want,
                  const char* what) {
  size_t w = mlx_dtype_size(d);
  const unsigned char* got = result_bytes(y);
  bool ok = got && mlx_array_dtype(y) == d && (size_t)mlx_array_size(y) == n &&
            memcmp(got, want, n * w) == 0;
  if (ok) return true;
  g_wrong++;
  if (g_wrong <= 20) {
    size_t j = 0;
    if (got && (size_t)mlx_array_size(y) == n)
      while (j < n && memcmp(got + j * w, want + j * w, w) == 0) j++;
    uint64_t gv = 0, wv = 0;
    if (got && j < n) {
      memcpy(&gv, got + j * w, w);
      memcpy(&wv, want + j * w, w);
    }
    printf(
        "CHAOS WRONG rank %d it %ld op %s %s dtype %s n %zu (result dtype %d size %zu): first "
        "difference at element %zu: got bits 0x%" PRIx64 ", expected 0x%" PRIx64 "\n",
        g_rank, g_it, k_op_names[op], what, k_dtype_names[d], n, (int)mlx_array_dtype(y),
        (size_t)mlx_array_size(y), j, gv, wv);
  }
  return false;
}

static mlx_array new_input(mlx_dtype d, long it, int r, size_t n) {
  unsigned char* in = make_input(d, it, r, n);
  int shape[1] = {(int)n};
  mlx_array x = mlx_array_new_data(in, shape, 1, d);
  free(in);
  return x;
}

/* Eval y; on failure print the error and exit 3 (the group is gone). */
static void eval_or_exit(int op, mlx_array y, const char* what) {
  if (mlx_array_eval(y) != 0) {
    fail(op, what);
    summary();
    _exit(3);
  }
}

static void call_or_exit(int op, int rc, const char* what) {
  if (rc != 0) {
    fail(op, what);
    summary();
    _exit(3);
  }
}

static void reduce_op(mlx_distributed_group g, int op, mlx_dtype d, size_t n, long it) {
  mlx_array x = new_input(d, it, g_rank, n), y = mlx_array_new();
  int rc = op == OP_SUM   ? mlx_distributed_all_sum(&y, x, g, mlx_stream_new())
           : op == OP_MAX ? mlx_distributed_all_max(&y, x, g, mlx_stream_new())
                          : mlx_distributed_all_min(&y, x, g, mlx_stream_new());
  call_or_exit(op, rc, "");
  eval_or_exit(op, y, "");
  int all[64];
  for (int r = 0; r < g_size; r++) all[r] = r;
  unsigned char* want = make_reduced(op, d, it, all, g_size, 0, n);
  check(op, d, y, n, want, "");
  free(want);
  mlx_array_free(x);
  mlx_array_free(y);
}

static void gather_op(mlx_distributed_group g, mlx_dtype d, size_t n, long it) {
  mlx_array x = new_input(d, it, g_rank, n), y = mlx_array_new();
  call_or_exit(OP_GATHER, mlx_distributed_all_gather(&y, x, g, mlx_stream_new()), "");
  eval_or_exit(OP_GATHER, y, "");
  size_t w = mlx_dtype_size(d);
  unsigned char* want = malloc(n * w * (size_t)g_size + 1);
  T_ASSERT(want);
  for (int r = 0; r < g_size; r++) {
    unsigned char* part = make_input(d, it, r, n);
    memcpy(want + (size_t)r * n * w, part, n * w);
    free(part);
  }
  check(OP_GATHER, d, y, n * (size_t)g_size, want, "");
  free(want);
  mlx_array_free(x);
  mlx_array_free(y);
}

static void scatter_op(mlx_distributed_group g, mlx_dtype d, size_t m, long it) {
  size_t n = m * (size_t)g_size;
  mlx_array x = new_input(d, it, g_rank, n), y = mlx_array_new();
  call_or_exit(OP_SCATTER, mlx_distributed_sum_scatter(&y, x, g, mlx_stream_new()), "");
  eval_or_exit(OP_SCATTER, y, "");
  int all[64];
  for (int r = 0; r < g_size; r++) all[r] = r;
  unsigned char* want = make_reduced(OP_SUM, d, it, all, g_size, (size_t)g_rank * m, m);
  check(OP_SCATTER, d, y, m, want, "");
  free(want);
  mlx_array_free(x);
  mlx_array_free(y);
}

static void sendrecv_op(mlx_distributed_group g, mlx_dtype d, size_t n, long it, int shift) {
  int dst = (g_rank + shift) % g_size, src = (g_rank - shift + g_size) % g_size;
  mlx_array x = new_input(d, it, g_rank, n), s = mlx_array_new(), r = mlx_array_new();
  int shape[1] = {(int)n};
  call_or_exit(OP_SENDRECV, mlx_distributed_send(&s, x, dst, g, mlx_stream_new()), "send: ");
  call_or_exit(OP_SENDRECV, mlx_distributed_recv(&r, shape, 1, d, src, g, mlx_stream_new()),
               "recv: ");
  mlx_vector_array both = mlx_vector_array_new();
  mlx_vector_array_append_value(both, s);
  mlx_vector_array_append_value(both, r);
  if (mlx_eval(both) != 0) {
    fail(OP_SENDRECV, "eval: ");
    summary();
    _exit(3);
  }
  mlx_vector_array_free(both);
  unsigned char* want = make_input(d, it, src, n);
  char what[64];
  snprintf(what, sizeof what, "from rank %d", src);
  check(OP_SENDRECV, d, r, n, want, what);
  free(want);
  mlx_array_free(x);
  mlx_array_free(s);
  mlx_array_free(r);
}

/* split by one of three rules, then a checked all_sum on the child */
static void split_op(mlx_distributed_group g, int per_host, uint64_t choice, size_t n, long it) {
  int rule = (int)(choice % 3);
  bool reverse = (choice >> 8) & 1;
  int color_of[64], members[64], m = 0;
  for (int r = 0; r < g_size; r++) color_of[r] = rule == 0 ? r / per_host : rule == 1 ? r % 2 : 0;
  /* the child's ranks in key order: parent order, or reversed */
  for (int k = 0; k < g_size; k++) {
    int r = reverse ? g_size - 1 - k : k;
    if (color_of[r] == color_of[g_rank]) members[m++] = r;
  }
  int my_child_rank = -1;
  for (int k = 0; k < m; k++)
    if (members[k] == g_rank) my_child_rank = k;
  mlx_distributed_group c = mlx_distributed_group_new();
  call_or_exit(OP_SPLIT,
               mlx_distributed_group_split(&c, g, color_of[g_rank], reverse ? g_size - g_rank : -1),
               "split: ");
  int cr = -1, cs = -1;
  if (mlx_distributed_group_get_rank(&cr, c) != 0 || mlx_distributed_group_get_size(&cs, c) != 0 ||
      cr != my_child_rank || cs != m) {
    g_wrong++;
    printf(
        "CHAOS WRONG rank %d it %ld op split rule %d reverse %d: child rank %d size %d, "
        "expected %d of %d\n",
        g_rank, g_it, rule, (int)reverse, cr, cs, my_child_rank, m);
  }
  mlx_array x = new_input(MLX_INT32, it, g_rank, n), y = mlx_array_new();
  call_or_exit(OP_SPLIT, mlx_distributed_all_sum(&y, x, c, mlx_stream_new()), "child all_sum: ");
  eval_or_exit(OP_SPLIT, y, "child all_sum: ");
  unsigned char* want = make_reduced(OP_SUM, MLX_INT32, it, members, m, 0, n);
  check(OP_SPLIT, MLX_INT32, y, n, want, "child all_sum");
  free(want);
  mlx_array_free(x);
  mlx_array_free(y);
  mlx_distributed_group_free(c);
}

int main(int argc, char** argv) {
  t_capture_errors();
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc != 6) {
    fprintf(stderr, "usage: chaos_rank SEED PER_HOST MAX_BYTES DEADLINE_MS READY_DIR\n");
    return 2;
  }
  g_seed = strtoull(argv[1], NULL, 10);
  int per_host = atoi(argv[2]);
  double max_bytes = strtod(argv[3], NULL);
  int64_t deadline = strtoll(argv[4], NULL, 10);
  const char* dir = argv[5];
  if (per_host < 1 || max_bytes < 1) {
    fprintf(stderr, "chaos_rank: PER_HOST and MAX_BYTES must be >= 1\n");
    return 2;
  }
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) {
    printf("CHAOS FAIL rank -1 it -1 op init t_ms %" PRId64 ": %s\n", now_ms(), t_last_error());
    return 3;
  }
  g_rank = mlx_distributed_group_rank(g);
  g_size = mlx_distributed_group_size(g);
  if (g_size < 2 || g_size > 64) {
    fprintf(stderr, "chaos_rank: group size %d (expected 2 to 64)\n", g_size);
    return 2;
  }
  char tmp[512], path[512];
  snprintf(tmp, sizeof tmp, "%s/.ready.%d", dir, g_rank);
  snprintf(path, sizeof path, "%s/ready.%d", dir, g_rank);
  FILE* f = fopen(tmp, "w");
  T_ASSERT(f);
  fprintf(f, "%d\n", (int)getpid());
  T_ASSERT(fclose(f) == 0);
  T_ASSERT(rename(tmp, path) == 0);
  printf("CHAOS READY rank %d pid %d\n", g_rank, (int)getpid());

  int64_t last_progress = now_ms();
  for (g_it = 0;; g_it++) {
    int64_t t = now_ms();
    if (t >= deadline) {
      printf("CHAOS NOFAIL rank %d: no operation failed by the deadline\n", g_rank);
      summary();
      _exit(4);
    }
    if (t - last_progress >= 2000) {
      printf("CHAOS PROGRESS rank %d it %ld t_ms %" PRId64 "\n", g_rank, g_it, t);
      last_progress = t;
    }
    uint64_t c = data_key(g_it, -1);
    int pick = (int)(c % 100);
    int op = pick < 28   ? OP_SUM
             : pick < 38 ? OP_MAX
             : pick < 46 ? OP_MIN
             : pick < 61 ? OP_GATHER
             : pick < 76 ? OP_SCATTER
             : pick < 97 ? OP_SENDRECV
                         : OP_SPLIT;
    mlx_dtype d = (mlx_dtype)((c >> 8) % 14);
    /* log-uniform size in bytes, 1 .. max_bytes; at least one element */
    double frac = (double)((c >> 16) % 1000000) / 1000000.0;
    double nbytes = exp(frac * log(max_bytes));
    size_t w = mlx_dtype_size(d);
    size_t n = (size_t)(nbytes / (double)w);
    if (n < 1) n = 1;
    switch (op) {
      case OP_SUM:
      case OP_MAX:
      case OP_MIN: reduce_op(g, op, d, n, g_it); break;
      case OP_GATHER: gather_op(g, d, n / (size_t)g_size + 1, g_it); break;
      case OP_SCATTER: scatter_op(g, d, n / (size_t)g_size + 1, g_it); break;
      case OP_SENDRECV:
        sendrecv_op(g, d, n, g_it, 1 + (int)((c >> 40) % (uint64_t)(g_size - 1)));
        break;
      case OP_SPLIT: split_op(g, per_host, c >> 40, n / 4 + 1, g_it); break;
    }
    g_ops[op]++;
    g_bytes += n * w;
  }
}

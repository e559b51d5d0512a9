/* Tests of the TCP transport and the collective algorithms with real
 * processes and real sockets: the parent forks N ranks connected by
 * socketpair(AF_UNIX) or TCP loopback connections (nconn per pair), each
 * rank builds an mlxd_tcp_transport and runs a scenario; the parent checks
 * every rank's exit status under a time limit.
 *
 * usage: test_transport coll N unix|tcp NCONN [quick]   every algorithm x op x dtype x count
 *        test_transport p2p N unix|tcp NCONN    send/recv, tags, sizes, mismatch
 *        test_transport threads N unix|tcp NCONN  concurrent collectives from threads
 *        test_transport peer_exit | stall | large
 *        test_transport bench [MiB] [iters] [nconn] [ranks]   (TCP loopback)
 *
 * References are computed here, independently of the library's kernels:
 * inputs are generated deterministically from (rank, index), reduced in
 * rank order with scalar code in this file. Float inputs are small
 * integers, so every summation order gives the same bits and results are
 * compared exactly; a second pass with arbitrary floats checks that all
 * ranks get bit-identical results (checksums exchanged by all_gather) and
 * that they are close to the reference. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "algo/algo.h"
#include "algo/algo_impl.h"
#include "testutil.h"
#include "transport/tcp.h"
#include "util/clock.h"

/* Sanitizer builds (and "quick" runs) run every case too, but the
 * 1M-element count only for float32 (quick: bool, float32 and complex64);
 * the other dtypes' large cases take the same code paths as their small
 * ones. The 300 MB case shrinks to 64 MB under sanitizers. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define T_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define T_SANITIZED 1
#endif
#endif
#ifndef T_SANITIZED
#define T_SANITIZED 0
#endif

/* ------------------------------------------------------------ harness */

typedef int (*rank_fn)(mlxd_transport* t, void* arg);

static int connected_pair(bool tcp, int out[2]) {
  if (!tcp) return socketpair(AF_UNIX, SOCK_STREAM, 0, out);
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  if (ls < 0) return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  if (bind(ls, (struct sockaddr*)&a, sizeof a) || listen(ls, 1) ||
      getsockname(ls, (struct sockaddr*)&a, &al)) {
    close(ls);
    return -1;
  }
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0 || connect(c, (struct sockaddr*)&a, sizeof a)) {
    close(ls);
    if (c >= 0) close(c);
    return -1;
  }
  int s = accept(ls, NULL, NULL);
  close(ls);
  if (s < 0) {
    close(c);
    return -1;
  }
  out[0] = c;
  out[1] = s;
  return 0;
}

/* Fork n ranks; each runs fn and exits with its return value. Returns 0 if
 * every rank exited 0 within limit_s; codes[r] gets each exit status
 * (-signal if killed). */
static int run_ranks(int n, int nconn, bool tcp, rank_fn fn, void* arg, double limit_s,
                     int* codes) {
  if (n < 2 || n > 16 || nconn < 1 || nconn > 8) T_FAIL("run_ranks: bad n=%d nconn=%d", n, nconn);
  int total = n * n * nconn;
  int* fds = malloc(sizeof(int) * (size_t)total); /* fds[(r * n + p) * nconn + c] */
  T_ASSERT(fds);
  for (int i = 0; i < total; i++) fds[i] = -1;
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      for (int c = 0; c < nconn; c++) {
        int pr[2];
        if (connected_pair(tcp, pr)) T_FAIL("cannot connect sockets: %s", strerror(errno));
        fds[(i * n + j) * nconn + c] = pr[0];
        fds[(j * n + i) * nconn + c] = pr[1];
      }
  fflush(NULL);
  pid_t* pids = calloc((size_t)n, sizeof *pids);
  T_ASSERT(pids);
  for (int r = 0; r < n; r++) {
    pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
      for (int i = 0; i < total; i++)
        if (i / (n * nconn) != r && fds[i] >= 0) close(fds[i]);
      int mine[16 * 8];
      memcpy(mine, fds + (size_t)r * n * nconn, sizeof(int) * (size_t)(n * nconn));
      free(fds);
      free(pids);
      mlxd_status st;
      mlxd_status_clear(&st);
      mlxd_transport* t = mlxd_tcp_transport_new(r, n, mine, nconn, &st);
      if (!t) {
        fprintf(stderr, "rank %d: %s\n", r, st.msg);
        _exit(2);
      }
      int rc = fn(t, arg);
      t->ops->destroy(t);
      exit(rc); /* exit, not _exit: lets a sanitizer turn a report into a failure */
    }
    pids[r] = pid;
  }
  for (int i = 0; i < total; i++)
    if (fds[i] >= 0) close(fds[i]);
  free(fds);
  double deadline = mlxd_now() + limit_s;
  int left = n, bad = 0;
  for (int r = 0; r < n; r++) codes[r] = 999;
  while (left > 0) {
    int status;
    pid_t w = waitpid(-1, &status, WNOHANG);
    if (w > 0) {
      for (int r = 0; r < n; r++)
        if (pids[r] == w) {
          codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
          if (codes[r] != 0) bad = 1;
          left--;
        }
      continue;
    }
    if (mlxd_now() > deadline) {
      fprintf(stderr, "ranks still running after %.0f s: killing them\n", limit_s);
      for (int r = 0; r < n; r++)
        if (codes[r] == 999) kill(pids[r], SIGKILL);
      bad = 1;
      deadline = mlxd_now() + 1e9;
    }
    usleep(2000);
  }
  free(pids);
  return bad;
}

static void expect_all_ok(int n, int nconn, bool tcp, rank_fn fn, void* arg, double limit) {
  int codes[16];
  int bad = run_ranks(n, nconn, tcp, fn, arg, limit, codes);
  for (int r = 0; r < n; r++)
    if (codes[r] != 0) fprintf(stderr, "rank %d exited with %d\n", r, codes[r]);
  T_EQ_INT(bad, 0);
}

#define R_CHECK(cond, ...)                                                    \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "%s:%d: rank check failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                           \
      fprintf(stderr, "\n");                                                  \
      return 1;                                                               \
    }                                                                         \
  } while (0)

/* ------------------------------------------- reference values and ops */

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static size_t esize(int dt) {
  static const size_t sz[] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 2, 8};
  return sz[dt];
}
static const char* dt_name(int dt) {
  static const char* nm[] = {"bool",  "uint8", "uint16",  "uint32",   "uint64",
                             "int8",  "int16", "int32",   "int64",    "float16",
                             "float32", "float64", "bfloat16", "complex64"};
  return nm[dt];
}
static const char* op_name(int op) { return op == 0 ? "sum" : op == 1 ? "max" : "min"; }

/* float <-> 16-bit conversions written here (round to nearest even). */
static float t_f16_to_f32(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  float v;
  if (e == 0) v = ldexpf((float)m, -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = ldexpf((float)(m | 1024), e - 25);
  return s ? -v : v;
}
static uint16_t t_f32_to_f16(float f) {
  /* exact search-free rounding via double arithmetic */
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  double a = fabs((double)f);
  if (isnan(f)) return 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00;
  if (a < ldexp(1.0, -14)) { /* subnormal: units of 2^-24 */
    double q = nearbyint(a * ldexp(1.0, 24));
    return (uint16_t)(sign | (uint16_t)q);
  }
  int e;
  double fr = frexp(a, &e);          /* a = fr * 2^e, fr in [0.5, 1) */
  double q = nearbyint(fr * 2048.0); /* 11 significant bits */
  if (q >= 2048.0) {
    q /= 2;
    e++;
  }
  int be = e - 1 + 15;
  if (be >= 31) return sign | 0x7c00;
  return (uint16_t)(sign | (uint16_t)(be << 10) | ((uint16_t)q & 1023));
}
static float t_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t t_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if (isnan(f)) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

/* Value of element i of rank p's input (exact: small integers). */
static void gen(int dt, int p, size_t i, bool exact, uint64_t salt, void* dst) {
  uint64_t h = mix(((uint64_t)p << 48) ^ (uint64_t)i ^ (salt << 40) ^ ((uint64_t)dt << 56));
  float small = (float)((int)(h % 7) - 3);
  float any = (float)((double)(h >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  float v = exact ? small : any;
  switch (dt) {
    case 0: *(uint8_t*)dst = (uint8_t)(h & 1); break;
    case 1: case 5: *(uint8_t*)dst = (uint8_t)h; break;
    case 2: case 6: { uint16_t x = (uint16_t)h; memcpy(dst, &x, 2); break; }
    case 3: case 7: { uint32_t x = (uint32_t)h; memcpy(dst, &x, 4); break; }
    case 4: case 8: memcpy(dst, &h, 8); break;
    case 9: { uint16_t x = t_f32_to_f16(v); memcpy(dst, &x, 2); break; }
    case 10: memcpy(dst, &v, 4); break;
    case 11: { double d = exact ? (double)small : (double)(h >> 11) * 0x1.0p-53 - 0.5; memcpy(dst, &d, 8); break; }
    case 12: { uint16_t x = t_f32_to_bf16(v); memcpy(dst, &x, 2); break; }
    case 13: {
      float c[2] = {v, exact ? (float)((int)((h >> 20) % 5) - 2) : (float)((h >> 40) & 0xffff) / 65536.0f};
      memcpy(dst, c, 8);
      break;
    }
  }
}

static void fill(int dt, int p, size_t count, size_t first, bool exact, uint64_t salt,
                 char* buf) {
  size_t es = esize(dt);
  for (size_t i = 0; i < count; i++) gen(dt, p, first + i, exact, salt, buf + i * es);
}

/* acc = acc OP x for one element, computed in this file. */
static void ref_op1(int op, int dt, void* acc, const void* x) {
#define INTOP(T)                                                             \
  do {                                                                       \
    T a, b;                                                                  \
    memcpy(&a, acc, sizeof a);                                               \
    memcpy(&b, x, sizeof b);                                                 \
    T r = op == 0 ? (T)(a + b) : op == 1 ? (a > b ? a : b) : (a < b ? a : b); \
    memcpy(acc, &r, sizeof r);                                               \
  } while (0)
#define SINTOP(T, U)                                                         \
  do {                                                                       \
    T a, b;                                                                  \
    memcpy(&a, acc, sizeof a);                                               \
    memcpy(&b, x, sizeof b);                                                 \
    T r = op == 0 ? (T)((U)a + (U)b) : op == 1 ? (a > b ? a : b) : (a < b ? a : b); \
    memcpy(acc, &r, sizeof r);                                               \
  } while (0)
  switch (dt) {
    case 0: {
      uint8_t a = *(uint8_t*)acc != 0, b = *(const uint8_t*)x != 0;
      *(uint8_t*)acc = (uint8_t)(op == 2 ? (a && b) : (a || b));
      break;
    }
    case 1: INTOP(uint8_t); break;
    case 2: INTOP(uint16_t); break;
    case 3: INTOP(uint32_t); break;
    case 4: INTOP(uint64_t); break;
    case 5: SINTOP(int8_t, uint8_t); break;
    case 6: SINTOP(int16_t, uint16_t); break;
    case 7: SINTOP(int32_t, uint32_t); break;
    case 8: SINTOP(int64_t, uint64_t); break;
    case 10: INTOP(float); break;
    case 11: INTOP(double); break;
    case 9: case 12: {
      uint16_t ha, hb;
      memcpy(&ha, acc, 2);
      memcpy(&hb, x, 2);
      float a = dt == 9 ? t_f16_to_f32(ha) : t_bf16_to_f32(ha);
      float b = dt == 9 ? t_f16_to_f32(hb) : t_bf16_to_f32(hb);
      float r = op == 0 ? a + b : op == 1 ? (a > b ? a : b) : (a < b ? a : b);
      uint16_t hr = dt == 9 ? t_f32_to_f16(r) : t_f32_to_bf16(r);
      memcpy(acc, &hr, 2);
      break;
    }
    case 13: {
      float a[2], b[2];
      memcpy(a, acc, 8);
      memcpy(b, x, 8);
      if (op == 0) {
        a[0] += b[0];
        a[1] += b[1];
      } else {
        bool b_greater = b[0] > a[0] || (b[0] == a[0] && b[1] > a[1]);
        bool b_less = b[0] < a[0] || (b[0] == a[0] && b[1] < a[1]);
        if ((op == 1 && b_greater) || (op == 2 && b_less)) memcpy(a, b, 8);
      }
      memcpy(acc, a, 8);
      break;
    }
  }
#undef INTOP
#undef SINTOP
}

/* Reference reduction of elements [first, first+count) over n ranks. */
static void reference(int op, int dt, int n, size_t first, size_t count, bool exact,
                      uint64_t salt, char* out) {
  size_t es = esize(dt);
  unsigned char x[8];
  for (size_t i = 0; i < count; i++) {
    char* acc = out + i * es;
    gen(dt, 0, first + i, exact, salt, acc);
    for (int p = 1; p < n; p++) {
      gen(dt, p, first + i, exact, salt, x);
      ref_op1(op, dt, acc, x);
    }
  }
}

/* The same from inputs generated once: ins[p] holds rank p's elements. */
static void reference_from(int op, int dt, int n, size_t count, char* const* ins, char* out) {
  size_t es = esize(dt);
  if (count) memcpy(out, ins[0], count * es);
  for (int p = 1; p < n; p++)
    for (size_t i = 0; i < count; i++) ref_op1(op, dt, out + i * es, ins[p] + i * es);
}

static double as_double(int dt, const void* p, int part) {
  uint16_t h;
  float f[2];
  double d;
  switch (dt) {
    case 9: memcpy(&h, p, 2); return t_f16_to_f32(h);
    case 12: memcpy(&h, p, 2); return t_bf16_to_f32(h);
    case 10: memcpy(f, p, 4); return f[0];
    case 11: memcpy(&d, p, 8); return d;
    case 13: memcpy(f, p, 8); return f[part];
    default: return 0;
  }
}
static bool is_float(int dt) { return dt >= 9; }

static uint64_t checksum(const void* buf, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char* p = buf;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* ------------------------------------------------ collectives scenario */

enum { A_AUTO, A_ONESHOT, A_RING1, A_RING2, A_COUNT };
static const char* algo_name(int a) {
  static const char* nm[] = {"auto", "direct", "ring", "ring-bidir"};
  return nm[a];
}

static uint64_t g_seq = 1;

static int do_all_reduce(mlxd_transport* t, int a, const void* in, void* out, size_t count,
                         int dt, int op, mlxd_status* st) {
  uint64_t seq = g_seq++;
  switch (a) {
    case A_AUTO: return mlxd_algo_all_reduce(t, seq, in, out, count, dt, op, st);
    case A_ONESHOT: return mlxd_algo_all_reduce_oneshot(t, seq, in, out, count, dt, op, st);
    case A_RING1: return mlxd_algo_all_reduce_ring(t, seq, in, out, count, dt, op, 0, st);
    default: return mlxd_algo_all_reduce_ring(t, seq, in, out, count, dt, op, 1, st);
  }
}
static int do_reduce_scatter(mlxd_transport* t, int a, const void* in, void* out, size_t count,
                             int dt, int op, mlxd_status* st) {
  uint64_t seq = g_seq++;
  switch (a) {
    case A_AUTO: return mlxd_algo_reduce_scatter(t, seq, in, out, count, dt, op, st);
    case A_ONESHOT:
      return mlxd_algo_reduce_scatter_direct(t, seq, in, out, count, dt, op, st);
    case A_RING1:
      return mlxd_algo_reduce_scatter_ring(t, seq, in, out, count, dt, op, 0, st);
    default: return mlxd_algo_reduce_scatter_ring(t, seq, in, out, count, dt, op, 1, st);
  }
}
static int do_all_gather(mlxd_transport* t, int a, const void* in, void* out, size_t nbytes,
                         mlxd_status* st) {
  uint64_t seq = g_seq++;
  switch (a) {
    case A_AUTO: return mlxd_algo_all_gather(t, seq, in, out, nbytes, st);
    case A_ONESHOT: return mlxd_algo_all_gather_direct(t, seq, in, out, nbytes, st);
    case A_RING1: return mlxd_algo_all_gather_ring(t, seq, in, out, nbytes, 0, st);
    default: return mlxd_algo_all_gather_ring(t, seq, in, out, nbytes, 1, st);
  }
}

static const size_t k_counts[] = {0, 1, 7, 10, 1024, 1024 * 1024 + 3};
#define N_COUNTS (sizeof k_counts / sizeof k_counts[0])

/* Every rank checks its result against the reference; they also agree on
 * the checksum of the result (all_gather of checksums). */
static int agree(mlxd_transport* t, const void* buf, size_t nbytes, const char* what) {
  int n = t->size;
  uint64_t mine = checksum(buf, nbytes), all[16];
  mlxd_status st;
  int rc = mlxd_algo_all_gather_direct(t, g_seq++, &mine, all, sizeof mine, &st);
  R_CHECK(rc == 0, "%s: checksum all_gather failed: %s", what, st.msg);
  for (int p = 0; p < n; p++)
    R_CHECK(all[p] == mine, "%s: rank %d's result differs from rank %d's", what, p, t->rank);
  return 0;
}

static int first_diff(const char* a, const char* b, size_t n, size_t es) {
  if (n == 0 || memcmp(a, b, n * es) == 0) return -1;
  for (size_t i = 0; i < n; i++)
    if (memcmp(a + i * es, b + i * es, es) != 0) return (int)i;
  return -1;
}

static int coll_rank(mlxd_transport* t, void* arg) {
  bool quick = arg != NULL;
  int n = t->size, r = t->rank;
  size_t maxc = k_counts[N_COUNTS - 1];
  /* buffers big enough for reduce_scatter inputs (n * count) of 8-byte types */
  char* in = malloc(maxc * 8 * (size_t)n + 64);
  char* out = malloc(maxc * 8 * (size_t)n + 64);
  char* ref = malloc(maxc * 8 * (size_t)n + 64);
  char* ins[16]; /* every rank's input (or the slice a reference needs) */
  for (int p = 0; p < n; p++) {
    ins[p] = malloc(maxc * 8 + 64);
    R_CHECK(ins[p], "out of memory");
  }
  R_CHECK(in && out && ref, "out of memory");
  mlxd_status st;
  char what[160];
  for (int dt = 0; dt < 14; dt++) {
    size_t es = esize(dt);
    for (size_t ci = 0; ci < N_COUNTS; ci++) {
      size_t count = k_counts[ci];
      bool big = count > 4096;
      if (big && T_SANITIZED && dt != 10) continue;
      if (big && quick && dt != 10 && dt != 0 && dt != 13) continue;
      /* ---- all_reduce ---- */
      fill(dt, r, count, 0, true, 1, in);
      for (int p = 0; p < n; p++) fill(dt, p, count, 0, true, 1, ins[p]);
      for (int op = 0; op < 3; op++) {
        reference_from(op, dt, n, count, ins, ref);
        for (int a = 0; a < A_COUNT; a++) {
          if (big && a == A_ONESHOT && dt % 3 != 0) continue; /* keep the run short */
          snprintf(what, sizeof what, "all_reduce %s %s %s count %zu", algo_name(a),
                   op_name(op), dt_name(dt), count);
          memset(out, 0xA5, count * es + 1);
          int rc = do_all_reduce(t, a, in, out, count, dt, op, &st);
          R_CHECK(rc == 0, "%s: %s", what, st.msg);
          int d = first_diff(out, ref, count, es);
          R_CHECK(d < 0, "%s: element %d differs from the reference", what, d);
          R_CHECK((unsigned char)out[count * es] == 0xA5, "%s: wrote past the end", what);
        }
      }
      /* in place, one op per dtype */
      if (!big || dt % 4 == 0) {
        int op = dt % 3;
        reference_from(op, dt, n, count, ins, ref);
        for (int a = 0; a < A_COUNT; a++) {
          snprintf(what, sizeof what, "in-place all_reduce %s %s %s count %zu", algo_name(a),
                   op_name(op), dt_name(dt), count);
          fill(dt, r, count, 0, true, 1, out);
          int rc = do_all_reduce(t, a, out, out, count, dt, op, &st);
          R_CHECK(rc == 0, "%s: %s", what, st.msg);
          R_CHECK(first_diff(out, ref, count, es) < 0, "%s: differs from the reference", what);
        }
      }
      /* ---- reduce_scatter: input n * count, rank r gets block r ---- */
      fill(dt, r, count * (size_t)n, 0, true, 2, in);
      for (int p = 0; p < n; p++) fill(dt, p, count, (size_t)r * count, true, 2, ins[p]);
      for (int op = 0; op < 3; op++) {
        reference_from(op, dt, n, count, ins, ref);
        for (int a = 0; a < A_COUNT; a++) {
          if (big && a != A_AUTO && (dt + op) % 3 != 0) continue;
          snprintf(what, sizeof what, "reduce_scatter %s %s %s count %zu", algo_name(a),
                   op_name(op), dt_name(dt), count);
          memset(out, 0xA5, count * es + 1);
          int rc = do_reduce_scatter(t, a, in, out, count, dt, op, &st);
          R_CHECK(rc == 0, "%s: %s", what, st.msg);
          int d = first_diff(out, ref, count, es);
          R_CHECK(d < 0, "%s: element %d differs from the reference", what, d);
          R_CHECK((unsigned char)out[count * es] == 0xA5, "%s: wrote past the end", what);
        }
      }
      /* ---- all_gather (bytes of count elements of dt) ---- */
      if (!big || dt == 13 || dt == 0) {
        fill(dt, r, count, 0, true, 3, in);
        for (int p = 0; p < n; p++) fill(dt, p, count, 0, true, 3, ref + (size_t)p * count * es);
        for (int a = 0; a < A_COUNT; a++) {
          snprintf(what, sizeof what, "all_gather %s %s count %zu", algo_name(a), dt_name(dt),
                   count);
          memset(out, 0xA5, (size_t)n * count * es + 1);
          int rc = do_all_gather(t, a, in, out, count * es, &st);
          R_CHECK(rc == 0, "%s: %s", what, st.msg);
          R_CHECK(memcmp(out, ref, (size_t)n * count * es) == 0, "%s: differs", what);
          R_CHECK((unsigned char)out[(size_t)n * count * es] == 0xA5, "%s: wrote past the end",
                  what);
        }
      }
    }
    /* ---- arbitrary floats: bit-identical on every rank, close to the reference ---- */
    if (is_float(dt)) {
      size_t counts[] = {1000, 300000 + 7};
      for (int k = 0; k < (T_SANITIZED ? 1 : 2); k++) {
        size_t count = counts[k];
        fill(dt, r, count, 0, false, 4, in);
        reference(0, dt, n, 0, count, false, 4, ref);
        for (int a = 0; a < A_COUNT; a++) {
          snprintf(what, sizeof what, "inexact all_reduce %s sum %s count %zu", algo_name(a),
                   dt_name(dt), count);
          int rc = do_all_reduce(t, a, in, out, count, dt, 0, &st);
          R_CHECK(rc == 0, "%s: %s", what, st.msg);
          if (agree(t, out, count * es, what)) return 1;
          double tol = (dt == 9 || dt == 12) ? 0.05 : dt == 11 ? 1e-12 : 1e-5;
          for (size_t i = 0; i < count; i++)
            for (int part = 0; part < (dt == 13 ? 2 : 1); part++) {
              double g = as_double(dt, out + i * es, part), e = as_double(dt, ref + i * es, part);
              R_CHECK(fabs(g - e) <= tol * (1 + fabs(e)), "%s: element %zu is %g, expected %g",
                      what, i, g, e);
            }
        }
      }
    }
  }
  /* Bad dtypes, ops and NULL buffers are the front-end's to reject (tests/distributed);
   * the algorithms only assert them. */
  free(in);
  free(out);
  free(ref);
  for (int p = 0; p < n; p++) free(ins[p]);
  return 0;
}

/* ------------------------------------------------ point to point */

static int wait1(mlxd_transport* t, mlxd_req* r, mlxd_status* st) {
  return t->ops->waitall(t, &r, 1, st);
}

static int p2p_rank(mlxd_transport* t, void* arg) {
  (void)arg;
  int r = t->rank;
  mlxd_status st;
  const size_t big = (size_t)64 << 20;
  char* a = malloc(big);
  char* b = malloc(big);
  R_CHECK(a && b, "out of memory");
  /* 64 MiB both ways at once between non-neighbours 0 <-> 2 (both send
   * first) and 1 <-> 3 (1 receives first, 3 sends first). */
  int peer = (r + 2) % 4;
  for (size_t i = 0; i < big; i += 4096) a[i] = (char)(r * 31 + (int)(i >> 12));
  a[big - 1] = (char)r;
  for (int rep = 0; rep < 2; rep++) {
    /* round 0: 0 and 2 both send first, 1 receives first, 3 sends first;
     * round 1: 0 receives first, 2 sends first, 1 sends first, 3 receives first */
    bool send_first = rep == 0 ? r != 1 : (r == 1 || r == 2);
    int rc;
    if (send_first) {
      rc = mlxd_algo_send(t, (uint64_t)rep, a, big, peer, &st);
      R_CHECK(rc == 0, "send: %s", st.msg);
      rc = mlxd_algo_recv(t, (uint64_t)rep, b, big, peer, &st);
      R_CHECK(rc == 0, "recv: %s", st.msg);
    } else {
      rc = mlxd_algo_recv(t, (uint64_t)rep, b, big, peer, &st);
      R_CHECK(rc == 0, "recv: %s", st.msg);
      rc = mlxd_algo_send(t, (uint64_t)rep, a, big, peer, &st);
      R_CHECK(rc == 0, "send: %s", st.msg);
    }
    for (size_t i = 0; i < big; i += 4096)
      R_CHECK(b[i] == (char)(peer * 31 + (int)(i >> 12)), "64 MiB message: byte %zu wrong", i);
    R_CHECK(b[big - 1] == (char)peer, "64 MiB message: last byte wrong");
  }

  /* Messages with different tags received out of order (0 -> 3), with a
   * zero-byte one and one split into fragments. */
  const size_t sizes[4] = {5, 0, (size_t)3 << 20, 70000};
  if (r == 0) {
    mlxd_req* q[4];
    for (int k = 0; k < 4; k++) {
      char* m = a + ((size_t)k << 22);
      for (size_t i = 0; i < sizes[k]; i++) m[i] = (char)(k * 7 + (int)i);
      int rc = t->ops->isend(t, 3, mlxd_tag(MLXD_TAG_P2P, 100 + (uint64_t)k, 0), m, sizes[k],
                             &q[k], &st);
      R_CHECK(rc == 0 && q[k] != NULL, "isend: %s", st.msg);
    }
    R_CHECK(t->ops->waitall(t, q, 4, &st) == 0, "waitall: %s", st.msg);
  } else if (r == 3) {
    int order[4] = {3, 1, 0, 2};
    mlxd_req* q[4] = {NULL, NULL, NULL, NULL};
    usleep(100000); /* let some of them arrive unexpected */
    for (int j = 0; j < 4; j++) {
      int k = order[j];
      int rc = t->ops->irecv(t, 0, mlxd_tag(MLXD_TAG_P2P, 100 + (uint64_t)k, 0),
                             b + ((size_t)k << 22), sizes[k], &q[k], &st);
      R_CHECK(rc == 0, "irecv: %s", st.msg);
      if (j == 1) {
        mlxd_req* one = q[k];
        q[k] = NULL;
        R_CHECK(wait1(t, one, &st) == 0, "wait: %s", st.msg);
      }
    }
    R_CHECK(t->ops->waitall(t, q, 4, &st) == 0, "waitall: %s", st.msg);
    for (int k = 0; k < 4; k++)
      for (size_t i = 0; i < sizes[k]; i++)
        R_CHECK(b[((size_t)k << 22) + i] == (char)(k * 7 + (int)i), "tag %d byte %zu", k, i);
  }

  /* Size mismatch, both orders (0 sends 100 bytes, 3 expects 200), then the
   * transport still works. */
  if (r == 0) {
    R_CHECK(mlxd_algo_send(t, 200, a, 100, 3, &st) == 0, "send: %s", st.msg);
    R_CHECK(mlxd_algo_recv(t, 201, b, 1, 3, &st) == 0, "go: %s", st.msg); /* 3 posted */
    R_CHECK(mlxd_algo_send(t, 202, a, 100, 3, &st) == 0, "send: %s", st.msg);
    for (int i = 0; i < 1000; i++) a[i] = (char)(i * 13);
    R_CHECK(mlxd_algo_send(t, 203, a, 1000, 3, &st) == 0, "send: %s", st.msg);
  } else if (r == 3) {
    usleep(50000);
    int rc = mlxd_algo_recv(t, 200, b, 200, 0, &st);
    R_CHECK(st.layer == MLXD_LAYER_TCP && st.has_peer && st.peer == 0,
            "mismatch fields: layer %d peer %d", st.layer, st.peer);
    mlxd_status_render(&st, "ring");
    R_CHECK(rc == MLXD_EINVAL && strstr(st.msg, "[ring] size mismatch") &&
                strstr(st.msg, "rank 0 sent a 100-byte message") &&
                strstr(st.msg, "expects 200 bytes"),
            "mismatch (unexpected first): rc %d '%s'", rc, st.msg);
    mlxd_req* q = NULL;
    R_CHECK(t->ops->irecv(t, 0, mlxd_tag(MLXD_TAG_P2P, 202, 0), b, 200, &q, &st) == 0, "irecv");
    R_CHECK(mlxd_algo_send(t, 201, a, 1, 0, &st) == 0, "go: %s", st.msg);
    rc = wait1(t, q, &st);
    R_CHECK(st.layer == MLXD_LAYER_TCP && st.peer == 0, "mismatch fields: layer %d", st.layer);
    mlxd_status_render(&st, "ring");
    R_CHECK(rc == MLXD_EINVAL && strstr(st.msg, "size mismatch") && strstr(st.msg, "100-byte"),
            "mismatch (receive first): rc %d '%s'", rc, st.msg);
    memset(b, 0, 1000);
    R_CHECK(mlxd_algo_recv(t, 203, b, 1000, 0, &st) == 0, "after mismatch: %s", st.msg);
    for (int i = 0; i < 1000; i++) R_CHECK(b[i] == (char)(i * 13), "after mismatch: byte %d", i);
  }

  /* Bad peers are the front-end's to reject (test_multirank); the algorithms assert. */

  /* end together so nobody closes its sockets while others still talk */
  uint64_t x = 1, all[4];
  R_CHECK(mlxd_algo_all_gather(t, 999, &x, all, 8, &st) == 0, "final: %s", st.msg);
  free(a);
  free(b);
  return 0;
}

/* ------------------------------------------------ concurrent threads */

typedef struct thr_arg {
  mlxd_transport* t;
  int k;
  int rc;
} thr_arg;

static void* thr_main(void* p) {
  thr_arg* x = p;
  mlxd_transport* t = x->t;
  int n = t->size, r = t->rank;
  size_t count = x->k == 0 ? 100 : x->k == 1 ? 70000 : 600000;
  float* in = malloc(count * 4);
  float* out = malloc(count * 4);
  float* ref = malloc(count * 4);
  x->rc = 1;
  if (!in || !out || !ref) return NULL;
  for (int it = 0; it < 8; it++) {
    uint64_t seq = 1000000 + (uint64_t)it * 16 + (uint64_t)x->k; /* distinct per thread */
    fill(10, r, count, 0, true, (uint64_t)(it + 10 * x->k), (char*)in);
    reference(0, 10, n, 0, count, true, (uint64_t)(it + 10 * x->k), (char*)ref);
    mlxd_status st;
    int rc = x->k == 2 ? mlxd_algo_all_reduce_ring(t, seq, in, out, count, MLX_FLOAT32,
                                                   MLXD_SUM, 1, &st)
                       : mlxd_algo_all_reduce(t, seq, in, out, count, MLX_FLOAT32, MLXD_SUM,
                                              &st);
    if (rc) {
      fprintf(stderr, "thread %d: %s\n", x->k, st.msg);
      return NULL;
    }
    if (memcmp(out, ref, count * 4) != 0) {
      fprintf(stderr, "thread %d iteration %d: wrong result\n", x->k, it);
      return NULL;
    }
  }
  free(in);
  free(out);
  free(ref);
  x->rc = 0;
  return NULL;
}

static int threads_rank(mlxd_transport* t, void* arg) {
  (void)arg;
  pthread_t th[3];
  thr_arg a[3];
  for (int k = 0; k < 3; k++) {
    a[k].t = t;
    a[k].k = k;
    a[k].rc = 1;
    R_CHECK(pthread_create(&th[k], NULL, thr_main, &a[k]) == 0, "pthread_create");
  }
  int bad = 0;
  for (int k = 0; k < 3; k++) {
    pthread_join(th[k], NULL);
    bad |= a[k].rc;
  }
  R_CHECK(!bad, "a thread failed");
  mlxd_status st;
  uint64_t x = 1, all[16];
  R_CHECK(mlxd_algo_all_gather(t, 5, &x, all, 8, &st) == 0, "final: %s", st.msg);
  return 0;
}

/* ------------------------------------------------ failures */

/* The last rank leaves in the middle of a large all_reduce; the others must
 * fail promptly with "lost connection". MLXDIST_TIMEOUT is 30 s here, so a
 * failure that is only noticed by the timeout fails the elapsed-time check. */
static int peer_exit_rank(mlxd_transport* t, void* arg) {
  (void)arg;
  int n = t->size, r = t->rank;
  size_t count = (size_t)16 << 20;
  float* buf = calloc(count, 4);
  R_CHECK(buf, "out of memory");
  mlxd_status st;
  if (r == n - 1) {
    /* put some data on the wire (a message nobody receives), then vanish
     * while the others are inside the all_reduce */
    mlxd_req* q = NULL;
    t->ops->isend(t, 0, mlxd_tag(MLXD_TAG_P2P, 77, 0), buf, 1 << 20, &q, &st);
    usleep(300000);
    _exit(0);
  }
  double t0 = mlxd_now();
  int rc = mlxd_algo_all_reduce(t, 1, buf, buf, count, MLX_FLOAT32, MLXD_SUM, &st);
  double dt = mlxd_now() - t0;
  R_CHECK(rc == MLXD_EREMOTE, "rc %d: %s", rc, st.msg);
  R_CHECK(st.layer == MLXD_LAYER_TCP && st.has_peer && (n > 2 || st.peer == 1),
          "fields: layer %d peer %d", st.layer, st.peer);
  mlxd_status_render(&st, "ring");
  R_CHECK(strstr(st.msg, "[ring] lost connection to rank"), "message: %s", st.msg);
  if (n == 2) R_CHECK(strstr(st.msg, "lost connection to rank 1"), "message: %s", st.msg);
  R_CHECK(dt < 10.0, "took %.1f s to notice", dt);
  /* later operations fail fast with the same message */
  char first[MLXD_MSG_MAX];
  snprintf(first, sizeof first, "%s", st.msg);
  t0 = mlxd_now();
  char tmp[8];
  rc = mlxd_algo_send(t, 5, tmp, 8, r == 0 ? 1 : 0, &st);
  mlxd_status_render(&st, "ring");
  R_CHECK(rc == MLXD_EREMOTE && strcmp(st.msg, first) == 0, "later op: %d %s", rc, st.msg);
  R_CHECK(mlxd_now() - t0 < 1.0, "later op was not fast");
  fprintf(stderr, "rank %d noticed in %.2f s: %s\n", r, dt, st.msg);
  free(buf);
  return 0;
}

/* Rank 1 sleeps instead of taking part; with MLXDIST_TIMEOUT=2 rank 0
 * times out within a few seconds. */
static int stall_rank(mlxd_transport* t, void* arg) {
  (void)arg;
  if (t->rank == 1) {
    sleep(5);
    return 0;
  }
  float buf[1000];
  memset(buf, 0, sizeof buf);
  mlxd_status st;
  double t0 = mlxd_now();
  int rc = mlxd_algo_all_reduce(t, 1, buf, buf, 1000, MLX_FLOAT32, MLXD_SUM, &st);
  double dt = mlxd_now() - t0;
  R_CHECK(rc == MLXD_ETIMEDOUT, "rc %d: %s", rc, st.msg);
  R_CHECK(st.layer == MLXD_LAYER_TCP && st.has_peer && st.peer == 1, "fields: layer %d peer %d",
          st.layer, st.peer);
  mlxd_status_render(&st, "ring");
  R_CHECK(strstr(st.msg, "[ring] timed out after 2 s waiting for rank 1"), "message: %s",
          st.msg);
  R_CHECK(dt >= 1.5 && dt < 6.0, "timed out after %.2f s", dt);
  fprintf(stderr, "rank 0: %.2f s: %s\n", dt, st.msg);
  return 0;
}

/* 300 MB float32 all_reduce over 2 ranks, checked element by element.
 * (Sizes above 2 GiB take the same code paths: every length is a size_t
 * and the transport caps and loops each socket call; see tcp.c.) */
static int large_rank(mlxd_transport* t, void* arg) {
  (void)arg;
  size_t count = T_SANITIZED ? (size_t)16 << 20 : (size_t)75 << 20; /* 64 / 300 MiB */
  float* buf = malloc(count * 4);
  R_CHECK(buf, "out of memory");
  for (size_t i = 0; i < count; i++) buf[i] = (float)((i + (size_t)t->rank * 3) % 1000);
  mlxd_status st;
  int rc = mlxd_algo_all_reduce(t, 1, buf, buf, count, MLX_FLOAT32, MLXD_SUM, &st);
  R_CHECK(rc == 0, "%s", st.msg);
  for (size_t i = 0; i < count; i++)
    R_CHECK(buf[i] == (float)(i % 1000) + (float)((i + 3) % 1000), "element %zu", i);
  free(buf);
  return 0;
}

/* ------------------------------------------------ throughput */

typedef struct bench_arg {
  size_t bytes;
  int iters;
} bench_arg;

static int bench_rank(mlxd_transport* t, void* arg) {
  bench_arg* b = arg;
  size_t count = b->bytes / 4;
  float* in = malloc(count * 4);
  float* out = malloc(count * 4);
  R_CHECK(in && out, "out of memory");
  for (size_t i = 0; i < count; i++) in[i] = 1.0f;
  mlxd_status st;
  R_CHECK(mlxd_algo_all_reduce(t, 1, in, out, count, MLX_FLOAT32, MLXD_SUM, &st) == 0, "%s",
          st.msg);
  double t0 = mlxd_now();
  for (int it = 0; it < b->iters; it++)
    R_CHECK(mlxd_algo_all_reduce(t, 2 + (uint64_t)it, in, out, count, MLX_FLOAT32, MLXD_SUM,
                                 &st) == 0,
            "%s", st.msg);
  double dt = (mlxd_now() - t0) / b->iters;
  R_CHECK(out[count - 1] == (float)t->size, "wrong result");
  if (t->rank == 0) {
    double algbw = (double)b->bytes / dt / 1e9;
    printf("all_reduce float32 %zu MiB, %d ranks: %.2f ms/iter, algbw %.2f GB/s, busbw %.2f GB/s\n",
           b->bytes >> 20, t->size, dt * 1e3, algbw, algbw * 2.0 * (t->size - 1) / t->size);
  }
  return 0;
}

/* ------------------------------------------------ main */

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN); /* the library must not need this; set only for the harness */
  if (argc < 2) {
    fprintf(stderr, "usage: %s coll|p2p|threads N unix|tcp NCONN | peer_exit N | stall | "
                    "large | bench [MiB] [iters] [nconn] [ranks]\n", argv[0]);
    return 2;
  }
  const char* mode = argv[1];
  if (strcmp(mode, "bench") == 0) {
    bench_arg b = {(size_t)(argc > 2 ? atoi(argv[2]) : 64) << 20, argc > 3 ? atoi(argv[3]) : 10};
    int nc = argc > 4 ? atoi(argv[4]) : 1;
    int nr = argc > 5 ? atoi(argv[5]) : 2;
    T_ASSERT(b.bytes > 0 && b.iters > 0 && nc > 0 && nc <= 8 && nr >= 2 && nr <= 16);
    expect_all_ok(nr, nc, true, bench_rank, &b, 600);
    return 0;
  }
  int n = argc > 2 ? atoi(argv[2]) : 2;
  bool tcp = argc > 3 && strcmp(argv[3], "tcp") == 0;
  int nconn = argc > 4 ? atoi(argv[4]) : 1;
  if (n < 2 || n > 16 || nconn < 1 || nconn > 8) T_FAIL("bad arguments");
  if (strcmp(mode, "coll") == 0) {
    bool quick = argc > 5 && strcmp(argv[5], "quick") == 0;
    expect_all_ok(n, nconn, tcp, coll_rank, quick ? (void*)1 : NULL, 600);
  } else if (strcmp(mode, "p2p") == 0) {
    T_EQ_INT(n, 4);
    expect_all_ok(n, nconn, tcp, p2p_rank, NULL, 300);
  } else if (strcmp(mode, "threads") == 0) {
    expect_all_ok(n, nconn, tcp, threads_rank, NULL, 300);
  } else if (strcmp(mode, "peer_exit") == 0) {
    setenv("MLXDIST_TIMEOUT", "30", 1);
    expect_all_ok(n, nconn, tcp, peer_exit_rank, NULL, 60);
  } else if (strcmp(mode, "stall") == 0) {
    setenv("MLXDIST_TIMEOUT", "2", 1);
    expect_all_ok(2, 1, tcp, stall_rank, NULL, 60);
  } else if (strcmp(mode, "large") == 0) {
    expect_all_ok(2, nconn, true, large_rank, NULL, 600);
  } else {
    T_FAIL("unknown mode '%s'", mode);
  }
  printf("%s: ok\n", mode);
  return 0;
}

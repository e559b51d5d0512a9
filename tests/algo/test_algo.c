/* The collective algorithms of src/algo called directly on an
 * mlxd_transport, over every transport, in forked ranks:
 *
 *   test_algo <tcp[:K] | unix[:K] | shm | shm-cma | mixed:HOSTS> <ranks>
 *
 * (shm-cma: the shared-memory transport with its single-copy path on from
 * 64 KiB.) Every algorithm variant (the dispatcher, the direct / one-shot
 * exchange, the pipeline in one and in both directions, the log-depth forms) of all_reduce,
 * reduce_scatter and all_gather, send/recv, and all_to_all (flat; over
 * mixed:HOSTS also two-level as chosen and gathered per host at every size), on sizes 0, 1, fewer
 * elements than ranks, odd, around the small/large switch
 * (MLXDIST_SMALL_BYTES) and a few MiB; all_reduce with every dtype and op,
 * reduce_scatter with every dtype (all ops for one dtype per element size);
 * over mixed:HOSTS also the two-level forms (algo/hier.h) on HOSTS' host map,
 * against the same references as the flat ones, and the two-level all_reduce
 * pipelined in many segments against the flat pipeline and its one-piece form;
 * results checked bit for bit against references computed here
 * (reference.c), plus a canary past the end of every output. With a third
 * argument "logn": only the log-depth forms (logdepth.c) on small buffers,
 * every dtype and op (groups up to T_MAX_RANKS ranks). Arbitrary
 * floats check that every rank gets bit-identical results close to the
 * reference.
 *
 * A wrong result is a T_CHECK (reported, the run goes on: all ranks stay
 * in step); a collective that fails is a T_REQUIRE (the ranks are out of
 * step, every later call would fail the same way). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "algo/algo_impl.h"
#include "algo/hier.h"
#include "reference.h"
#include "testutil.h"
#include "transport/match.h"
#include "transports.h"
#include "util/tunables.h"

/* Sanitizer builds (T_SANITIZED) run every case but the few-MiB ones for one dtype only. */

enum { V_AUTO, V_DIRECT, V_PIPELINE, V_BIDIR, V_LOGN, V_HIER, V_COUNT };
static const char* v_name(int v) {
  static const char* nm[] = {"auto", "direct", "pipeline", "pipeline-bidir", "logn", "hier"};
  return nm[v];
}
/* Over mixed:HOSTS, the two-level collectives (algo/hier.h) on the host map
 * HOSTS gives; NULL elsewhere (the hier variant is then skipped). */
static mlxd_hier* g_hier;
static bool skip(int v) { return v == V_HIER && !g_hier; }

/* The largest payloads: a few MiB (odd), so the pipeline cuts several
 * 1 MiB chunks per block and posts more units than its receive window. */
#define BIG_BYTES (((size_t)5 << 20) + 12)
#define MID_BYTES (((size_t)2 << 20) + 24)
/* A pipeline chunk set on every rank's transport alike for the BIG_BYTES cases
 * once more, so that a block has more chunks than the receives posted ahead
 * (MLXD_PIPELINE_WINDOW) whatever the transport: the reductions' sends held to
 * the window and all_gather's receives all posted at once (src/algo/pipeline.c),
 * one way and both, with blocks of unequal length. */
#define SMALL_CHUNK ((size_t)64 << 10)
static const unsigned k_pipelines = 1u << V_PIPELINE | 1u << V_BIDIR;

static uint64_t g_seq = 1;
static size_t g_small; /* MLXDIST_SMALL_BYTES: the algorithm switch */

typedef struct bufs {
  char* in;
  char* out;
  char* ref;
  size_t cap; /* bytes each */
} bufs;

/* A collective that fails leaves the ranks out of step: stop this rank. */
static void require_ok(int rc, const mlxd_status* st, const char* what) {
  T_REQUIREF(rc == 0, "%s: code %d (layer %d): %s", what, rc, st->layer, st->msg);
}

static int call_all_reduce(mlxd_transport* t, int v, const void* in, void* out, size_t count,
                           int dt, int op, mlxd_status* st) {
  uint64_t seq = g_seq++;
  mlx_dtype d = (mlx_dtype)dt;
  mlxd_reduce_op o = (mlxd_reduce_op)op;
  switch (v) {
    case V_AUTO: return mlxd_algo_all_reduce(t, seq, NULL, in, out, count, d, o, st);
    case V_DIRECT: return mlxd_algo_all_reduce_oneshot(t, seq, NULL, in, out, count, d, o, st);
    case V_PIPELINE:
      return mlxd_algo_all_reduce_pipeline(t, seq, NULL, in, out, count, d, o, 0, st);
    case V_LOGN: return mlxd_algo_all_reduce_rd(t, seq, NULL, in, out, count, d, o, st);
    case V_HIER: return mlxd_algo_hier_all_reduce(t, g_hier, seq, NULL, in, out, count, d, o, st);
    default: return mlxd_algo_all_reduce_pipeline(t, seq, NULL, in, out, count, d, o, 1, st);
  }
}

static int call_reduce_scatter(mlxd_transport* t, int v, const void* in, void* out, size_t count,
                               int dt, int op, mlxd_status* st) {
  uint64_t seq = g_seq++;
  mlx_dtype d = (mlx_dtype)dt;
  mlxd_reduce_op o = (mlxd_reduce_op)op;
  switch (v) {
    case V_AUTO: return mlxd_algo_reduce_scatter(t, seq, NULL, in, out, count, d, o, st);
    case V_DIRECT: return mlxd_algo_reduce_scatter_direct(t, seq, NULL, in, out, count, d, o, st);
    case V_PIPELINE:
      return mlxd_algo_reduce_scatter_pipeline(t, seq, NULL, in, out, count, d, o, 0, st);
    case V_LOGN: return mlxd_algo_reduce_scatter_rh(t, seq, NULL, in, out, count, d, o, st);
    case V_HIER:
      return mlxd_algo_hier_reduce_scatter(t, g_hier, seq, NULL, in, out, count, d, o, st);
    default: return mlxd_algo_reduce_scatter_pipeline(t, seq, NULL, in, out, count, d, o, 1, st);
  }
}

static int call_all_gather(mlxd_transport* t, int v, const void* in, void* out, size_t nbytes,
                           mlxd_status* st) {
  uint64_t seq = g_seq++;
  switch (v) {
    case V_AUTO: return mlxd_algo_all_gather(t, seq, NULL, in, out, nbytes, st);
    case V_DIRECT: return mlxd_algo_all_gather_direct(t, seq, NULL, in, out, nbytes, st);
    case V_PIPELINE: return mlxd_algo_all_gather_pipeline(t, seq, NULL, in, out, nbytes, 0, st);
    case V_LOGN: return mlxd_algo_all_gather_logn(t, seq, NULL, in, out, nbytes, st);
    case V_HIER: return mlxd_algo_hier_all_gather(t, g_hier, seq, NULL, in, out, nbytes, st);
    default: return mlxd_algo_all_gather_pipeline(t, seq, NULL, in, out, nbytes, 1, st);
  }
}

/* Compare count elements of got with want; one check per case, naming the
 * first wrong element with both values and how many are wrong. */
static void check_equal(const char* what, int dt, const char* got, const char* want, size_t count) {
  size_t es = r_esize(dt);
  if (count == 0 || memcmp(got, want, count * es) == 0) return;
  size_t first = (size_t)-1, wrong = 0;
  for (size_t i = 0; i < count; i++)
    if (memcmp(got + i * es, want + i * es, es) != 0) {
      if (first == (size_t)-1) first = i;
      wrong++;
    }
  char g[64], w[64];
  r_format(dt, got + first * es, g, sizeof g);
  r_format(dt, want + first * es, w, sizeof w);
  t_check_failed(__FILE__, __LINE__, "result == reference",
                 "%s: element %zu is %s, expected %s (%zu of %zu elements wrong)", what, first, g,
                 w, wrong, count);
}

#define CANARY 0xA5
static void set_canary(char* p) { *(unsigned char*)p = CANARY; }
static void check_canary(const char* what, const char* p) {
  T_CHECKF(*(const unsigned char*)p == CANARY, "%s: wrote past the end of the output", what);
}

/* ---------------------------------------------------------- all_reduce */

/* One all_reduce of count exact elements with every variant in vmask,
 * out of place and (if inplace) in place. */
static void all_reduce_case(mlxd_transport* t, bufs* b, int dt, int op, size_t count,
                            unsigned vmask, bool inplace) {
  size_t es = r_esize(dt);
  T_REQUIRE((count + 1) * es <= b->cap);
  uint64_t salt = (uint64_t)count * 3 + 1;
  r_reduce(op, dt, t->size, 0, count, true, salt, b->ref);
  char what[160];
  mlxd_status st;
  for (int v = 0; v < V_COUNT; v++) {
    if (!(vmask >> v & 1) || skip(v)) continue;
    for (int ip = 0; ip < (inplace ? 2 : 1); ip++) {
      snprintf(what, sizeof what, "all_reduce %s %s %s count %zu%s", v_name(v), r_dt_name(dt),
               r_op_name(op), count, ip ? " in place" : "");
      char* out = ip ? b->in : b->out;
      r_fill(dt, t->rank, 0, count, true, salt, b->in);
      if (!ip) memset(b->out, 0x5A, count * es);
      set_canary(out + count * es);
      int rc = call_all_reduce(t, v, b->in, out, count, dt, op, &st);
      require_ok(rc, &st, what);
      check_equal(what, dt, out, b->ref, count);
      check_canary(what, out + count * es);
    }
  }
}

/* Arbitrary floats: every rank gets the same bits (their checksums are
 * all_gathered), close to the reference. */
static uint64_t fnv(const void* buf, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char* p = buf;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static void inexact_case(mlxd_transport* t, bufs* b, int dt, size_t count, unsigned vmask) {
  size_t es = r_esize(dt);
  T_REQUIRE(count * es <= b->cap);
  r_reduce(0, dt, t->size, 0, count, false, 4, b->ref);
  r_fill(dt, t->rank, 0, count, false, 4, b->in);
  double tol = (dt == 9 || dt == 12) ? 0.05 : dt == 11 ? 1e-12 : 1e-5;
  char what[160];
  mlxd_status st;
  for (int v = 0; v < V_COUNT; v++) {
    if (!(vmask >> v & 1) || skip(v)) continue;
    snprintf(what, sizeof what, "all_reduce %s %s sum count %zu (arbitrary floats)", v_name(v),
             r_dt_name(dt), count);
    require_ok(call_all_reduce(t, v, b->in, b->out, count, dt, 0, &st), &st, what);
    uint64_t mine = fnv(b->out, count * es), all[T_MAX_RANKS];
    require_ok(mlxd_algo_all_gather_direct(t, g_seq++, NULL, &mine, all, sizeof mine, &st), &st,
               "checksum all_gather");
    for (int p = 0; p < t->size; p++)
      T_CHECKF(all[p] == mine, "%s: rank %d's result differs from rank %d's", what, p, t->rank);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < count; i++)
      for (int part = 0; part < (dt == 13 ? 2 : 1); part++) {
        double g = r_as_double(dt, b->out + i * es, part);
        double e = r_as_double(dt, b->ref + i * es, part);
        if (!(fabs(g - e) <= tol * (1 + fabs(e))) && bad++ == 0) first = i;
      }
    T_CHECKF(bad == 0, "%s: %zu elements off the reference, first %zu", what, bad, first);
  }
}

/* ---------------------------------------------- two-level, pipelined */

/* The two-level all_reduce with its pipeline segment set to seg bytes
 * (hier.h: seg_bytes; 0: one piece), the same on every rank. */
static void hier_seg_call(mlxd_transport* t, size_t seg, const void* in, void* out, size_t count,
                          int dt, int op, const char* what) {
  mlxd_status st;
  size_t keep = g_hier->seg_bytes;
  g_hier->seg_bytes = seg;
  int rc = call_all_reduce(t, V_HIER, in, out, count, dt, op, &st);
  g_hier->seg_bytes = keep;
  require_ok(rc, &st, what);
}

/* The slices form cut into segments (hier.c): odd counts, segment
 * boundaries inside the one-piece form's slices and parts of one element or
 * none, up to the cap of MLXD_TAG_SEGMENTS segments. Exact inputs: the flat
 * pipeline, the two-level form in one piece and pipelined (out of place and in
 * place) all give the reference's bits. Arbitrary floats: the pipelined
 * result has the same bits on every rank and in a second run, close to the
 * reference. */
static void test_segments(mlxd_transport* t, bufs* b) {
  if (!g_hier) return;
  static const struct {
    int dt, op;
    size_t count, seg;
  } cases[] = {
      {10 /* float32 */, 0, 300007, 65536 + 4}, /* 19 segments */
      {7 /* int32 */, 1, 300007, 100000},       /* 13 */
      {12 /* bfloat16 */, 2, 150001, 32768},    /* 10 */
      {13 /* complex64 */, 0, 40001, 8192},     /* 40 */
      {10, 0, 1001, 1},                         /* 256, the cap: 3 or 4 elements each */
      {5 /* int8 */, 0, 100, 1},                /* 100 of one element: empty parts */
  };
  char what[200];
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    int dt = cases[k].dt, op = cases[k].op;
    size_t count = cases[k].count, es = r_esize(dt), seg = cases[k].seg;
    if (T_SANITIZED && count * es > ((size_t)1 << 20)) continue;
    T_REQUIRE((count + 1) * es <= b->cap);
    uint64_t salt = (uint64_t)count * 7 + 3;
    r_reduce(op, dt, t->size, 0, count, true, salt, b->ref);
    for (int form = 0; form < 4; form++) {
      static const char* nm[] = {"flat pipeline", "two-level in one piece", "two-level pipelined",
                                 "two-level pipelined in place"};
      snprintf(what, sizeof what, "all_reduce %s %s %s count %zu, segments of %zu bytes", nm[form],
               r_dt_name(dt), r_op_name(op), count, seg);
      r_fill(dt, t->rank, 0, count, true, salt, b->in);
      char* out = form == 3 ? b->in : b->out;
      if (form != 3) memset(b->out, 0x5A, count * es);
      set_canary(out + count * es);
      if (form == 0) {
        mlxd_status st;
        require_ok(call_all_reduce(t, V_PIPELINE, b->in, out, count, dt, op, &st), &st, what);
      } else {
        hier_seg_call(t, form == 1 ? 0 : seg, b->in, out, count, dt, op, what);
      }
      check_equal(what, dt, out, b->ref, count);
      check_canary(what, out + count * es);
    }
  }
  /* arbitrary floats, pipelined: the same bits everywhere, twice */
  size_t count = T_SANITIZED ? 20011 : 300007, seg = 65536 + 4;
  r_reduce(0, 10, t->size, 0, count, false, 9, b->ref);
  r_fill(10, t->rank, 0, count, false, 9, b->in);
  uint64_t first = 0;
  for (int run = 0; run < 2; run++) {
    snprintf(what, sizeof what,
             "all_reduce two-level pipelined float32 sum count %zu (arbitrary floats), run %d",
             count, run + 1);
    hier_seg_call(t, seg, b->in, b->out, count, 10, 0, what);
    mlxd_status st;
    uint64_t mine = fnv(b->out, count * 4), all[T_MAX_RANKS];
    require_ok(mlxd_algo_all_gather_direct(t, g_seq++, NULL, &mine, all, sizeof mine, &st), &st,
               "checksum all_gather");
    for (int p = 0; p < t->size; p++)
      T_CHECKF(all[p] == mine, "%s: rank %d's result differs from rank %d's", what, p, t->rank);
    if (run == 0) first = mine;
    T_CHECKF(mine == first, "%s: differs from the first run", what);
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
      double g = r_as_double(10, b->out + i * 4, 0), e = r_as_double(10, b->ref + i * 4, 0);
      if (!(fabs(g - e) <= 1e-5 * (1 + fabs(e)))) bad++;
    }
    T_CHECKF(bad == 0, "%s: %zu elements off the reference", what, bad);
  }
}

/* The kernels are chosen by (dtype, op) and are the same for every variant
 * and size; the partitioning is chosen by (variant, element size, count).
 * So: every (dtype, op) pair at one odd count through the dispatcher and
 * the pipeline (whose reduction runs on chunks: mlxd_reduce3), and every
 * variant x count for one dtype per element size. */
static void test_all_reduce(mlxd_transport* t, bufs* b) {
  int n = t->size;
  const unsigned all = (1u << V_COUNT) - 1;
  const unsigned auto_bidir = 1u << V_AUTO | 1u << V_BIDIR | 1u << V_LOGN | 1u << V_HIER;
  for (int dt = 0; dt < R_NDTYPES; dt++)
    for (int op = 0; op < R_NOPS; op++)
      all_reduce_case(t, b, dt, op, 129, auto_bidir, op == dt % 3);
  /* nothing, one element, fewer elements than ranks (empty pipeline blocks),
   * one more than ranks */
  const int per_size[] = {1 /* uint8 */, 12 /* bfloat16 */, 10 /* float32 */, 13 /* complex64 */};
  const size_t counts[] = {0, 1, (size_t)n - 1, (size_t)n + 1};
  for (int k = 0; k < 4; k++)
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
      all_reduce_case(t, b, per_size[k], k % 3, counts[c], all, c == 3);
  /* around the two-level forms' first switch (host sums by column / via host leaders) */
  for (int k = 0; k < 4 && g_hier; k++) {
    size_t at = MLXD_HIER_TINY_BYTES / r_esize(per_size[k]);
    for (size_t c = at - 1; c <= at + 1; c++)
      all_reduce_case(t, b, per_size[k], k % 3, c, 1u << V_HIER, c == at);
  }
  /* around the one-shot limit of the phases across three or more hosts
   * (the leaders' all-reduce of the whole buffer) */
  for (size_t c = MLXD_HIER_CROSS_SMALL / 4 - 1; g_hier && c <= MLXD_HIER_CROSS_SMALL / 4 + 1; c++)
    all_reduce_case(t, b, 10, 0, c, 1u << V_HIER, false);
  /* around the switch (auto and hier only: the others take no decision) */
  for (int k = 0; k < 4; k++) {
    size_t at = g_small / r_esize(per_size[k]);
    for (size_t c = at - 1; c <= at + 1; c++)
      all_reduce_case(t, b, per_size[k], (k + 1) % 3, c, 1u << V_AUTO | 1u << V_HIER, false);
  }
  /* a few MiB: every variant in float32 (with 4 ranks the pipeline then posts
   * more chunks than its receive window); one dtype per other element size
   * over 2 MiB (several chunks per block) */
  all_reduce_case(t, b, 10, 0, BIG_BYTES / 4, all, true);
  size_t chunk = t->pipeline_chunk;
  t->pipeline_chunk = SMALL_CHUNK;
  all_reduce_case(t, b, 10, 0, BIG_BYTES / 4, k_pipelines, false);
  t->pipeline_chunk = chunk;
  if (!T_SANITIZED) {
    all_reduce_case(t, b, 5 /* int8 */, 0, MID_BYTES, 1u << V_AUTO | 1u << V_PIPELINE, false);
    all_reduce_case(t, b, 12 /* bfloat16 */, 1, MID_BYTES / 2, auto_bidir, false);
    all_reduce_case(t, b, 13 /* complex64 */, 2, MID_BYTES / 8, 1u << V_PIPELINE | 1u << V_DIRECT,
                    false);
  }
  for (int dt = 9; dt < R_NDTYPES; dt++) inexact_case(t, b, dt, 1001, all);
  inexact_case(t, b, 10, 100003, all);
  inexact_case(t, b, 12, 100003, 1u << V_PIPELINE | 1u << V_BIDIR | 1u << V_HIER);
  test_segments(t, b);
}

/* ------------------------------------------------------ reduce_scatter */

/* Input: size * count elements per rank; rank r gets block r. */
static void reduce_scatter_case(mlxd_transport* t, bufs* b, int dt, int op, size_t count,
                                unsigned vmask) {
  size_t es = r_esize(dt), n = (size_t)t->size;
  T_REQUIRE((count * n + 1) * es <= b->cap);
  uint64_t salt = (uint64_t)count * 5 + 2;
  r_reduce(op, dt, t->size, (size_t)t->rank * count, count, true, salt, b->ref);
  char what[160];
  mlxd_status st;
  r_fill(dt, t->rank, 0, count * n, true, salt, b->in);
  for (int v = 0; v < V_COUNT; v++) {
    if (!(vmask >> v & 1) || skip(v)) continue;
    snprintf(what, sizeof what, "reduce_scatter %s %s %s count %zu", v_name(v), r_dt_name(dt),
             r_op_name(op), count);
    memset(b->out, 0x5A, count * es);
    set_canary(b->out + count * es);
    require_ok(call_reduce_scatter(t, v, b->in, b->out, count, dt, op, &st), &st, what);
    check_equal(what, dt, b->out, b->ref, count);
    check_canary(what, b->out + count * es);
  }
}

static void test_reduce_scatter(mlxd_transport* t, bufs* b) {
  int n = t->size;
  const unsigned all = (1u << V_COUNT) - 1;
  /* every dtype through both reduction paths (direct: mlxd_reduce after
   * the exchange; pipeline: mlxd_reduce3 on chunks) */
  for (int dt = 0; dt < R_NDTYPES; dt++)
    reduce_scatter_case(t, b, dt, dt % 3, 7,
                        1u << V_DIRECT | 1u << V_PIPELINE | 1u << V_LOGN | 1u << V_HIER);
  /* every op for one dtype per element size, every variant */
  const int per_size[] = {0 /* bool */, 9 /* float16 */, 7 /* int32 */, 13 /* complex64 */};
  for (int k = 0; k < 4; k++)
    for (int op = 0; op < R_NOPS; op++) reduce_scatter_case(t, b, per_size[k], op, 129, all);
  const size_t counts[] = {0, 1, 2};
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
    reduce_scatter_case(t, b, 10, 0, counts[c], all);
  /* the switch is on the block size: small / size bytes */
  size_t at = g_small / (size_t)n / 4;
  for (size_t c = at - 1; c <= at + 1; c++)
    reduce_scatter_case(t, b, 10, 2, c, 1u << V_AUTO | 1u << V_HIER);
  /* around the columns' one-shot limit (hier.h: a column's block of
   * count elements from each of its hosts) */
  if (g_hier) {
    size_t cat = MLXD_HIER_CROSS_SMALL / (size_t)g_hier->nhosts / 4;
    for (size_t c = cat - 1; c <= cat + 1; c++) reduce_scatter_case(t, b, 10, 0, c, 1u << V_HIER);
  }
  /* a few MiB of input in all */
  reduce_scatter_case(t, b, 10, 0, BIG_BYTES / 4 / (size_t)n, all);
  size_t chunk = t->pipeline_chunk;
  t->pipeline_chunk = SMALL_CHUNK;
  reduce_scatter_case(t, b, 10, 0, BIG_BYTES / 4 / (size_t)n, k_pipelines);
  t->pipeline_chunk = chunk;
  if (!T_SANITIZED)
    reduce_scatter_case(t, b, 12, 1, MID_BYTES / 2 / (size_t)n + 1, 1u << V_AUTO | 1u << V_HIER);
}

/* ---------------------------------------------------------- all_gather */

static unsigned char gval(int r, size_t i) {
  return (unsigned char)(r * 77 + (int)(i * 5) + (int)(i >> 11) + 1);
}

static void all_gather_case(mlxd_transport* t, bufs* b, size_t nbytes, unsigned vmask) {
  size_t n = (size_t)t->size, total = nbytes * n;
  T_REQUIRE(total + 1 <= b->cap && nbytes <= b->cap);
  for (int p = 0; p < t->size; p++)
    for (size_t i = 0; i < nbytes; i++) b->ref[(size_t)p * nbytes + i] = (char)gval(p, i);
  char what[160];
  mlxd_status st;
  for (int v = 0; v < V_COUNT; v++) {
    if (!(vmask >> v & 1) || skip(v)) continue;
    for (int ip = 0; ip < 2; ip++) {
      /* in place: the input is this rank's block of the output */
      snprintf(what, sizeof what, "all_gather %s %zu bytes%s", v_name(v), nbytes,
               ip ? " in place" : "");
      memset(b->out, 0x5A, total);
      char* in = ip ? b->out + (size_t)t->rank * nbytes : b->in;
      for (size_t i = 0; i < nbytes; i++) in[i] = (char)gval(t->rank, i);
      set_canary(b->out + total);
      require_ok(call_all_gather(t, v, in, b->out, nbytes, &st), &st, what);
      check_equal(what, 1 /* bytes */, b->out, b->ref, total);
      check_canary(what, b->out + total);
    }
  }
}

static void test_all_gather(mlxd_transport* t, bufs* b) {
  int n = t->size;
  const unsigned all = (1u << V_COUNT) - 1;
  const size_t sizes[] = {0, 1, 3, 1001};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) all_gather_case(t, b, sizes[k], all);
  /* the switch is on the total: small bytes */
  size_t at = g_small / (size_t)n;
  for (size_t s = at - 1; s <= at + 1; s++) all_gather_case(t, b, s, 1u << V_AUTO | 1u << V_HIER);
  /* the columns' one-shot limit: a column gathers hosts x nbytes */
  if (g_hier) {
    size_t cat = MLXD_HIER_CROSS_SMALL / (size_t)g_hier->nhosts;
    for (size_t s = cat - 1; s <= cat + 1; s++) all_gather_case(t, b, s, 1u << V_HIER);
  }
  all_gather_case(t, b, BIG_BYTES / (size_t)n, all);
  size_t chunk = t->pipeline_chunk;
  t->pipeline_chunk = SMALL_CHUNK;
  all_gather_case(t, b, BIG_BYTES / (size_t)n, k_pipelines);
  t->pipeline_chunk = chunk;
}

/* ---------------------------------------------------------- all_to_all */

/* Byte k of part j of rank i's input (part j goes to rank j). */
static unsigned char aval(int i, int j, size_t k) {
  return (unsigned char)(i * 31 + j * 7 + (int)(k * 13) + (int)(k >> 9) + 1);
}

enum { A2A_FLAT, A2A_HIER, A2A_GATHERED, A2A_COUNT };
static const char* a2a_name(int v) {
  static const char* nm[] = {"flat", "hier", "hier-gathered"};
  return nm[v];
}

/* One all_to_all of part bytes per part with every form (the two-level ones
 * over mixed:HOSTS only): rank r's output part i must be part r of rank i's
 * input, nothing written past the output, the input left as it was. */
static void all_to_all_case(mlxd_transport* t, bufs* b, size_t part) {
  int n = t->size, r = t->rank;
  size_t total = part * (size_t)n;
  T_REQUIRE(total + 1 <= b->cap);
  for (int i = 0; i < n; i++)
    for (size_t k = 0; k < part; k++) b->ref[(size_t)i * part + k] = (char)aval(i, r, k);
  char what[160];
  mlxd_status st;
  for (int v = 0; v < A2A_COUNT; v++) {
    if (v != A2A_FLAT && !g_hier) continue;
    snprintf(what, sizeof what, "all_to_all %s %zu bytes a part", a2a_name(v), part);
    for (int j = 0; j < n; j++)
      for (size_t k = 0; k < part; k++) b->in[(size_t)j * part + k] = (char)aval(r, j, k);
    memset(b->out, 0x5A, total);
    set_canary(b->out + total);
    uint64_t seq = g_seq++;
    int rc =
        v == A2A_FLAT ? mlxd_algo_all_to_all(t, seq, NULL, b->in, b->out, part, &st)
        : v == A2A_HIER
            ? mlxd_algo_hier_all_to_all(t, g_hier, seq, NULL, b->in, b->out, part, &st)
            : mlxd_algo_hier_all_to_all_gathered(t, g_hier, seq, NULL, b->in, b->out, part, &st);
    require_ok(rc, &st, what);
    check_equal(what, 1 /* bytes */, b->out, b->ref, total);
    check_canary(what, b->out + total);
    size_t bad = 0;
    for (int j = 0; j < n; j++)
      for (size_t k = 0; k < part; k++) bad += b->in[(size_t)j * part + k] != (char)aval(r, j, k);
    T_CHECKF(bad == 0, "%s: the input changed (%zu bytes)", what, bad);
  }
}

static void test_all_to_all(mlxd_transport* t, bufs* b) {
  const size_t sizes[] = {0, 1, 3, 8, 1001, 4096, ((size_t)64 << 10) + 5};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) all_to_all_case(t, b, sizes[k]);
  if (g_hier) {
    /* the switch between the gathered and the flat form (hier_topo.c) */
    size_t at = 0;
    while (mlxd_hier_a2a_gathered(g_hier, at + 1)) at++;
    T_CHECKF(at > 0 || g_hier->max_local * (g_hier->size - g_hier->max_local) <= g_hier->nhosts - 1,
             "the gathered form is never chosen on this host map");
    if (t->rank == 0) printf("all_to_all: parts gathered per host up to %zu bytes\n", at);
    for (size_t s = at > 0 ? at - 1 : 1; s <= at + 1; s++) all_to_all_case(t, b, s);
  }
  all_to_all_case(t, b, BIG_BYTES / (size_t)t->size);
}

/* -------------------------------------------------- log-depth forms */

/* The log-depth forms' one reduction order (logdepth.c): recursive halving
 * computes every block with the same expression tree as recursive
 * doubling, so on arbitrary floats rank r's reduce_scatter block is bit for
 * bit block r of the all_reduce of the same input. */
static void logn_tree_case(mlxd_transport* t, bufs* b, int dt, int op, size_t count) {
  size_t es = r_esize(dt), n = (size_t)t->size;
  T_REQUIRE(count * n * es <= b->cap);
  char what[160];
  snprintf(what, sizeof what,
           "reduce_scatter logn %s %s count %zu (arbitrary floats) vs the logn all_reduce",
           r_dt_name(dt), r_op_name(op), count);
  r_fill(dt, t->rank, 0, count * n, false, 11, b->in);
  mlxd_status st;
  require_ok(call_all_reduce(t, V_LOGN, b->in, b->ref, count * n, dt, op, &st), &st, what);
  require_ok(call_reduce_scatter(t, V_LOGN, b->in, b->out, count, dt, op, &st), &st, what);
  check_equal(what, dt, b->out, b->ref + (size_t)t->rank * count * es, count);
}

/* The log-depth forms on small buffers (what the dispatchers give them) at
 * any group size: every dtype and op, in place and not, counts around the
 * group size, against the references; arbitrary floats: the same bits on
 * every rank. The dispatcher too (it chooses them from
 * mlxd_algo_logn's group sizes on). */
static void test_logn(mlxd_transport* t, bufs* b) {
  int n = t->size;
  const unsigned lg = 1u << V_LOGN | 1u << V_AUTO;
  for (int dt = 0; dt < R_NDTYPES; dt++)
    for (int op = 0; op < R_NOPS; op++) {
      all_reduce_case(t, b, dt, op, 37, lg, op == dt % 3);
      reduce_scatter_case(t, b, dt, op, 5, lg);
    }
  const int per_size[] = {1 /* uint8 */, 12 /* bfloat16 */, 10 /* float32 */, 13 /* complex64 */};
  const size_t counts[] = {0, 1, (size_t)n - 1, (size_t)n + 1, 1001};
  for (int k = 0; k < 4; k++)
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
      all_reduce_case(t, b, per_size[k], k % 3, counts[c], lg, c != 2);
      if (counts[c] <= (size_t)n + 1) reduce_scatter_case(t, b, per_size[k], k % 3, counts[c], lg);
    }
  /* the switch to the pipeline */
  size_t at = g_small / 4;
  for (size_t c = at - 1; c <= at + 1; c++) all_reduce_case(t, b, 10, 0, c, lg, c == at);
  at = g_small / (size_t)n / 4;
  for (size_t c = at - 1; c <= at + 1; c++) reduce_scatter_case(t, b, 10, 1, c, lg);
  const size_t sizes[] = {0, 1, 3, 1001, g_small / (size_t)n, g_small / (size_t)n + 1};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) all_gather_case(t, b, sizes[k], lg);
  for (int dt = 9; dt < R_NDTYPES; dt++) inexact_case(t, b, dt, 1001, lg);
  for (int op = 0; op < R_NOPS; op++) logn_tree_case(t, b, 10, op, 33);
  logn_tree_case(t, b, 12, 0, 100);
  logn_tree_case(t, b, 13, 0, 7);
}

/* ------------------------------------------------------------ send/recv */

/* Every rank sends to every other rank (everyone sends first: sends must
 * complete without a posted receive), then receives from each in the
 * opposite order; per-(peer, direction) sequence numbers as the front-end
 * keeps them. */
static void test_send_recv(mlxd_transport* t, bufs* b) {
  int n = t->size, r = t->rank;
  uint64_t sent[T_MAX_RANKS] = {0}, recvd[T_MAX_RANKS] = {0};
  const size_t sizes[] = {0, 1, 1001, 65535, 65536, 65537, ((size_t)3 << 20) + 1};
  size_t ns = sizeof sizes / sizeof sizes[0];
  mlxd_status st;
  char what[160];
  for (size_t k = 0; k < ns; k++) {
    size_t len = sizes[k];
    T_REQUIRE(len * (size_t)n <= b->cap);
    /* block p of in: what this rank sends to p */
    for (int p = 0; p < n; p++)
      for (size_t i = 0; i < len; i++)
        b->in[(size_t)p * len + i] = (char)(gval(r, i) ^ (unsigned char)(p * 29));
    for (int j = 1; j < n; j++) {
      int to = (r + j) % n;
      snprintf(what, sizeof what, "send of %zu bytes to rank %d", len, to);
      require_ok(mlxd_algo_send(t, sent[to]++, NULL, b->in + (size_t)to * len, len, to, &st), &st,
                 what);
    }
    for (int j = n - 1; j >= 1; j--) {
      int from = (r + j) % n;
      snprintf(what, sizeof what, "recv of %zu bytes from rank %d", len, from);
      char* dst = b->out + (size_t)from * len;
      set_canary(dst + len);
      require_ok(mlxd_algo_recv(t, recvd[from]++, NULL, dst, len, from, &st), &st, what);
      for (size_t i = 0; i < len; i++) b->ref[i] = (char)(gval(from, i) ^ (unsigned char)(r * 29));
      check_equal(what, 1, dst, b->ref, len);
      check_canary(what, dst + len);
    }
  }
}

/* ---------------------------------------------------------------- tags */

/* The tag layout (transport.h): phase and segment set apart from each other
 * and from the kind, the sequence number and the step; one operation
 * whatever the phase and segment (signatures are compared per operation). */
static void test_tags(void) {
  uint64_t seq = ((uint64_t)1 << 17) - 2, t = mlxd_tag(MLXD_TAG_COLL, seq, 0x8007);
  uint64_t u = mlxd_tag_with_segment(mlxd_tag_with_phase(t, 7), 255);
  T_ASSERT(mlxd_tag_phase(u) == 7 && mlxd_tag_segment(u) == 255 && mlxd_tag_group(u) == 0);
  T_ASSERT(mlxd_tag_seq(u) == seq && (u & 0xFFFF) == 0x8007 && u >> 60 == MLXD_TAG_COLL);
  T_ASSERT(mlxd_tag_op(u) == mlxd_tag_op(t) && u != t);
  T_ASSERT(mlxd_tag_with_segment(mlxd_tag_with_phase(u, 0), 0) == t);
  uint64_t v = mlxd_tag_with_segment(t, 1);
  T_ASSERT(v != t && v != mlxd_tag_with_phase(t, 1) && mlxd_tag_op(v) == mlxd_tag_op(t));
  T_ASSERT(mlxd_tag_seq(mlxd_tag(MLXD_TAG_COLL, seq + 2, 0)) == 0); /* wraps at 2^17 */
  /* the group: apart from every other field, part of the operation (a split
   * child's op never lines up with its parent's of the same number) */
  uint64_t g = mlxd_tag_with_group(u, 65535);
  T_ASSERT(mlxd_tag_group(g) == 65535 && mlxd_tag_phase(g) == 7 && mlxd_tag_segment(g) == 255);
  T_ASSERT(mlxd_tag_seq(g) == seq && (g & 0xFFFF) == 0x8007 && g >> 60 == MLXD_TAG_COLL);
  T_ASSERT(mlxd_tag_op(g) != mlxd_tag_op(u) && mlxd_tag_with_group(g, 0) == u);
  T_ASSERT(mlxd_tag_group(mlxd_tag(MLXD_TAG_COLL, (uint64_t)-1, 0xFFFF)) == 0);
  char txt[80];
  mlxd_match_tag_str(mlxd_tag_with_segment(mlxd_tag_with_phase(mlxd_tag(2, 5, 3), 2), 9), txt,
                     sizeof txt);
  T_REQUIREF(strcmp(txt, "collective #5 phase 2 segment 9 step 3") == 0, "tag in words: '%s'", txt);
  mlxd_match_tag_str(mlxd_tag_with_group(mlxd_tag_with_phase(mlxd_tag(2, 5, 3), 2), 12), txt,
                     sizeof txt);
  T_REQUIREF(strcmp(txt, "collective #5 group 12 phase 2 step 3") == 0, "tag in words: '%s'", txt);
  mlxd_match_tag_str(mlxd_tag_with_segment(mlxd_tag(2, 5, 3), 9), txt, sizeof txt);
  T_REQUIREF(strcmp(txt, "collective #5 segment 9 step 3") == 0, "tag in words: '%s'", txt);
}

/* ---------------------------------------------------------------- main */

static bool g_logn_only; /* argument "logn": only test_logn */

static int rank_main(mlxd_transport* t, void* arg) {
  const t_tp_spec* spec = arg;
  if (spec->kind == T_TP_MIXED) {
    int host_of[T_MAX_RANKS];
    for (int p = 0; p < t->size; p++) {
      host_of[p] = p;
      for (int q = p - 1; q >= 0; q--)
        if (spec->hosts[q] == spec->hosts[p]) host_of[p] = q;
    }
    mlxd_status hs;
    mlxd_status_clear(&hs);
    g_hier = mlxd_hier_new(t->rank, t->size, host_of, &hs);
    T_REQUIREF(g_hier, "host map: %s", hs.msg);
    if (!mlxd_hier_applies(g_hier)) {
      mlxd_hier_free(g_hier);
      g_hier = NULL;
    } else if (t->rank == 0) {
      char where[96];
      mlxd_hier_describe(g_hier, where, sizeof where);
      printf("two-level collectives too: %s\n", where);
    }
  }
  bufs b;
  /* big enough for every case: a reduce_scatter input of BIG_BYTES plus
   * one element per rank, an all_gather of BIG_BYTES, 3 MiB to each peer */
  b.cap = BIG_BYTES + ((size_t)t->size + 1) * 8 + ((size_t)3 << 20) * (size_t)t->size + 64;
  b.in = malloc(b.cap);
  b.out = malloc(b.cap);
  b.ref = malloc(b.cap);
  T_REQUIREF(b.in && b.out && b.ref, "out of memory for 3 x %zu bytes", b.cap);
  double t0 = t_now();
  if (g_logn_only) {
    test_logn(t, &b);
    uint64_t x = 1, all[T_MAX_RANKS];
    mlxd_status st;
    require_ok(mlxd_algo_all_gather_direct(t, g_seq++, NULL, &x, all, sizeof x, &st), &st,
               "final all_gather");
    if (t->rank == 0)
      printf("%s, %d ranks: log-depth forms %.2f s\n", t->ops->name, t->size, t_now() - t0);
    free(b.in);
    free(b.out);
    free(b.ref);
    mlxd_hier_free(g_hier);
    return 0;
  }
  test_all_reduce(t, &b);
  double t1 = t_now();
  test_reduce_scatter(t, &b);
  double t2 = t_now();
  test_all_gather(t, &b);
  double t3 = t_now();
  test_send_recv(t, &b);
  double t4 = t_now();
  test_all_to_all(t, &b);
  double t5 = t_now();
  /* end together: nobody closes its transport while another still sends */
  uint64_t x = 1, all[T_MAX_RANKS];
  mlxd_status st;
  require_ok(mlxd_algo_all_gather_direct(t, g_seq++, NULL, &x, all, sizeof x, &st), &st,
             "final all_gather");
  if (t->rank == 0)
    printf(
        "%s, %d ranks: all_reduce %.2f s, reduce_scatter %.2f s, all_gather %.2f s, "
        "send/recv %.2f s, all_to_all %.2f s\n",
        t->ops->name, t->size, t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4);
  free(b.in);
  free(b.out);
  free(b.ref);
  mlxd_hier_free(g_hier);
  return 0;
}

int main(int argc, char** argv) {
  t_tp_spec spec;
  g_logn_only = argc == 4 && strcmp(argv[3], "logn") == 0;
  bool cma = (argc == 3 || g_logn_only) && strcmp(argv[1], "shm-cma") == 0;
  int n = argc == 3 || g_logn_only ? atoi(argv[2]) : 0;
  if ((argc != 3 && !g_logn_only) || (!cma && !t_tp_parse(argv[1], &spec)) || n < 2 ||
      n > T_MAX_RANKS) {
    fprintf(stderr, "usage: %s tcp[:K]|unix[:K]|shm|shm-cma|mixed:HOSTS <ranks 2..%d> [logn]\n",
            argv[0], T_MAX_RANKS);
    return 2;
  }
  if (cma) {
    spec = (t_tp_spec){.kind = T_TP_SHM, .nconn = 1};
    setenv("MLXDIST_SHM_CMA_BYTES", "65536", 1);
  }
  test_tags();
  /* a rank that falls out of step fails in bounded time, not at ctest's limit */
  setenv("MLXDIST_TIMEOUT", "30", 1);
  long small = mlxd_tunable_long(MLXD_T_SMALL_BYTES);
  T_REQUIREF(small >= 64, "MLXDIST_SMALL_BYTES=%ld: this test needs at least 64", small);
  g_small = (size_t)small;
  t_ranks_opts o = {.timeout_s = 240, .what = argv[1]};
  int bad = t_run_transport(&spec, n, rank_main, &spec, &o, NULL);
  if (bad)
    T_FAIL("collectives over %s with %d ranks: %d rank%s failed", argv[1], n, bad,
           bad == 1 ? "" : "s");
  printf("collectives over %s with %d ranks: ok\n", argv[1], n);
  return 0;
}

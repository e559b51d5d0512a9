/* Shared benchmark machinery (see bench_common.h). */
#include "bench_common.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char* const mlxd_op_names[MLXD_OP_COUNT] = {"all_sum",     "all_max",  "all_gather",
                                                         "sum_scatter", "sendrecv", "sendrecv_bw",
                                                         "all_to_all"};

static const mlxd_bench_dtype mlxd_dtypes[] = {
    {"bool", 1, MLXD_K_BOOL},     {"uint8", 1, MLXD_K_UINT},    {"uint16", 2, MLXD_K_UINT},
    {"uint32", 4, MLXD_K_UINT},   {"uint64", 8, MLXD_K_UINT},   {"int8", 1, MLXD_K_INT},
    {"int16", 2, MLXD_K_INT},     {"int32", 4, MLXD_K_INT},     {"int64", 8, MLXD_K_INT},
    {"float16", 2, MLXD_K_F16},   {"float32", 4, MLXD_K_FLOAT}, {"float64", 8, MLXD_K_FLOAT},
    {"bfloat16", 2, MLXD_K_BF16},
};

int mlxd_bench_bw_window(size_t bytes) {
  size_t w = bytes > 0 ? MLXD_BENCH_BW_WINDOW_BYTES / bytes : MLXD_BENCH_BW_WINDOW;
  if (w > MLXD_BENCH_BW_WINDOW) w = MLXD_BENCH_BW_WINDOW;
  return w < 1 ? 1 : (int)w;
}

const char* mlxd_bench_op_name(mlxd_bench_op op) {
  return (op >= 0 && op < MLXD_OP_COUNT) ? mlxd_op_names[op] : "?";
}

const mlxd_bench_dtype* mlxd_bench_find_dtype(const char* name) {
  for (size_t i = 0; i < sizeof mlxd_dtypes / sizeof mlxd_dtypes[0]; i++)
    if (strcmp(mlxd_dtypes[i].name, name) == 0) return &mlxd_dtypes[i];
  return NULL;
}

bool mlxd_bench_parse_size(const char* s, size_t* out) {
  char* end = NULL;
  errno = 0;
  if (!s || *s == '-' || *s == '\0') return false;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return false;
  unsigned long long mul = 1;
  if (*end == 'K' || *end == 'k')
    mul = 1ull << 10;
  else if (*end == 'M' || *end == 'm')
    mul = 1ull << 20;
  else if (*end == 'G' || *end == 'g')
    mul = 1ull << 30;
  if (mul != 1) end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0') return false;
  if (v > (unsigned long long)SIZE_MAX / mul) return false;
  *out = (size_t)(v * mul);
  return true;
}

static void mlxd_bench_usage(FILE* f, const char* prog) {
  fprintf(f,
          "Usage: %s [options]   (run one process per rank, e.g. under mlxdist-launch)\n"
          "\n"
          "  --op OP            all_sum (default), all_max, all_gather, sum_scatter, sendrecv,\n"
          "                     sendrecv_bw, all_to_all, all, or a comma-separated list\n"
          "  -b, --min-bytes N  smallest size (default 4); K/M/G suffixes (powers of 1024)\n"
          "  -e, --max-bytes N  largest size (default 64M)\n"
          "  -f, --factor F     size multiplication factor (default 2)\n"
          "  -t, --min-time MS  timed work per size at least MS milliseconds (default 300):\n"
          "                     the iterations per batch are calibrated from the warm-up;\n"
          "                     0 runs exactly --iters per batch\n"
          "  --batches N        timed batches per size (default 5); the figure is their median\n"
          "  --max-batches N    more batches, up to N (default 3 x --batches), while the\n"
          "                     median is not settled and the timed total is under twice\n"
          "                     --min-time\n"
          "  -n, --iters N      fewest timed iterations per batch (default 1)\n"
          "  --max-iters N      most timed iterations per batch (default 100000)\n"
          "  -w, --warmup N     untimed iterations per size (default 5; beyond the first only\n"
          "                     as many as fit in half of --min-time); N > 0 also runs one\n"
          "                     untimed pass over every op and size before the first timed\n"
          "                     row, so start-up costs stay out of the figures (-w 0 with\n"
          "                     --min-time 0: nothing untimed at all, to see cold costs)\n"
          "  --bind             pin each rank, all its threads, to CPU (rank mod online CPUs)\n"
          "  --dtype T          element type (default float32)\n"
          "  --backend B        backend (default any)\n"
          "  --csv              comma-separated output\n"
          "  --check            fill inputs with rank-dependent values and verify the results\n"
          "  --account          add counts per op over the timed batches, rank 0's and the\n"
          "                     maximum over the ranks: minor and major page faults, context\n"
          "                     switches (getrusage), user-space instructions and system calls\n"
          "                     (perf_event_open; n/a where a counter is not available, the\n"
          "                     reason said once on stderr)\n"
          "  -h, --help         print this help\n"
          "\n"
          "Columns: size in bytes (all_gather: the gathered output; sum_scatter: the input;\n"
          "all_to_all: a rank's whole input, n parts, as nccl-tests' alltoall),\n"
          "count in elements of that buffer, time in microseconds per op: the median over the\n"
          "batches of (batch wall time / iterations), each batch the slowest rank's (sendrecv:\n"
          "half the round trip of a ping-pong between ranks 0 and 1, as osu_latency;\n"
          "sendrecv_bw: a window of 64 sends from rank 0 to 1 then a one-element ack, as\n"
          "osu_bw, per message; fewer than 64 where the window would pass 64 MiB),\n"
          "algbw = size/time, busbw = algbw times 2(n-1)/n (all_sum, all_max),\n"
          "(n-1)/n (all_gather, sum_scatter, all_to_all) or 1 (sendrecv, sendrecv_bw),\n"
          "cpu = process CPU microseconds per op on rank 0, check (ok, FAIL, or - without\n"
          "--check), iters per batch, batches, and the fastest and slowest batch (us per op);\n"
          "with --account, per op (sendrecv: per round trip; sendrecv_bw: per message), each\n"
          "as r0 (rank 0) and mx (the maximum over the ranks): minflt, majflt (page faults),\n"
          "csw (context switches), instr (user-space instructions), sysc (system calls).\n"
          "Only rank 0 prints.\n"
          "Exits 1 when a check fails.\n",
          prog);
}

static bool mlxd_parse_int(const char* s, int lo, int* out) {
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > 1000000000L) return false;
  *out = (int)v;
  return true;
}

int mlxd_bench_parse(int argc, char** argv, mlxd_bench_opts* o, const char* prog) {
  memset(o, 0, sizeof *o);
  o->ops[MLXD_OP_ALL_SUM] = true;
  o->min_bytes = 4;
  o->max_bytes = 64u << 20;
  o->factor = 2.0;
  o->iters = 1;
  o->warmup = 5;
  o->min_time_ms = 300;
  o->batches = 5;
  o->max_batches = 0;
  o->max_iters = 100000;
  o->dtype = mlxd_bench_find_dtype("float32");
  o->backend = "any";
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = NULL;
    static const char* const with_value[] = {
        "--op",      "-b", "--min-bytes", "-e",        "--max-bytes",   "-f",
        "--factor",  "-n", "--iters",     "-w",        "--warmup",      "--dtype",
        "--backend", "-t", "--min-time",  "--batches", "--max-batches", "--max-iters"};
    const char* name = a;
    char namebuf[32];
    const char* eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
    if (eq && (size_t)(eq - a) < sizeof namebuf) {
      memcpy(namebuf, a, (size_t)(eq - a));
      namebuf[eq - a] = '\0';
      name = namebuf;
      v = eq + 1;
    }
    bool takes = false;
    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
      if (strcmp(name, with_value[k]) == 0) takes = true;
    if (takes && !v) {
      if (i + 1 >= argc) {
        fprintf(stderr, "[bench] option %s needs a value.\n", name);
        return 2;
      }
      v = argv[++i];
    }
    if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0) {
      mlxd_bench_usage(stdout, prog);
      return 1;
    } else if (strcmp(name, "--csv") == 0) {
      o->csv = true;
    } else if (strcmp(name, "--check") == 0) {
      o->check = true;
    } else if (strcmp(name, "--bind") == 0) {
      o->bind = true;
    } else if (strcmp(name, "--account") == 0) {
      o->account = true;
    } else if (strcmp(name, "-t") == 0 || strcmp(name, "--min-time") == 0) {
      char* end = NULL;
      double ms = strtod(v, &end);
      if (end == v || *end || !(ms >= 0) || ms > 3.6e6) {
        fprintf(stderr, "[bench] %s expects milliseconds between 0 and 3600000, got '%s'.\n", name,
                v);
        return 2;
      }
      o->min_time_ms = ms;
    } else if (strcmp(name, "--batches") == 0 || strcmp(name, "--max-batches") == 0) {
      int nb;
      if (!mlxd_parse_int(v, 1, &nb) || nb > 10000) {
        fprintf(stderr, "[bench] %s expects an integer from 1 to 10000, got '%s'.\n", name, v);
        return 2;
      }
      if (name[2] == 'b')
        o->batches = nb;
      else
        o->max_batches = nb;
    } else if (strcmp(name, "--max-iters") == 0) {
      if (!mlxd_parse_int(v, 1, &o->max_iters)) {
        fprintf(stderr, "[bench] %s expects an integer >= 1, got '%s'.\n", name, v);
        return 2;
      }
    } else if (strcmp(name, "--op") == 0) {
      memset(o->ops, 0, sizeof o->ops);
      char list[256];
      snprintf(list, sizeof list, "%s", v);
      bool any = false;
      for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
           tok = strtok_r(NULL, ",", &save)) {
        bool found = false;
        if (strcmp(tok, "all") == 0) {
          for (int k = 0; k < MLXD_OP_COUNT; k++) o->ops[k] = true;
          found = true;
        }
        for (int k = 0; k < MLXD_OP_COUNT && !found; k++)
          if (strcmp(tok, mlxd_op_names[k]) == 0) o->ops[k] = found = true;
        if (!found) {
          fprintf(stderr,
                  "[bench] --op '%s' is not an op; expected all_sum, all_max, all_gather, "
                  "sum_scatter, sendrecv, sendrecv_bw, all_to_all or all.\n",
                  tok);
          return 2;
        }
        any = true;
      }
      if (!any) {
        fprintf(stderr, "[bench] --op needs at least one op name.\n");
        return 2;
      }
    } else if (strcmp(name, "-b") == 0 || strcmp(name, "--min-bytes") == 0 ||
               strcmp(name, "-e") == 0 || strcmp(name, "--max-bytes") == 0) {
      size_t sz;
      if (!mlxd_bench_parse_size(v, &sz) || sz == 0) {
        fprintf(stderr,
                "[bench] %s expects a positive size in bytes (K/M/G suffixes allowed), "
                "got '%s'.\n",
                name, v);
        return 2;
      }
      if (name[1] == 'b' || strcmp(name, "--min-bytes") == 0)
        o->min_bytes = sz;
      else
        o->max_bytes = sz;
    } else if (strcmp(name, "-f") == 0 || strcmp(name, "--factor") == 0) {
      char* end = NULL;
      double f = strtod(v, &end);
      if (end == v || *end || !(f > 1.0) || f > 1e6) {
        fprintf(stderr, "[bench] %s expects a number greater than 1, got '%s'.\n", name, v);
        return 2;
      }
      o->factor = f;
    } else if (strcmp(name, "-n") == 0 || strcmp(name, "--iters") == 0) {
      if (!mlxd_parse_int(v, 1, &o->iters)) {
        fprintf(stderr, "[bench] %s expects an integer >= 1, got '%s'.\n", name, v);
        return 2;
      }
    } else if (strcmp(name, "-w") == 0 || strcmp(name, "--warmup") == 0) {
      if (!mlxd_parse_int(v, 0, &o->warmup)) {
        fprintf(stderr, "[bench] %s expects an integer >= 0, got '%s'.\n", name, v);
        return 2;
      }
    } else if (strcmp(name, "--dtype") == 0) {
      o->dtype = mlxd_bench_find_dtype(v);
      if (!o->dtype) {
        fprintf(stderr,
                "[bench] --dtype '%s' is not supported; expected one of bool, uint8, "
                "uint16, uint32, uint64, int8, int16, int32, int64, float16, float32, "
                "float64, bfloat16.\n",
                v);
        return 2;
      }
    } else if (strcmp(name, "--backend") == 0) {
      o->backend = v;
    } else {
      fprintf(stderr, "[bench] unknown argument '%s'; run '%s --help' for the options.\n", a, prog);
      return 2;
    }
  }
  if (o->max_batches > 0 && o->max_batches < o->batches) {
    fprintf(stderr, "[bench] --max-batches (%d) is smaller than --batches (%d).\n", o->max_batches,
            o->batches);
    return 2;
  }
  if (o->max_iters < o->iters) {
    fprintf(stderr, "[bench] --max-iters (%d) is smaller than --iters (%d).\n", o->max_iters,
            o->iters);
    return 2;
  }
  if (o->min_bytes > o->max_bytes) {
    fprintf(stderr, "[bench] --min-bytes (%zu) is larger than --max-bytes (%zu).\n", o->min_bytes,
            o->max_bytes);
    return 2;
  }
  return 0;
}

size_t mlxd_bench_next_size(const mlxd_bench_opts* o, size_t bytes) {
  double next = (double)bytes * o->factor;
  if (next >= (double)SIZE_MAX) return 0;
  size_t n = (size_t)next;
  if (n <= bytes) n = bytes + 1;
  return n;
}

double mlxd_bench_busbw_factor(mlxd_bench_op op, int n) {
  switch (op) {
    case MLXD_OP_ALL_SUM:
    case MLXD_OP_ALL_MAX: return 2.0 * (n - 1) / n;
    case MLXD_OP_ALL_GATHER:
    case MLXD_OP_SUM_SCATTER:
    case MLXD_OP_ALL_TO_ALL: return (double)(n - 1) / n;
    default: return 1.0;
  }
}

bool mlxd_bench_shape_for(mlxd_bench_op op, size_t bytes, size_t elt, int n, mlxd_bench_shape* s) {
  size_t count = bytes / elt;
  memset(s, 0, sizeof *s);
  switch (op) {
    case MLXD_OP_ALL_GATHER:
      s->in_count = count / (size_t)n;
      s->out_count = s->in_count * (size_t)n;
      s->row_count = s->out_count;
      break;
    case MLXD_OP_SUM_SCATTER:
      s->out_count = count / (size_t)n;
      s->in_count = s->out_count * (size_t)n;
      s->row_count = s->in_count;
      break;
    case MLXD_OP_ALL_TO_ALL:
      s->in_count = s->out_count = s->row_count = count / (size_t)n * (size_t)n;
      break;
    default: s->in_count = s->out_count = s->row_count = count; break;
  }
  s->row_bytes = s->row_count * elt;
  return s->in_count > 0 && s->out_count > 0;
}

/* ---- the data pattern ---- */

static unsigned mlxd_pattern_mod(const mlxd_bench_dtype* dt) {
  /* keep every sum exactly representable: 1-byte integers and bfloat16 get small values */
  return (dt->size == 1 || dt->kind == MLXD_K_BF16) ? 5u : 61u;
}

double mlxd_bench_value(const mlxd_bench_dtype* dt, int rank, size_t i) {
  if (dt->kind == MLXD_K_BOOL) return ((i + (size_t)rank) % 3 == 0) ? 1.0 : 0.0;
  return (double)((i * 7u + (size_t)rank * 13u) % mlxd_pattern_mod(dt));
}

double mlxd_bench_expected_sum(const mlxd_bench_dtype* dt, int n, size_t i) {
  double s = 0;
  for (int r = 0; r < n; r++) s += mlxd_bench_value(dt, r, i);
  if (dt->kind == MLXD_K_BOOL) return s > 0 ? 1.0 : 0.0;
  return s;
}

double mlxd_bench_expected_max(const mlxd_bench_dtype* dt, int n, size_t i) {
  double m = mlxd_bench_value(dt, 0, i);
  for (int r = 1; r < n; r++) {
    double v = mlxd_bench_value(dt, r, i);
    if (v > m) m = v;
  }
  return m;
}

static uint16_t mlxd_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t e = (int32_t)((x >> 23) & 0xffu);
  uint32_t mant = x & 0x7fffffu;
  if (e == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0u));
  e = e - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    unsigned shift = (unsigned)(14 - e);
    uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = sign | ((uint32_t)e << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)h;
}

static float mlxd_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float f;
  if (e == 0) {
    f = (float)mant / 16777216.0f; /* mant * 2^-24 */
    return sign ? -f : f;
  }
  uint32_t x = e == 31 ? (sign | 0x7f800000u | (mant << 13))
                       : (sign | ((e - 15u + 127u) << 23) | (mant << 13));
  memcpy(&f, &x, 4);
  return f;
}

void mlxd_bench_store(const mlxd_bench_dtype* dt, void* buf, size_t i, double v) {
  char* p = (char*)buf + i * dt->size;
  switch (dt->kind) {
    case MLXD_K_BOOL: {
      uint8_t b = v != 0;
      memcpy(p, &b, 1);
      return;
    }
    case MLXD_K_UINT: {
      uint64_t u = (uint64_t)v;
      if (dt->size == 1) {
        uint8_t x = (uint8_t)u;
        memcpy(p, &x, 1);
      } else if (dt->size == 2) {
        uint16_t x = (uint16_t)u;
        memcpy(p, &x, 2);
      } else if (dt->size == 4) {
        uint32_t x = (uint32_t)u;
        memcpy(p, &x, 4);
      } else
        memcpy(p, &u, 8);
      return;
    }
    case MLXD_K_INT: {
      int64_t s = (int64_t)v;
      if (dt->size == 1) {
        int8_t x = (int8_t)s;
        memcpy(p, &x, 1);
      } else if (dt->size == 2) {
        int16_t x = (int16_t)s;
        memcpy(p, &x, 2);
      } else if (dt->size == 4) {
        int32_t x = (int32_t)s;
        memcpy(p, &x, 4);
      } else
        memcpy(p, &s, 8);
      return;
    }
    case MLXD_K_FLOAT:
      if (dt->size == 4) {
        float x = (float)v;
        memcpy(p, &x, 4);
      } else {
        memcpy(p, &v, 8);
      }
      return;
    case MLXD_K_F16: {
      uint16_t x = mlxd_f32_to_f16((float)v);
      memcpy(p, &x, 2);
      return;
    }
    case MLXD_K_BF16: {
      float f = (float)v;
      uint32_t x;
      memcpy(&x, &f, 4);
      uint16_t b = (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
      memcpy(p, &b, 2);
      return;
    }
  }
}

double mlxd_bench_load(const mlxd_bench_dtype* dt, const void* buf, size_t i) {
  const char* p = (const char*)buf + i * dt->size;
  switch (dt->kind) {
    case MLXD_K_BOOL: {
      uint8_t b;
      memcpy(&b, p, 1);
      return b != 0;
    }
    case MLXD_K_UINT:
      if (dt->size == 1) {
        uint8_t x;
        memcpy(&x, p, 1);
        return x;
      }
      if (dt->size == 2) {
        uint16_t x;
        memcpy(&x, p, 2);
        return x;
      }
      if (dt->size == 4) {
        uint32_t x;
        memcpy(&x, p, 4);
        return x;
      }
      {
        uint64_t x;
        memcpy(&x, p, 8);
        return (double)x;
      }
    case MLXD_K_INT:
      if (dt->size == 1) {
        int8_t x;
        memcpy(&x, p, 1);
        return x;
      }
      if (dt->size == 2) {
        int16_t x;
        memcpy(&x, p, 2);
        return x;
      }
      if (dt->size == 4) {
        int32_t x;
        memcpy(&x, p, 4);
        return x;
      }
      {
        int64_t x;
        memcpy(&x, p, 8);
        return (double)x;
      }
    case MLXD_K_FLOAT:
      if (dt->size == 4) {
        float x;
        memcpy(&x, p, 4);
        return x;
      }
      {
        double x;
        memcpy(&x, p, 8);
        return x;
      }
    case MLXD_K_F16: {
      uint16_t x;
      memcpy(&x, p, 2);
      return mlxd_f16_to_f32(x);
    }
    case MLXD_K_BF16: {
      uint16_t b;
      memcpy(&b, p, 2);
      uint32_t x = (uint32_t)b << 16;
      float f;
      memcpy(&f, &x, 4);
      return f;
    }
  }
  return 0;
}

void mlxd_bench_fill(const mlxd_bench_dtype* dt, void* buf, size_t count, int rank) {
  for (size_t i = 0; i < count; i++) mlxd_bench_store(dt, buf, i, mlxd_bench_value(dt, rank, i));
}

size_t mlxd_bench_verify(const mlxd_bench_dtype* dt, mlxd_bench_op op, const void* buf,
                         size_t count, int rank, int n, int peer) {
  size_t bad = 0;
  size_t block = (op == MLXD_OP_ALL_GATHER || op == MLXD_OP_ALL_TO_ALL) ? count / (size_t)n : count;
  for (size_t j = 0; j < count; j++) {
    double want;
    switch (op) {
      case MLXD_OP_ALL_SUM: want = mlxd_bench_expected_sum(dt, n, j); break;
      case MLXD_OP_ALL_MAX: want = mlxd_bench_expected_max(dt, n, j); break;
      case MLXD_OP_ALL_GATHER: want = mlxd_bench_value(dt, (int)(j / block), j % block); break;
      case MLXD_OP_SUM_SCATTER:
        want = mlxd_bench_expected_sum(dt, n, (size_t)rank * count + j);
        break;
      case MLXD_OP_ALL_TO_ALL:
        want = mlxd_bench_value(dt, (int)(j / block), (size_t)rank * block + j % block);
        break;
      default: want = mlxd_bench_value(dt, peer, j); break;
    }
    if (mlxd_bench_load(dt, buf, j) != want) bad++;
  }
  return bad;
}

/* ---- output ---- */

static const char* mlxd_bench_impl_name = "";

void mlxd_bench_print_title(const mlxd_bench_opts* o, const char* impl, int n) {
  mlxd_bench_impl_name = impl;
  if (o->csv) {
    printf(
        "impl,op,ranks,size,count,dtype,time_us,algbw_gbps,busbw_gbps,cpu_us,check,iters,"
        "batches,batch_min_us,batch_max_us%s\n",
        o->account ? ",minflt_r0,minflt_max,majflt_r0,majflt_max,csw_r0,csw_max,instr_r0,"
                     "instr_max,syscalls_r0,syscalls_max"
                   : "");
    return;
  }
  printf("# %s: %d ranks, dtype %s, sizes %zu..%zu bytes x%g, check %s\n", impl, n, o->dtype->name,
         o->min_bytes, o->max_bytes, o->factor, o->check ? "on" : "off");
  if (o->min_time_ms > 0)
    printf(
        "# per size: %d warm-up, then %d-%d batches of %d-%d iterations timing >= %g ms in "
        "all;\n",
        o->warmup, o->batches, mlxd_bench_batch_limit(o), o->iters, o->max_iters, o->min_time_ms);
  else
    printf("# per size: %d warm-up, then %d batches of %d iterations;\n", o->warmup, o->batches,
           o->iters);
  printf("# time = median over the batches of the slowest rank's time per op%s\n",
         o->bind ? "; ranks pinned to CPU rank mod CPUs" : "");
  if (o->account)
    printf(
        "# account: per op over the timed batches, r0 rank 0, mx the max over ranks: page "
        "faults minor/major, context switches, user-space instructions, system calls\n");
}

/* The --account columns: a count per op, or n/a. */
static const int mlxd_acct_width[MLXD_ACCT_N] = {10, 10, 9, 12, 9};
static const char* const mlxd_acct_head[MLXD_ACCT_N][2] = {{"minflt(r0)", "minflt(mx)"},
                                                           {"majflt(r0)", "majflt(mx)"},
                                                           {"csw(r0)", "csw(mx)"},
                                                           {"instr(r0)", "instr(mx)"},
                                                           {"sysc(r0)", "sysc(mx)"}};

static void mlxd_acct_value(const mlxd_bench_opts* o, int k, double v) {
  int prec = k == MLXD_ACCT_INSTR ? 0 : 3;
  int w = o->csv ? 0 : mlxd_acct_width[k];
  fputs(o->csv ? "," : " ", stdout);
  if (v < 0)
    printf("%*s", w, "n/a");
  else
    printf("%*.*f", w, prec, v);
}

void mlxd_bench_print_header(const mlxd_bench_opts* o, mlxd_bench_op op) {
  if (o->csv) return;
  printf("#\n# op: %s\n", mlxd_bench_op_name(op));
  printf("# %10s %12s %9s %11s %11s %11s %10s %6s %7s %4s %s", "size(B)", "count", "dtype",
         "time(us)", "algbw(GB/s)", "busbw(GB/s)", "cpu(us)", "check", "iters", "bat",
         o->account ? "batches min-max(us)" : "batches min-max(us)\n");
  if (!o->account) return;
  for (int k = 0; k < MLXD_ACCT_N; k++)
    printf(" %*s %*s", mlxd_acct_width[k], mlxd_acct_head[k][0], mlxd_acct_width[k],
           mlxd_acct_head[k][1]);
  printf("\n");
}

void mlxd_bench_print_row(const mlxd_bench_opts* o, mlxd_bench_op op, int n,
                          const mlxd_bench_shape* s, const mlxd_bench_result* r,
                          const char* check) {
  double time_us = r->time_s * 1e6, cpu_us = r->cpu_s * 1e6;
  double algbw = time_us > 0 ? (double)s->row_bytes / time_us / 1e3 : 0.0;
  double busbw = algbw * mlxd_bench_busbw_factor(op, n);
  if (o->csv) {
    printf("%s,%s,%d,%zu,%zu,%s,%.3f,%.4f,%.4f,%.3f,%s,%ld,%d,%.3f,%.3f", mlxd_bench_impl_name,
           mlxd_bench_op_name(op), n, s->row_bytes, s->row_count, o->dtype->name, time_us, algbw,
           busbw, cpu_us, check, r->iters, r->batches, r->min_s * 1e6, r->max_s * 1e6);
  } else {
    char span[64];
    snprintf(span, sizeof span, "%.2f-%.2f", r->min_s * 1e6, r->max_s * 1e6);
    /* the last column; padded to its header's width when columns follow */
    printf("  %10zu %12zu %9s %11.2f %11.3f %11.3f %10.2f %6s %7ld %4d %-*s", s->row_bytes,
           s->row_count, o->dtype->name, time_us, algbw, busbw, cpu_us, check, r->iters, r->batches,
           o->account ? 19 : 0, span);
  }
  if (o->account)
    for (int k = 0; k < MLXD_ACCT_N; k++) {
      mlxd_acct_value(o, k, r->acct[k]);
      mlxd_acct_value(o, k, r->acct_max[k]);
    }
  printf("\n");
  fflush(stdout);
}

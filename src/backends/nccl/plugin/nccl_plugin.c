/* libmlxdist-nccl.so: MLX's NCCL backend as an mlxdist plugin (ABI v4,
 * include/mlx/c/plugin/plugin_v4.h; docs/nccl.md).
 *
 * Built only where the CUDA runtime and NCCL headers are found at configure
 * time (for their types); it links neither: libcudart.so.13 (or .12) and
 * libnccl.so.2 are opened at run time, so the plugin loads everywhere and
 * says why it cannot be used (no CUDA runtime, no NCCL, no GPU).
 *
 * The ncclUniqueId travels through the bootstrap create is given: the core
 * (backends/nccl/nccl_kind.c) passes its authenticated side channel
 * (exchange.h: NCCL_HOST_IP/NCCL_PORT, the job token, the secret) or the
 * caller's all-gather. The bootstrap is used only inside create.
 *
 * Ops: the ops of ABI v1-v3 (all_reduce ... recv) are handed host memory
 * (the core's arrays), so each stages through device memory on the
 * instance's own CUDA stream: copy in, the NCCL call, copy out. all_to_all
 * comes through v4's run (p_run), told each buffer's memory kind and the
 * caller's stream: grouped ncclSend/ncclRecv (ncclGroupStart/End) to every
 * other rank and a device copy of its own part, on the caller's CUDA stream
 * when it is on this instance's GPU, straight from and into device or
 * managed memory, staged only for host memory. Every op ends in a wait that
 * polls the stream and ncclCommGetAsyncError, bounded by MLXDIST_TIMEOUT; a
 * timeout, an asynchronous error or v4's abort aborts the communicator
 * (ncclCommAbort) and fails this op and every later one naming the rank and
 * op; so does any failure after work was queued on the stream
 * (fail_queued). Nothing exits the process. One op at a time per instance
 * (a mutex): NCCL communicators are not for concurrent calls. NOT YET RUN
 * ON A GPU (docs/nccl.md). */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mlx/c/plugin/plugin_v4.h"

#define API __attribute__((visibility("default")))

/* ---- the libraries, by dlopen ---- */

static struct {
  cudaError_t (*get_device_count)(int*);
  cudaError_t (*set_device)(int);
  cudaError_t (*runtime_version)(int*);
  const char* (*error_string)(cudaError_t);
  cudaError_t (*stream_create)(cudaStream_t*, unsigned);
  cudaError_t (*stream_query)(cudaStream_t);
  cudaError_t (*stream_destroy)(cudaStream_t);
  cudaError_t (*malloc_)(void**, size_t);
  cudaError_t (*free_)(void*);
  cudaError_t (*malloc_host)(void**, size_t);
  cudaError_t (*free_host)(void*);
  cudaError_t (*memcpy_async)(void*, const void*, size_t, enum cudaMemcpyKind, cudaStream_t);
  ncclResult_t (*get_version)(int*);
  ncclResult_t (*get_unique_id)(ncclUniqueId*);
  ncclResult_t (*init_rank_config)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
  ncclResult_t (*async_error)(ncclComm_t, ncclResult_t*);
  ncclResult_t (*abort_)(ncclComm_t);
  ncclResult_t (*destroy)(ncclComm_t);
  ncclResult_t (*finalize)(ncclComm_t);
  ncclResult_t (*split)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*);
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t);
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*reduce_scatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                 ncclComm_t, cudaStream_t);
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*group_start)(void);
  ncclResult_t (*group_end)(void);
  const char* (*nccl_error_string)(ncclResult_t);
  ncclResult_t (*count)(ncclComm_t, int*);
  ncclResult_t (*user_rank)(ncclComm_t, int*);
} L;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_ok;
static char g_why[320];
static int g_devices, g_nccl_version, g_cuda_version;
static const mlxdist_v4_host* g_host;

static bool sym(void* h, const char* name, void* slot) {
  void* p = dlsym(h, name);
  memcpy(slot, &p, sizeof p);
  return p != NULL;
}

/* The CUDA runtime already in this process, found by its file name
 * (libcudart.so*): the one libmlxdist's GPU provider opened. */
static int find_cudart(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size;
  const char* name = info->dlpi_name;
  const char* base = name ? strrchr(name, '/') : NULL;
  base = base ? base + 1 : name;
  if (!base || strncmp(base, "libcudart.so", 12) != 0) return 0;
  snprintf(data, 512, "%s", name);
  return 1;
}

static void load(void) {
  /* One choice of CUDA runtime, the core's: its GPU provider opens
   * MLXDIST_CUDART (checked as every tunable) or libcudart.so.13/.12 before
   * the nccl kind asks this plugin anything (backends/nccl/nccl_kind.c);
   * this plugin opens the same library again, never another one. */
  char cudart[512] = "";
  void* c = NULL;
  if (dl_iterate_phdr(find_cudart, cudart)) c = dlopen(cudart, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!c) {
    snprintf(g_why, sizeof g_why,
             "[nccl] no CUDA runtime (libmlxdist's GPU provider loaded none: MLXDIST_CUDART, "
             "else libcudart.so.13 or .12; mlxdist-info says why)");
    return;
  }
  bool ok = sym(c, "cudaGetDeviceCount", &L.get_device_count) &&
            sym(c, "cudaSetDevice", &L.set_device) &&
            sym(c, "cudaRuntimeGetVersion", &L.runtime_version) &&
            sym(c, "cudaGetErrorString", &L.error_string) &&
            sym(c, "cudaStreamCreateWithFlags", &L.stream_create) &&
            sym(c, "cudaStreamQuery", &L.stream_query) &&
            sym(c, "cudaStreamDestroy", &L.stream_destroy) && sym(c, "cudaMalloc", &L.malloc_) &&
            sym(c, "cudaFree", &L.free_) && sym(c, "cudaMallocHost", &L.malloc_host) &&
            sym(c, "cudaFreeHost", &L.free_host) && sym(c, "cudaMemcpyAsync", &L.memcpy_async);
  if (!ok) {
    snprintf(g_why, sizeof g_why, "[nccl] the CUDA runtime lacks an entry point mlxdist uses");
    return;
  }
  L.runtime_version(&g_cuda_version);
  void* n = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!n) {
    const char* e = dlerror();
    snprintf(g_why, sizeof g_why, "[nccl] libnccl.so.2 cannot be loaded (%.200s)",
             e ? e : "not found");
    return;
  }
  ok = sym(n, "ncclGetVersion", &L.get_version) && sym(n, "ncclGetUniqueId", &L.get_unique_id) &&
       sym(n, "ncclCommInitRankConfig", &L.init_rank_config) &&
       sym(n, "ncclCommGetAsyncError", &L.async_error) && sym(n, "ncclCommAbort", &L.abort_) &&
       sym(n, "ncclCommDestroy", &L.destroy) && sym(n, "ncclCommFinalize", &L.finalize) &&
       sym(n, "ncclCommSplit", &L.split) && sym(n, "ncclAllReduce", &L.all_reduce) &&
       sym(n, "ncclAllGather", &L.all_gather) && sym(n, "ncclReduceScatter", &L.reduce_scatter) &&
       sym(n, "ncclSend", &L.send) && sym(n, "ncclRecv", &L.recv) &&
       sym(n, "ncclGroupStart", &L.group_start) && sym(n, "ncclGroupEnd", &L.group_end) &&
       sym(n, "ncclGetErrorString", &L.nccl_error_string) && sym(n, "ncclCommCount", &L.count) &&
       sym(n, "ncclCommUserRank", &L.user_rank);
  if (!ok) {
    snprintf(g_why, sizeof g_why,
             "[nccl] libnccl.so.2 lacks an entry point mlxdist uses (NCCL older than 2.18?)");
    return;
  }
  L.get_version(&g_nccl_version);
  int count = 0;
  cudaError_t e = L.get_device_count(&count);
  if (e != cudaSuccess || count <= 0) {
    snprintf(g_why, sizeof g_why,
             "[nccl] no GPU: CUDA runtime %d.%d loaded but cudaGetDeviceCount: %s (NCCL %d.%d.%d "
             "is present)",
             g_cuda_version / 1000, g_cuda_version % 1000 / 10,
             e != cudaSuccess ? L.error_string(e) : "no device", g_nccl_version / 10000,
             g_nccl_version / 100 % 100, g_nccl_version % 100);
    return;
  }
  g_devices = count;
  g_ok = true;
}

/* ---- status ---- */

__attribute__((format(printf, 3, 4))) static int32_t fail(mlxdist_v4_status* st, int32_t code,
                                                          const char* fmt, ...) {
  memset(st, 0, sizeof *st);
  st->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(st->msg, sizeof st->msg, fmt, ap);
  va_end(ap);
  return code;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- instances ---- */

typedef struct inst {
  mlxdist_v4_backend base; /* first */
  pthread_mutex_t mu;      /* one op at a time */
  ncclComm_t comm;
  cudaStream_t stream;
  int device;
  void* dbuf; /* staging: device memory, dcap bytes */
  size_t dcap;
  /* Results come back through pinned memory: a copy into pageable memory
   * would block this thread until the NCCL call before it ends (CUDA's
   * rule for device-to-pageable copies), which no timeout could bound. */
  void* hbuf; /* pinned host memory, hcap bytes */
  size_t hcap;
  bool failed; /* aborted: every later op fails with fail_msg */
  char fail_msg[MLXDIST_V4_MSG_MAX];
  /* v4's abort, from any thread without the mutex (an op may hold it for
   * MLXDIST_TIMEOUT): 0 none, 1 writing abort_msg, 2 published. The op in
   * progress (its wait) or the next op aborts the communicator. */
  atomic_int abort_state;
  char abort_msg[MLXDIST_V4_MSG_MAX];
} inst;

static const mlxdist_v4_ops k_ops;
static int32_t wait_on(inst* b, ncclComm_t comm, const char* what, uint64_t seq,
                       cudaStream_t stream, mlxdist_v4_status* st);

/* ncclCommAbort: never blocks on peers; the instance forgets the communicator. */
static void abort_comm(inst* b, ncclComm_t comm) {
  if (!comm) return;
  L.abort_(comm);
  if (comm == b->comm) b->comm = NULL;
}

/* Poll until the communicator is no longer "in progress" (init, split, a
 * queued op) and the stream has drained, bounded by MLXDIST_TIMEOUT. */
static int32_t wait_comm(inst* b, const char* what, uint64_t seq, bool stream_too,
                         mlxdist_v4_status* st) {
  return wait_on(b, b->comm, what, seq, stream_too ? b->stream : NULL, st);
}

/* An abort published (v4, p_abort): under b->mu, abort the communicator
 * (and comm, a split's new one) and fail the instance with the reason.
 * Returns whether it did. */
static bool take_abort(inst* b, ncclComm_t comm, const char* what, uint64_t seq) {
  if (atomic_load_explicit(&b->abort_state, memory_order_acquire) != 2) return false;
  if (comm && comm != b->comm) abort_comm(b, comm);
  abort_comm(b, b->comm);
  if (!b->failed) {
    b->failed = true;
    snprintf(b->fail_msg, sizeof b->fail_msg, "[nccl] %s #%llu on rank %d: aborted: %.400s", what,
             (unsigned long long)seq, b->base.rank, b->abort_msg);
  }
  return true;
}

/* wait_comm on comm (b's own, or a split's new one; aborted on failure),
 * and on stream (NULL: none). */
static int32_t wait_on(inst* b, ncclComm_t comm, const char* what, uint64_t seq,
                       cudaStream_t stream, mlxdist_v4_status* st) {
  double deadline = now_s() + (g_host ? g_host->timeout_s() : 60.0);
  for (unsigned i = 0;; i++) {
    if (take_abort(b, comm, what, seq)) return fail(st, MLXDIST_V4_EABORTED, "%s", b->fail_msg);
    ncclResult_t ar = ncclSuccess;
    if (comm) L.async_error(comm, &ar);
    cudaError_t ce = stream ? L.stream_query(stream) : cudaSuccess;
    if (ar != ncclSuccess && ar != ncclInProgress) {
      abort_comm(b, comm);
      b->failed = true;
      snprintf(b->fail_msg, sizeof b->fail_msg,
               "[nccl] %s #%llu on rank %d: %s (communicator aborted)", what,
               (unsigned long long)seq, b->base.rank, L.nccl_error_string(ar));
      return fail(st, MLXDIST_V4_EREMOTE, "%s", b->fail_msg);
    }
    if (ce != cudaSuccess && ce != cudaErrorNotReady) {
      abort_comm(b, comm);
      b->failed = true;
      snprintf(b->fail_msg, sizeof b->fail_msg, "[nccl] %s #%llu on rank %d: CUDA: %s", what,
               (unsigned long long)seq, b->base.rank, L.error_string(ce));
      return fail(st, MLXDIST_V4_EREMOTE, "%s", b->fail_msg);
    }
    if (ar == ncclSuccess && ce == cudaSuccess) return 0;
    if (now_s() >= deadline) {
      abort_comm(b, comm);
      b->failed = true;
      snprintf(b->fail_msg, sizeof b->fail_msg,
               "[nccl] %s #%llu on rank %d: not complete after %g s (MLXDIST_TIMEOUT): a peer "
               "is dead or never reached this op; the communicator was aborted",
               what, (unsigned long long)seq, b->base.rank, g_host ? g_host->timeout_s() : 60.0);
      return fail(st, MLXDIST_V4_ETIMEDOUT, "%s", b->fail_msg);
    }
    if (i > 1000) usleep(50);
  }
}

static ncclConfig_t nonblocking(void) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0; /* init, split and ops return at once: wait_comm bounds them */
  return c;
}

static inst* inst_new(int rank, int size, int device, mlxdist_v4_status* st) {
  inst* b = calloc(1, sizeof *b);
  if (!b) {
    fail(st, MLXDIST_V4_ENOMEM, "[nccl] out of memory");
    return NULL;
  }
  b->base = (mlxdist_v4_backend){.ops = &k_ops,
                                 .rank = rank,
                                 .size = size,
                                 .device = MLXDIST_V4_DEVICE_GPU};
  pthread_mutex_init(&b->mu, NULL);
  b->device = device;
  cudaError_t e = L.set_device(b->device);
  if (e == cudaSuccess) e = L.stream_create(&b->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    fail(st, MLXDIST_V4_ESYS, "[nccl] rank %d: CUDA device %d: %s", rank, b->device,
         L.error_string(e));
    pthread_mutex_destroy(&b->mu);
    free(b);
    return NULL;
  }
  return b;
}

/* Finalize (flushes pending work, non-blocking here), wait for it within
 * MLXDIST_TIMEOUT, then destroy; a communicator that cannot finalize is aborted. */
static void close_comm(inst* b) {
  if (!b->comm) return;
  ncclResult_t r = L.finalize(b->comm);
  double deadline = now_s() + (g_host ? g_host->timeout_s() : 60.0);
  while (r == ncclSuccess || r == ncclInProgress) {
    ncclResult_t ar = ncclSuccess;
    L.async_error(b->comm, &ar);
    if (ar == ncclSuccess) break;
    if (ar != ncclInProgress || now_s() >= deadline) {
      r = ar == ncclInProgress ? ncclInternalError : ar;
      break;
    }
    usleep(100);
  }
  if (r == ncclSuccess || r == ncclInProgress)
    L.destroy(b->comm);
  else
    L.abort_(b->comm);
  b->comm = NULL;
}

static void inst_free(inst* b) {
  close_comm(b);
  if (b->dbuf) L.free_(b->dbuf);
  if (b->hbuf) L.free_host(b->hbuf);
  if (b->stream) L.stream_destroy(b->stream);
  pthread_mutex_destroy(&b->mu);
  free(b);
}

static void p_destroy(mlxdist_v4_backend* base) { inst_free((inst*)base); }

/* Staging of n device bytes and h pinned host bytes. */
static int32_t need(inst* b, size_t n, size_t h, mlxdist_v4_status* st) {
  if (h > b->hcap) {
    if (b->hbuf) L.free_host(b->hbuf);
    b->hbuf = NULL;
    b->hcap = 0;
    cudaError_t e = L.malloc_host(&b->hbuf, h);
    if (e != cudaSuccess) {
      b->hbuf = NULL;
      return fail(st, MLXDIST_V4_ENOMEM, "[nccl] rank %d: cudaMallocHost of %zu bytes: %s",
                  b->base.rank, h, L.error_string(e));
    }
    b->hcap = h;
  }
  if (n <= b->dcap) return 0;
  if (b->dbuf) L.free_(b->dbuf);
  b->dbuf = NULL;
  b->dcap = 0;
  cudaError_t e = L.malloc_(&b->dbuf, n);
  if (e != cudaSuccess) {
    b->dbuf = NULL;
    return fail(st, MLXDIST_V4_ENOMEM, "[nccl] rank %d: cudaMalloc of %zu bytes: %s", b->base.rank,
                n, L.error_string(e));
  }
  b->dcap = n;
  return 0;
}

/* NCCL's type for a reduction of dtype, or -1 (*mul: element count factor). */
static int nccl_type(mlxdist_v4_dtype d, mlxdist_v4_op op, size_t* mul) {
  *mul = 1;
  switch (d) {
    case MLXDIST_V4_DTYPE_UINT8: return ncclUint8;
    case MLXDIST_V4_DTYPE_INT8: return ncclInt8;
    case MLXDIST_V4_DTYPE_UINT32: return ncclUint32;
    case MLXDIST_V4_DTYPE_INT32: return ncclInt32;
    case MLXDIST_V4_DTYPE_UINT64: return ncclUint64;
    case MLXDIST_V4_DTYPE_INT64: return ncclInt64;
    case MLXDIST_V4_DTYPE_FLOAT16: return ncclFloat16;
    case MLXDIST_V4_DTYPE_FLOAT32: return ncclFloat32;
    case MLXDIST_V4_DTYPE_FLOAT64: return ncclFloat64;
    case MLXDIST_V4_DTYPE_BFLOAT16: return ncclBfloat16;
    case MLXDIST_V4_DTYPE_COMPLEX64:
      if (op != MLXDIST_V4_OP_SUM) return -1;
      *mul = 2; /* a sum of complex64 is the sum of its float32 parts: exact */
      return ncclFloat32;
    default: return -1;
  }
}

static const char* k_dtype_names[] = {"bool",    "uint8",   "uint16",   "uint32",   "uint64",
                                      "int8",    "int16",   "int32",    "int64",    "float16",
                                      "float32", "float64", "bfloat16", "complex64"};
static const char* k_op_names[] = {"all_sum", "all_max", "all_min"};

static int32_t begin(inst* b, const char* what, uint64_t seq, mlxdist_v4_status* st) {
  pthread_mutex_lock(&b->mu);
  take_abort(b, NULL, what, seq);
  if (b->failed) {
    fail(st, MLXDIST_V4_EABORTED, "[nccl] %s #%llu not attempted: %s", what,
         (unsigned long long)seq, b->fail_msg);
    pthread_mutex_unlock(&b->mu);
    return MLXDIST_V4_EABORTED;
  }
  L.set_device(b->device);
  return 0;
}

static int32_t cuda_step(inst* b, cudaError_t e, const char* what, uint64_t seq,
                         mlxdist_v4_status* st) {
  if (e == cudaSuccess) return 0;
  return fail(st, MLXDIST_V4_ESYS, "[nccl] %s #%llu on rank %d: CUDA: %s", what,
              (unsigned long long)seq, b->base.rank, L.error_string(e));
}

static int32_t nccl_step(inst* b, ncclResult_t r, const char* what, uint64_t seq,
                         mlxdist_v4_status* st) {
  if (r == ncclSuccess || r == ncclInProgress) return 0;
  return fail(st, MLXDIST_V4_EREMOTE, "[nccl] %s #%llu on rank %d: %s", what,
              (unsigned long long)seq, b->base.rank, L.nccl_error_string(r));
}

/* An op failed after work was queued on the instance's stream (a copy
 * in, an NCCL call): that work may still run and use the staging buffers,
 * and freeing or reallocating them (cudaFree, cudaMallocHost) or a pageable
 * copy would wait for it without bound. So the communicator is aborted and
 * the instance failed: later ops fail at once with this first status, and
 * nothing touches the buffers until destroy. rc and st are the failure's. */
static int32_t fail_queued(inst* b, int32_t rc, mlxdist_v4_status* st) {
  if (!rc || b->failed) return rc; /* wait_on has already aborted and recorded it */
  abort_comm(b, b->comm);
  b->failed = true;
  snprintf(b->fail_msg, sizeof b->fail_msg, "%.*s (communicator aborted)",
           (int)(sizeof b->fail_msg - 32), st->msg);
  snprintf(st->msg, sizeof st->msg, "%s", b->fail_msg);
  return rc;
}

/* The reductions: kind 0 all_reduce, 1 reduce_scatter. */
static int32_t reduce(mlxdist_v4_backend* base, int kind, uint64_t seq, const void* in, void* out,
                      size_t count, mlxdist_v4_dtype dtype, mlxdist_v4_op op,
                      mlxdist_v4_status* st) {
  inst* b = (inst*)base;
  const char* what = kind ? "sum_scatter" : k_op_names[op];
  size_t mul = 1;
  int t = nccl_type(dtype, op, &mul);
  if (t < 0)
    return fail(st, MLXDIST_V4_EINVAL,
                "[nccl] %s #%llu: NCCL cannot reduce %s%s (mlxdist does not emulate it; use the "
                "ring backend or another dtype)",
                what, (unsigned long long)seq, k_dtype_names[dtype],
                dtype == MLXDIST_V4_DTYPE_COMPLEX64 ? " by max or min" : "");
  if (count == 0) return 0; /* every rank has the same count: nothing to move anywhere */
  size_t esize = g_host->dtype_size(dtype);
  size_t in_bytes = count * esize * (kind ? (size_t)b->base.size : 1);
  size_t out_bytes = count * esize;
  int32_t rc = begin(b, what, seq, st);
  if (rc) return rc;
  char* d = NULL;
  if (!(rc = need(b, in_bytes + out_bytes, out_bytes, st))) {
    d = b->dbuf;
    ncclRedOp_t rop = op == MLXDIST_V4_OP_SUM   ? ncclSum
                      : op == MLXDIST_V4_OP_MAX ? ncclMax
                                                : ncclMin;
    if (!(rc = cuda_step(b, L.memcpy_async(d, in, in_bytes, cudaMemcpyHostToDevice, b->stream),
                         what, seq, st)))
      rc = nccl_step(b,
                     kind ? L.reduce_scatter(d, d + in_bytes, count * mul, (ncclDataType_t)t, rop,
                                             b->comm, b->stream)
                          : L.all_reduce(d, d + in_bytes, count * mul, (ncclDataType_t)t, rop,
                                         b->comm, b->stream),
                     what, seq, st);
    if (!rc)
      rc = cuda_step(b,
                     L.memcpy_async(b->hbuf, d + in_bytes, out_bytes, cudaMemcpyDeviceToHost,
                                    b->stream),
                     what, seq, st);
    if (!rc) rc = wait_comm(b, what, seq, true, st);
    rc = fail_queued(b, rc, st); /* the copy in may have been queued */
    if (!rc) memcpy(out, b->hbuf, out_bytes);
  }
  pthread_mutex_unlock(&b->mu);
  return rc;
}

static int32_t p_all_reduce(mlxdist_v4_backend* b, uint64_t seq, const void* in, void* out,
                            size_t count, mlxdist_v4_dtype dtype, mlxdist_v4_op op,
                            mlxdist_v4_status* st) {
  return reduce(b, 0, seq, in, out, count, dtype, op, st);
}

static int32_t p_reduce_scatter(mlxdist_v4_backend* b, uint64_t seq, const void* in, void* out,
                                size_t count, mlxdist_v4_dtype dtype, mlxdist_v4_op op,
                                mlxdist_v4_status* st) {
  return reduce(b, 1, seq, in, out, count, dtype, op, st);
}

static int32_t p_all_gather(mlxdist_v4_backend* base, uint64_t seq, const void* in, void* out,
                            size_t nbytes, mlxdist_v4_status* st) {
  inst* b = (inst*)base;
  size_t total = nbytes * (size_t)b->base.size;
  if (nbytes == 0) return 0;
  int32_t rc = begin(b, "all_gather", seq, st);
  if (rc) return rc;
  if (!(rc = need(b, nbytes + total, total, st))) {
    char* d = b->dbuf;
    if (!(rc = cuda_step(b, L.memcpy_async(d, in, nbytes, cudaMemcpyHostToDevice, b->stream),
                         "all_gather", seq, st)))
      rc = nccl_step(b, L.all_gather(d, d + nbytes, nbytes, ncclInt8, b->comm, b->stream),
                     "all_gather", seq, st);
    if (!rc)
      rc = cuda_step(b,
                     L.memcpy_async(b->hbuf, d + nbytes, total, cudaMemcpyDeviceToHost, b->stream),
                     "all_gather", seq, st);
    if (!rc) rc = wait_comm(b, "all_gather", seq, true, st);
    rc = fail_queued(b, rc, st);
    if (!rc) memcpy(out, b->hbuf, total);
  }
  pthread_mutex_unlock(&b->mu);
  return rc;
}

static int32_t p2p(inst* b, bool is_send, uint64_t seq, void* buf, size_t nbytes, int32_t peer,
                   mlxdist_v4_status* st) {
  const char* what = is_send ? "send" : "recv";
  if (nbytes == 0) return 0; /* the peer's matching op has the same size */
  int32_t rc = begin(b, what, seq, st);
  if (rc) return rc;
  if (!(rc = need(b, nbytes, is_send ? 0 : nbytes, st))) {
    if (is_send)
      rc = cuda_step(b, L.memcpy_async(b->dbuf, buf, nbytes, cudaMemcpyHostToDevice, b->stream),
                     what, seq, st);
    if (!rc)
      rc = nccl_step(b,
                     is_send ? L.send(b->dbuf, nbytes, ncclInt8, peer, b->comm, b->stream)
                             : L.recv(b->dbuf, nbytes, ncclInt8, peer, b->comm, b->stream),
                     what, seq, st);
    if (!rc && !is_send)
      rc = cuda_step(b, L.memcpy_async(b->hbuf, b->dbuf, nbytes, cudaMemcpyDeviceToHost, b->stream),
                     what, seq, st);
    if (!rc) rc = wait_comm(b, what, seq, true, st);
    rc = fail_queued(b, rc, st);
    if (!rc && !is_send) memcpy(buf, b->hbuf, nbytes);
  }
  pthread_mutex_unlock(&b->mu);
  return rc;
}

static int32_t p_send(mlxdist_v4_backend* b, uint64_t seq, const void* buf, size_t nbytes,
                      int32_t dst, mlxdist_v4_status* st) {
  return p2p((inst*)b, true, seq, (void*)buf, nbytes, dst, st);
}

static int32_t p_recv(mlxdist_v4_backend* b, uint64_t seq, void* buf, size_t nbytes, int32_t src,
                      mlxdist_v4_status* st) {
  return p2p((inst*)b, false, seq, buf, nbytes, src, st);
}

static int32_t p_split(mlxdist_v4_backend* base, uint64_t seq, int32_t color, int32_t key,
                       mlxdist_v4_backend** out, mlxdist_v4_status* st) {
  inst* b = (inst*)base;
  *out = NULL;
  int32_t rc = begin(b, "split", seq, st);
  if (rc) return rc;
  ncclConfig_t cfg = nonblocking();
  ncclComm_t child = NULL;
  rc = nccl_step(b, L.split(b->comm, color, key, &child, &cfg), "split", seq, st);
  if (!rc) rc = wait_comm(b, "split", seq, false, st);
  if (!rc && child) {
    rc = wait_on(b, child, "split", seq, NULL, st);
    if (rc) {
      child = NULL; /* aborted by wait_on; the parent is failed too (a broken split) */
    }
  }
  pthread_mutex_unlock(&b->mu);
  if (rc) return rc;
  if (!child)
    return fail(st, MLXDIST_V4_EINVAL, "[nccl] split #%llu: no communicator for color %d",
                (unsigned long long)seq, color);
  /* the child's rank and size, as NCCL made them */
  int crank = 0, csize = 0;
  if (L.count(child, &csize) != ncclSuccess || L.user_rank(child, &crank) != ncclSuccess) {
    L.destroy(child);
    return fail(st, MLXDIST_V4_EINVAL,
                "[nccl] split #%llu: cannot read the new communicator's rank and size",
                (unsigned long long)seq);
  }
  inst* ci = inst_new(crank, csize, b->device, st); /* the parent's GPU */
  if (!ci) {
    L.destroy(child);
    return st->code;
  }
  ci->comm = child;
  *out = &ci->base;
  return 0;
}

/* ---- ABI v4: run (all_to_all) and abort ---- */

/* Can NCCL on b's GPU use buf in place? Managed memory (any GPU reaches it)
 * and b's own device memory: yes. Host memory: no, it is staged. Another
 * GPU's device memory or an unknown kind: refused (returns -1). */
static int direct_use(const inst* b, const mlxdist_v4_buf* buf) {
  if (buf->bytes == 0 || buf->mem == MLXDIST_V4_MEM_HOST) return 0;
  if (buf->mem == MLXDIST_V4_MEM_MANAGED) return 1;
  if (buf->mem == MLXDIST_V4_MEM_DEVICE && buf->device == b->device) return 1;
  return -1;
}

/* all_to_all: part r of in to rank r, part r of out from rank r, as one
 * NCCL group of sends and receives (NCCL 2.28's ncclAlltoAll is not
 * required), this rank's own part by a device copy. On the caller's stream
 * when it is on b's GPU (after the caller's earlier work there), else on
 * b's own; host buffers go through the staging buffers. */
static int32_t p_all_to_all(inst* b, const mlxdist_v4_call* c, mlxdist_v4_status* st) {
  const char* what = "all_to_all";
  size_t n = (size_t)b->base.size, part = c->count * g_host->dtype_size(c->dtype), total = part * n;
  int din = direct_use(b, &c->in), dout = direct_use(b, &c->out);
  if (din < 0 || dout < 0) {
    const mlxdist_v4_buf* bad = din < 0 ? &c->in : &c->out;
    return fail(st, MLXDIST_V4_EINVAL,
                "[nccl] all_to_all #%llu on rank %d: the %s is in memory of kind %d on GPU %d, "
                "which NCCL on this rank's GPU %d cannot use (host, managed or GPU %d's memory)",
                (unsigned long long)c->seq, b->base.rank, din < 0 ? "input" : "output",
                (int)bad->mem, (int)bad->device, b->device, b->device);
  }
  if (part == 0) return 0; /* every rank has the same part size: nothing to move */
  int32_t rc = begin(b, what, c->seq, st);
  if (rc) return rc;
  cudaStream_t s = c->stream && c->stream_device == b->device ? (cudaStream_t)c->stream : b->stream;
  /* staging: [in copy][out] in device memory, the result back through pinned memory */
  if (!(rc = need(b, (din ? 0 : total) + (dout ? 0 : total), dout ? 0 : total, st))) {
    const char* src = din ? (const char*)c->in.data : (const char*)b->dbuf;
    char* dst = dout ? (char*)c->out.data : (char*)b->dbuf + (din ? 0 : total);
    if (!din)
      rc = cuda_step(b, L.memcpy_async(b->dbuf, c->in.data, total, cudaMemcpyHostToDevice, s), what,
                     c->seq, st);
    size_t me = (size_t)b->base.rank;
    if (!rc)
      rc =
          cuda_step(b, L.memcpy_async(dst + me * part, src + me * part, part, cudaMemcpyDefault, s),
                    what, c->seq, st);
    if (!rc) rc = nccl_step(b, L.group_start(), what, c->seq, st);
    for (size_t r = 0; r < n && !rc; r++) {
      if (r == me) continue;
      rc = nccl_step(b, L.send(src + r * part, part, ncclInt8, (int)r, b->comm, s), what, c->seq,
                     st);
      if (!rc)
        rc = nccl_step(b, L.recv(dst + r * part, part, ncclInt8, (int)r, b->comm, s), what, c->seq,
                       st);
    }
    /* A group opened is closed, even after a failed call inside it. */
    ncclResult_t ge = L.group_end();
    if (!rc) rc = nccl_step(b, ge, what, c->seq, st);
    if (!rc && !dout)
      rc = cuda_step(b, L.memcpy_async(b->hbuf, dst, total, cudaMemcpyDeviceToHost, s), what,
                     c->seq, st);
    if (!rc) rc = wait_on(b, b->comm, what, c->seq, s, st);
    rc = fail_queued(b, rc, st);
    if (!rc && !dout) memcpy(c->out.data, b->hbuf, total);
  }
  pthread_mutex_unlock(&b->mu);
  return rc;
}

static int32_t p_run(mlxdist_v4_backend* base, const mlxdist_v4_call* c, mlxdist_v4_status* st) {
  if (c->kind == MLXDIST_V4_KIND_ALL_TO_ALL) return p_all_to_all((inst*)base, c, st);
  /* never: run_kinds names all_to_all only (the other ops are the members) */
  return fail(st, MLXDIST_V4_EUNAVAIL, "[nccl] op kind %d is not supported by this plugin's run",
              (int)c->kind);
}

/* Any thread, never blocks: publish the reason; the op waiting now (or the
 * next op) aborts the communicator under the instance's mutex. */
static void p_abort(mlxdist_v4_backend* base, const char* reason) {
  inst* b = (inst*)base;
  int none = 0;
  if (!atomic_compare_exchange_strong(&b->abort_state, &none, 1)) return;
  snprintf(b->abort_msg, sizeof b->abort_msg, "%s", reason && reason[0] ? reason : "aborted");
  atomic_store_explicit(&b->abort_state, 2, memory_order_release);
}

static void p_describe(mlxdist_v4_backend* base, char* buf, size_t len) {
  inst* b = (inst*)base;
  snprintf(buf, len, "NCCL %d.%d.%d, CUDA runtime %d.%d, GPU %d, communicator of %d%s",
           g_nccl_version / 10000, g_nccl_version / 100 % 100, g_nccl_version % 100,
           g_cuda_version / 1000, g_cuda_version % 1000 / 10, b->device, b->base.size,
           b->failed ? " (aborted)" : "");
}

static const mlxdist_v4_ops k_ops = {
    .struct_size = sizeof(mlxdist_v4_ops),
    .all_reduce = p_all_reduce,
    .all_gather = p_all_gather,
    .reduce_scatter = p_reduce_scatter,
    .send = p_send,
    .recv = p_recv,
    .split = p_split,
    .destroy = p_destroy,
    .describe = p_describe,
    /* New in ABI v4: all_to_all through run (its buffers' memory kinds and
     * the caller's stream), and abort. */
    .run_kinds = MLXDIST_V4_KIND_BIT(MLXDIST_V4_KIND_ALL_TO_ALL),
    .run = p_run,
    .abort = p_abort,
};

/* ---- the plugin ---- */

static bool p_is_available(char* why, size_t len) {
  pthread_once(&g_once, load);
  if (!g_ok && why && len) snprintf(why, len, "%s", g_why);
  return g_ok;
}

static bool env_set(const char* n) {
  const char* v = getenv(n);
  return v && *v;
}

static bool p_is_configured(bool with_bootstrap) {
  return env_set("MLX_RANK") && env_set("MLX_WORLD_SIZE") &&
         (with_bootstrap || (env_set("NCCL_HOST_IP") && env_set("NCCL_PORT")));
}

static int32_t env_int(const char* name, long lo, long hi, long* out, mlxdist_v4_status* st) {
  const char* v = getenv(name);
  if (!v || !*v) return fail(st, MLXDIST_V4_EUNAVAIL, "[nccl] %s is not set", name);
  char* end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    return fail(st, MLXDIST_V4_EINVAL, "[nccl] %s='%.40s' is not an integer in [%ld, %ld]", name, v,
                lo, hi);
  *out = x;
  return 0;
}

static int32_t p_create(mlxdist_v4_bootstrap* bs, mlxdist_v4_backend** out, mlxdist_v4_status* st) {
  *out = NULL;
  char why[320];
  if (!p_is_available(why, sizeof why)) return fail(st, MLXDIST_V4_EUNAVAIL, "%s", why);
  if (!bs)
    return fail(st, MLXDIST_V4_EUNAVAIL,
                "[nccl] the plugin needs the core's side channel or the caller's all-gather");
  long size = 0, rank = 0;
  if (env_int("MLX_WORLD_SIZE", 1, 1 << 20, &size, st) ||
      env_int("MLX_RANK", 0, size - 1, &rank, st))
    return st->code;
  bs->rank = (int32_t)rank;
  bs->size = (int32_t)size;
  ncclUniqueId mine, *all = calloc((size_t)size, sizeof(ncclUniqueId));
  if (!all) return fail(st, MLXDIST_V4_ENOMEM, "[nccl] out of memory");
  memset(&mine, 0, sizeof mine);
  if (rank == 0) {
    ncclResult_t r = L.get_unique_id(&mine);
    if (r != ncclSuccess) {
      free(all);
      return fail(st, MLXDIST_V4_ESYS, "[nccl] ncclGetUniqueId: %s", L.nccl_error_string(r));
    }
  }
  int32_t rc = bs->all_gather(bs, all, &mine, sizeof mine, st);
  ncclUniqueId id = all[0];
  free(all);
  if (rc) return rc;
  /* as MLX: cudaSetDevice(rank % device_count) */
  inst* b = inst_new((int)rank, (int)size, (int)(rank % g_devices), st);
  if (!b) return st->code;
  ncclConfig_t cfg = nonblocking();
  ncclResult_t r = L.init_rank_config(&b->comm, (int)size, id, (int)rank, &cfg);
  rc = nccl_step(b, r, "init", 0, st);
  if (!rc) rc = wait_comm(b, "init", 0, false, st);
  if (rc) {
    inst_free(b);
    return rc;
  }
  *out = &b->base;
  return 0;
}

static const mlxdist_v4_plugin k_plugin = {
    .struct_size = sizeof(mlxdist_v4_plugin),
    .version = MLXDIST_PLUGIN_V4_VERSION,
    .name = "nccl",
    .is_available = p_is_available,
    .is_configured = p_is_configured,
    .supports_bootstrap = true,
    .create = p_create,
};

API const mlxdist_v4_plugin* mlxdist_plugin_v4(const mlxdist_v4_host* host) {
  if (!host || host->struct_size < sizeof(mlxdist_v4_host) || !host->dtype_size || !host->timeout_s)
    return NULL;
  g_host = host;
  return &k_plugin;
}

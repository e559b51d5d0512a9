/* The GPU device provider (gpu.h): the CUDA runtime by dlopen. The entry
 * points are declared here by hand from the CUDA runtime API's documented
 * C signatures (every one returns a cudaError_t, an int), so building
 * libmlxdist needs no CUDA header and it links nothing of CUDA. */
#include "core/gpu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "util/tunables.h"

/* The runtime's values used here (cuda_runtime_api.h / driver_types.h). */
#define CUDA_SUCCESS_ 0
#define CUDA_MEM_ATTACH_GLOBAL_ 1u   /* cudaMemAttachGlobal */
#define CUDA_STREAM_NON_BLOCKING_ 1u /* cudaStreamNonBlocking */
#define CUDA_MEMCPY_DEFAULT_ 4       /* cudaMemcpyDefault */

typedef int (*fn_int_p)(int*);
typedef int (*fn_set_device)(int);
typedef const char* (*fn_error_string)(int);
typedef int (*fn_stream_create)(void**, unsigned);
typedef int (*fn_stream)(void*);
typedef int (*fn_malloc_managed)(void**, size_t, unsigned);
typedef int (*fn_free)(void*);
typedef int (*fn_memcpy_async)(void*, const void*, size_t, int, void*);

static struct {
  fn_int_p get_device_count, runtime_version, driver_version;
  fn_set_device set_device;
  fn_error_string error_string;
  fn_stream_create stream_create;
  fn_stream stream_sync, stream_destroy;
  fn_malloc_managed malloc_managed;
  fn_free free_;
  fn_memcpy_async memcpy_async;
} g_cuda;

static mlxd_gpu_info g_info;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static const char* err_text(int e) {
  const char* s = g_cuda.error_string ? g_cuda.error_string(e) : NULL;
  return s ? s : "unknown CUDA error";
}

/* dlsym into *slot; false when absent. */
static bool sym(void* h, const char* name, void* slot) {
  void* p = dlsym(h, name);
  memcpy(slot, &p, sizeof p); /* object pointer to function pointer, without a cast warning */
  return p != NULL;
}

static void probe(void) {
  /* MLXDIST_CUDART, checked as every tunable; the nccl plugin uses the
   * library opened here (it finds it loaded), so this is the one choice. */
  const char* want = mlxd_tunable_str(MLXD_T_CUDART);
  const char* names[2] = {"libcudart.so.13", "libcudart.so.12"};
  int n = 2;
  double unused = 0;
  char bad[200];
  if (want && *want && mlxd_tunable_parse(MLXD_T_CUDART, want, &unused, bad, sizeof bad) != 0) {
    snprintf(g_info.why, sizeof g_info.why, "no CUDA runtime (%.200s)", bad);
    return;
  }
  if (want && *want) {
    names[0] = want;
    n = 1;
  }
  void* h = NULL;
  char tried[160] = "";
  size_t used = 0;
  for (int i = 0; i < n && !h; i++) {
    h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) {
      snprintf(g_info.lib, sizeof g_info.lib, "%s", names[i]);
    } else {
      int w = snprintf(tried + used, sizeof tried - used, "%s%.70s", used ? ", " : "", names[i]);
      if (w > 0 && (size_t)w < sizeof tried - used) used += (size_t)w;
    }
  }
  if (!h) {
    snprintf(g_info.why, sizeof g_info.why, "no CUDA runtime (could not load %s)", tried);
    return;
  }
  bool ok = sym(h, "cudaGetDeviceCount", &g_cuda.get_device_count) &&
            sym(h, "cudaRuntimeGetVersion", &g_cuda.runtime_version) &&
            sym(h, "cudaDriverGetVersion", &g_cuda.driver_version) &&
            sym(h, "cudaSetDevice", &g_cuda.set_device) &&
            sym(h, "cudaGetErrorString", &g_cuda.error_string) &&
            sym(h, "cudaStreamCreateWithFlags", &g_cuda.stream_create) &&
            sym(h, "cudaStreamSynchronize", &g_cuda.stream_sync) &&
            sym(h, "cudaStreamDestroy", &g_cuda.stream_destroy) &&
            sym(h, "cudaMallocManaged", &g_cuda.malloc_managed) &&
            sym(h, "cudaFree", &g_cuda.free_) && sym(h, "cudaMemcpyAsync", &g_cuda.memcpy_async);
  if (!ok) {
    snprintf(g_info.why, sizeof g_info.why,
             "CUDA runtime %.100s lacks an entry point mlxdist uses (not a CUDA runtime?)",
             g_info.lib);
    memset(&g_cuda, 0, sizeof g_cuda);
    dlclose(h);
    return;
  }
  /* Kept open for the life of the process (its functions are used until exit). */
  g_info.loaded = true;
  int v = 0;
  if (g_cuda.runtime_version(&v) == CUDA_SUCCESS_) g_info.runtime_version = v;
  v = 0;
  if (g_cuda.driver_version(&v) == CUDA_SUCCESS_) g_info.driver_version = v;
  int count = 0;
  int e = g_cuda.get_device_count(&count);
  if (e != CUDA_SUCCESS_ || count <= 0) {
    snprintf(g_info.why, sizeof g_info.why,
             "CUDA runtime %.100s (%d.%d) loaded but cudaGetDeviceCount: %s", g_info.lib,
             g_info.runtime_version / 1000, g_info.runtime_version % 1000 / 10,
             e != CUDA_SUCCESS_ ? err_text(e) : "no device");
    return;
  }
  g_info.count = count;
}

const mlxd_gpu_info* mlxd_gpu_probe(void) {
  pthread_once(&g_once, probe);
  return &g_info;
}

int mlxd_gpu_count(void) { return mlxd_gpu_probe()->count; }

int mlxd_gpu_unavailable(mlxd_status* st, const char* prefix) {
  return mlxd_fail(st, MLXD_EUNAVAIL, "%s no GPU is available: %s", prefix, mlxd_gpu_probe()->why);
}

static int cuda_fail(mlxd_status* st, const char* call, int e) {
  return mlxd_fail(st, MLXD_ESYS, "[gpu] %s failed: %s (CUDA error %d)", call, err_text(e), e);
}

int mlxd_gpu_stream_create(int device, void** out, mlxd_status* st) {
  *out = NULL;
  if (mlxd_gpu_count() <= 0) return mlxd_gpu_unavailable(st, "[gpu]");
  if (device < 0 || device >= g_info.count)
    return mlxd_fail(st, MLXD_EUNAVAIL, "[gpu] Device(gpu, %d) does not exist (%d GPU%s here)",
                     device, g_info.count, g_info.count == 1 ? "" : "s");
  int e = g_cuda.set_device(device);
  if (e != CUDA_SUCCESS_) return cuda_fail(st, "cudaSetDevice", e);
  e = g_cuda.stream_create(out, CUDA_STREAM_NON_BLOCKING_);
  if (e != CUDA_SUCCESS_) {
    *out = NULL;
    return cuda_fail(st, "cudaStreamCreateWithFlags", e);
  }
  return 0;
}

int mlxd_gpu_stream_sync(void* stream, mlxd_status* st) {
  if (mlxd_gpu_count() <= 0) return mlxd_gpu_unavailable(st, "[gpu]");
  int e = g_cuda.stream_sync(stream);
  return e == CUDA_SUCCESS_ ? 0 : cuda_fail(st, "cudaStreamSynchronize", e);
}

void mlxd_gpu_stream_destroy(void* stream) {
  if (stream && g_info.count > 0) g_cuda.stream_destroy(stream);
}

void* mlxd_gpu_alloc_managed(size_t nbytes, mlxd_status* st) {
  if (mlxd_gpu_count() <= 0) {
    mlxd_gpu_unavailable(st, "[gpu]");
    return NULL;
  }
  void* p = NULL;
  int e = g_cuda.malloc_managed(&p, nbytes ? nbytes : 1, CUDA_MEM_ATTACH_GLOBAL_);
  if (e != CUDA_SUCCESS_) {
    mlxd_fail(st, MLXD_ENOMEM, "[gpu] cudaMallocManaged of %zu bytes failed: %s (CUDA error %d)",
              nbytes, err_text(e), e);
    return NULL;
  }
  return p;
}

void mlxd_gpu_free(void* p) {
  if (p && g_info.count > 0) g_cuda.free_(p);
}

int mlxd_gpu_copy(void* dst, const void* src, size_t nbytes, void* stream, mlxd_status* st) {
  if (mlxd_gpu_count() <= 0) return mlxd_gpu_unavailable(st, "[gpu]");
  int e = g_cuda.memcpy_async(dst, src, nbytes, CUDA_MEMCPY_DEFAULT_, stream);
  if (e != CUDA_SUCCESS_) return cuda_fail(st, "cudaMemcpyAsync", e);
  e = g_cuda.stream_sync(stream);
  return e == CUDA_SUCCESS_ ? 0 : cuda_fail(st, "cudaStreamSynchronize", e);
}

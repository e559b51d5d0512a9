/* Private: the GPU device provider. The CUDA runtime is loaded at run time
 * (dlopen of MLXDIST_CUDART, else libcudart.so.13, else libcudart.so.12);
 * libmlxdist neither links it nor needs a CUDA header to build: the few
 * entry points used are declared by hand in gpu.c. Present only where the
 * runtime loads AND reports at least one device; everywhere else every
 * call below fails with the reason (mlxd_gpu_why), and nothing on a CPU
 * path ever calls into it.
 *
 * Thread safety: the probe runs once (pthread_once); every function may be
 * called from any thread. None blocks without a bound except
 * mlxd_gpu_stream_sync, which waits for the work queued on a CUDA stream
 * (bounded by that work). */
#ifndef MLXD_GPU_H
#define MLXD_GPU_H

#include <stdbool.h>
#include <stddef.h>

#include "util/status.h"

/* What the probe found (constant after the first call). */
typedef struct mlxd_gpu_info {
  bool loaded;         /* a CUDA runtime library was opened */
  char lib[128];       /* its name or path as opened ("" if none) */
  int runtime_version; /* cudaRuntimeGetVersion: 13000 = 13.0; 0 if unknown */
  int driver_version;  /* cudaDriverGetVersion: 0 when no driver */
  int count;           /* devices usable; 0 when none */
  char why[256];       /* count == 0: why, one sentence without a prefix */
} mlxd_gpu_info;

/* Probe once; never fails (the answer says what is missing). */
const mlxd_gpu_info* mlxd_gpu_probe(void);
/* Number of GPUs (0 when none). */
int mlxd_gpu_count(void);
/* Fail st with MLXD_EUNAVAIL: "<prefix> no GPU is available: <why>". Returns the code. */
int mlxd_gpu_unavailable(mlxd_status* st, const char* prefix);

/* A CUDA stream on device `device` (cudaStreamNonBlocking) into *out. */
int mlxd_gpu_stream_create(int device, void** out, mlxd_status* st);
/* Wait for everything queued on stream (cudaStreamSynchronize). */
int mlxd_gpu_stream_sync(void* stream, mlxd_status* st);
/* Destroy a stream made by mlxd_gpu_stream_create (NULL: nothing). */
void mlxd_gpu_stream_destroy(void* stream);
/* Managed memory (cudaMallocManaged, attached globally): reachable by every
 * GPU and by the host. NULL with st set on failure. */
void* mlxd_gpu_alloc_managed(size_t nbytes, mlxd_status* st);
/* Free memory from mlxd_gpu_alloc_managed (NULL: nothing). */
void mlxd_gpu_free(void* p);
/* Copy nbytes (any direction, cudaMemcpyDefault) on stream (NULL: the
 * default stream), then wait for it. */
int mlxd_gpu_copy(void* dst, const void* src, size_t nbytes, void* stream, mlxd_status* st);

#endif

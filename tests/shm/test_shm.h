/* What the parts of test_shm share (test_shm.c: main, the helpers and the
 * sections raw, threads, death, timeout, idle, connect; test_shm_pairs.c:
 * lazy, first_*, leak; test_shm_cma.c: cma_*, whole_*). */
#ifndef MLXD_TEST_SHM_H
#define MLXD_TEST_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "transport/transport.h"

/* The bytes a message from src to dst with tag carries at offset i. */
unsigned char val(int src, int dst, uint64_t tag, size_t i);
void fill(unsigned char* b, size_t n, int src, int dst, uint64_t tag);
/* The first offset that is not val's ((size_t)-1: none). */
size_t first_bad(const unsigned char* b, size_t n, int src, int dst, uint64_t tag);

/* Every rank's pid, shared by the forked ranks (main maps it before they
 * start; join writes it before the set-up, which waits for every rank). */
extern volatile pid_t* g_pids;

/* Events one rank waits for in another (mapped with g_pids): waited for,
 * never slept for, so the order holds at any speed. */
typedef struct events {
  atomic_int timeout_relayed; /* timeout: rank 1 has rank 0's failure */
} events;
extern events* g_ev;

/* The name of pair (lo, hi)'s segment (shm_setup.c pair_name), once both
 * ranks joined. */
unsigned long long pidns(void);
void pair_path(char* out, size_t n, const char* name, int lo, int hi);
/* This rank's transport (checked), its pid in g_pids. */
mlxd_transport* join(int rank, int size, const char* name);
/* Wait for one request. */
int wait1(mlxd_transport* t, mlxd_req* r, mlxd_status* st);

/* The sections of test_shm_pairs.c and test_shm_cma.c. */
int rank_lazy(int rank, int size, const char* name, void* arg);
int rank_first(int rank, int size, const char* name, void* arg);
int rank_first_abort(int rank, int size, const char* name, void* arg);
void run_leak(void);
int run_cma(const char* what, int n);
int run_whole(const char* what, int n);

#endif

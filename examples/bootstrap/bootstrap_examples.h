/* Two all-gather callbacks for mlx_distributed_init_with_all_gather ("bring
 * your own rendezvous"). Each file is also a complete example program. */
#ifndef MLXDIST_BOOTSTRAP_EXAMPLES_H
#define MLXDIST_BOOTSTRAP_EXAMPLES_H

#include <stddef.h>

/* shared_dir.c: an all-gather over a directory every rank can see. Round k of
 * rank r is the file <dir>/<tag>.<k>.<r>, written atomically (tmp + rename).
 * A rank waits at most timeout_s for the others and gives up at once when the
 * file <dir>/<tag>.abort exists (shared_dir_abort writes it). */
typedef struct shared_dir {
  char dir[200];
  char tag[40];
  int round;
  double timeout_s;
} shared_dir;

void shared_dir_init(shared_dir* sd, const char* dir, const char* tag, double timeout_s);
/* The callback (payload: a shared_dir*). 0 on success; 2 aborted; 3 timed out; 4 I/O error. */
int shared_dir_all_gather(void* dst, const void* src, size_t n, int rank, int size, void* payload);
/* Tell every rank's callback to give up. */
void shared_dir_abort(const shared_dir* sd);

/* tcp_kv.c: a tiny TCP rendezvous. Rank 0 runs a server thread on host:port
 * (MLXDIST_EXAMPLE_KV); for every round each rank connects, sends its bytes,
 * and receives everyone's once all have arrived. */
typedef struct tcp_kv tcp_kv;
/* spec "host:port"; rank 0 starts the server. NULL on error (printed). */
tcp_kv* tcp_kv_new(const char* spec, int rank, double timeout_s);
int tcp_kv_all_gather(void* dst, const void* src, size_t n, int rank, int size, void* payload);
/* The dtor: stops the server (rank 0) and frees. */
void tcp_kv_free(void* kv);

#endif

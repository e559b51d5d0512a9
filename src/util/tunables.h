/* Private: every MLXDIST_* tunable, declared once.
 *
 * X(ID, "ENV_NAME", "default", "what it does") — the default is a string,
 * parsed like a value from the environment. docs/environment.md and
 * `mlxdist-info --env` are generated from / print this list. */
#ifndef MLXD_TUNABLES_H
#define MLXD_TUNABLES_H

#include <stdbool.h>

#define MLXD_TUNABLES(X)                                                                         \
  X(TIMEOUT, "MLXDIST_TIMEOUT", "60",                                                            \
    "Seconds a blocking network wait may make no progress before the op "                        \
    "fails with a timeout (and the group is marked failed).")                                    \
  X(CONNECT_TIMEOUT, "MLXDIST_CONNECT_TIMEOUT", "30",                                            \
    "Seconds init keeps retrying connections to peers (with back-off).")                         \
  X(SPIN_US, "MLXDIST_SPIN_US", "1000", "Microseconds a waiting thread polls before it blocks.") \
  X(WORKER_IDLE, "MLXDIST_WORKER_IDLE", "1",                                                     \
    "1: stream worker threads run at idle priority (SCHED_IDLE), so queued "                     \
    "work never preempts a busy thread; a thread that waits for a result runs "                  \
    "its task itself. 0: normal priority (more overlap of queued work with a "                   \
    "busy CPU, at the cost of a wake-up per op).")                                               \
  X(TRANSPORT, "MLXDIST_TRANSPORT", "auto",                                                      \
    "Ring transport: auto (shared memory between ranks on one host, tcp "                        \
    "otherwise), tcp, or shm.")                                                                  \
  X(RING_ADDR, "MLXDIST_RING_ADDR", "",                                                          \
    "Address this rank listens on when bootstrapped by a caller's "                              \
    "all-gather (default: the address of the host name, else 127.0.0.1).")                       \
  X(RING_CONNECTIONS, "MLXDIST_RING_CONNECTIONS", "1",                                           \
    "Connections per peer when bootstrapped by a caller's all-gather.")                          \
  X(SMALL_BYTES, "MLXDIST_SMALL_BYTES", "65536",                                                 \
    "Reductions up to this many bytes use the low-latency algorithm.")                           \
  X(PLUGIN_PATH, "MLXDIST_PLUGIN_PATH", "",                                                      \
    "Colon-separated directories searched first for backend plugins "                            \
    "(libmlxdist-<name>.so).")                                                                   \
  X(SHM_CMA_BYTES, "MLXDIST_SHM_CMA_BYTES", "0",                                                 \
    "Shared-memory transport: messages of at least this many bytes are read "                    \
    "in one copy from the sender's memory (process_vm_readv) where the "                         \
    "kernel allows it; 0 disables that (every message goes through the "                         \
    "shared rings).")                                                                            \
  X(BUFFER_CACHE_MB, "MLXDIST_BUFFER_CACHE_MB", "1024",                                          \
    "Megabytes of freed large buffers (>= 64 KiB) kept for reuse by later "                      \
    "arrays and transfers (0: give every buffer back at once).")                                 \
  X(MPI_CHUNK_BYTES, "MLXDIST_MPI_CHUNK_BYTES", "1073741824",                                    \
    "mpi backend: the most bytes one MPI call moves; larger ops are split "                      \
    "(read by the plugin; lowered by tests to exercise the split paths).")                       \
  X(LAUNCH_TIMEOUT, "MLXDIST_LAUNCH_TIMEOUT", "0",                                               \
    "mlxdist-launch: seconds before every rank is killed and the launcher "                      \
    "exits 124 (0: no limit; --timeout overrides it).")                                          \
  X(SECRET_FILE, "MLXDIST_SECRET_FILE", "",                                                      \
    "Path of the job's shared secret (a private file of 16 to 4096 bytes, mode 0600): every "    \
    "connection then proves both ends hold it (HMAC-SHA256 challenge-response). See "            \
    "docs/security.md.")                                                                         \
  X(JOB_TOKEN, "MLXDIST_JOB_TOKEN", "",                                                          \
    "The job's identity: 32 hex digits every connection of the job must carry (mlxdist-launch "  \
    "sets a random one per job). Unset: derived from the hostfile (cross-job protection, not "   \
    "authentication). See docs/security.md.")

typedef enum mlxd_tunable {
#define MLXD_TUNABLE_ENUM(id, env, def, doc) MLXD_T_##id,
  MLXD_TUNABLES(MLXD_TUNABLE_ENUM)
#undef MLXD_TUNABLE_ENUM
      MLXD_T_COUNT
} mlxd_tunable;

/* The raw value: the environment's if set and non-empty, else the default. */
const char* mlxd_tunable_str(mlxd_tunable t);
/* Parsed as a number; an unparsable value prints one warning to stderr and gives the default. */
double mlxd_tunable_double(mlxd_tunable t);
long mlxd_tunable_long(mlxd_tunable t);
const char* mlxd_tunable_env_name(mlxd_tunable t);
const char* mlxd_tunable_default(mlxd_tunable t);
const char* mlxd_tunable_doc(mlxd_tunable t);

#endif

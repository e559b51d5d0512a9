/* Private: every MLXDIST_* tunable, declared once.
 *
 * X(ID, "ENV_NAME", "default", SPEC, "what it does") — the default is a
 * string, parsed like a value from the environment; SPEC is what a value
 * must be (one of the MLXD_TK_* forms below: kind, range, unit or choices).
 * docs/environment.md and `mlxdist-info --env` are generated from / print
 * this list, the expected values included.
 *
 * Validation: mlxd_tunable_parse() checks one value completely (syntax,
 * NaN/inf, overflow, range, choices). Init (src/distributed/group.c) calls
 * mlxd_tunables_check() first: a bad value of any variable makes init fail,
 * strict or not, with a message naming the variable, the value and what was
 * expected. The readers (mlxd_tunable_double/long) always return a valid
 * value: code that runs without init (streams, buffers) gets the default for
 * a bad value, with one warning per variable. */
#ifndef MLXD_TUNABLES_H
#define MLXD_TUNABLES_H

#include <stdbool.h>
#include <stddef.h>

#include "util/status.h"

typedef enum mlxd_tunable_kind {
  MLXD_TK_NUMBER,  /* a decimal number in [lo, hi] (no inf, nan, hex) */
  MLXD_TK_INTEGER, /* a decimal integer in [lo, hi] */
  MLXD_TK_FLAG,    /* 0 or 1 */
  MLXD_TK_CHOICE,  /* one of the '|'-separated words in what (case-insensitive) */
  MLXD_TK_HOST,    /* empty, or an IP address / host name (letters, digits, . - : [ ] %) */
  MLXD_TK_PATHS,   /* empty, or directories separated by ':' (no control characters) */
  MLXD_TK_FILE,    /* empty, or a file's path (no control characters; checked where it is used) */
  MLXD_TK_HEX,     /* empty, or exactly hi hex digits */
} mlxd_tunable_kind;

typedef struct mlxd_tunable_spec {
  mlxd_tunable_kind kind;
  double lo, hi;    /* NUMBER, INTEGER: the range, both ends included */
  const char* what; /* NUMBER, INTEGER: the unit; CHOICE: the words "a|b|c" */
} mlxd_tunable_spec;

/* The SPEC forms. Numbers that must be > 0 have a small positive lower end. */
#define MLXD_TK_NUMBER(lo, hi, unit) \
  { MLXD_TK_NUMBER, (lo), (hi), (unit) }
#define MLXD_TK_INTEGER(lo, hi, unit) \
  { MLXD_TK_INTEGER, (lo), (hi), (unit) }
#define MLXD_TK_FLAG() \
  { MLXD_TK_FLAG, 0, 1, "" }
#define MLXD_TK_CHOICE(words) \
  { MLXD_TK_CHOICE, 0, 0, (words) }
#define MLXD_TK_HOST() \
  { MLXD_TK_HOST, 0, 255, "" }
/* A HOST-like word (same characters) that is something else, what says what ("ip:port"). */
#define MLXD_TK_WORD(what) \
  { MLXD_TK_HOST, 0, 255, (what) }
/* The same with a longer limit: max characters. */
#define MLXD_TK_WORDS(what, max) \
  { MLXD_TK_HOST, 0, (max), (what) }
#define MLXD_TK_PATHS() \
  { MLXD_TK_PATHS, 0, 4096, "" }
#define MLXD_TK_FILE() \
  { MLXD_TK_FILE, 0, 4096, "" }
#define MLXD_TK_HEX(digits) \
  { MLXD_TK_HEX, 0, (digits), "" }

#define MLXD_TUNABLES(X)                                                                          \
  X(TIMEOUT, "MLXDIST_TIMEOUT", "60", MLXD_TK_NUMBER(0.001, 86400, "seconds"),                    \
    "Seconds a peer may show no sign of life (no data, no heartbeat) while this rank waits on "   \
    "it before it is taken for dead (stopped, frozen, cut off) and the op fails naming it. A "    \
    "peer that is alive but busy elsewhere is waited for (MLXDIST_OP_TIMEOUT). Set it the same "  \
    "on every rank: a rank's TCP heartbeats go every min(this, MLXDIST_WARN_AFTER) / 6 s (at "    \
    "most 10 s), so a smaller value on one rank can take a busy peer for dead.")                  \
  X(WARN_AFTER, "MLXDIST_WARN_AFTER", "60", MLXD_TK_NUMBER(0, 86400, "seconds"),                  \
    "Seconds a wait on a live peer may last before one warning line names that peer and what "    \
    "it was doing last, followed by this rank's operation record (0: never warn).")               \
  X(OP_TIMEOUT, "MLXDIST_OP_TIMEOUT", "1800", MLXD_TK_NUMBER(0.001, 31536000, "seconds"),         \
    "Seconds a wait may make no progress while its peers are alive before the op fails with a "   \
    "timeout (a peer that never gets to the matching operation).")                                \
  X(DUMP_SIGNAL, "MLXDIST_DUMP_SIGNAL", "0", MLXD_TK_FLAG(),                                      \
    "1: SIGUSR1 makes this process print its operation record on stderr (mlxdist-launch sets "    \
    "it). 0: the signal keeps its default action.")                                               \
  X(CHECK, "MLXDIST_CHECK", "0", MLXD_TK_FLAG(),                                                  \
    "mpi backend: 1 exchanges a signature of every op (op, dtype, count) before it runs, so "     \
    "ranks that make different calls fail with both calls named (the ring backend always "        \
    "checks). One rank's 1 turns it on for the whole group (agreed at init).")                    \
  X(CONNECT_TIMEOUT, "MLXDIST_CONNECT_TIMEOUT", "30", MLXD_TK_NUMBER(0.001, 86400, "seconds"),    \
    "Seconds init keeps retrying connections to peers (with back-off); with lazy connections, "   \
    "the bound of each connection made on first use (a peer that never answers fails the op "     \
    "naming it).")                                                                                \
  X(CONNECT, "MLXDIST_CONNECT", "lazy", MLXD_TK_CHOICE("lazy|eager"),                             \
    "Ring over TCP: lazy makes a connection to a peer the first time an op sends to or "          \
    "receives from it (the group starts with an address book and its listening sockets); "        \
    "eager builds the full mesh at init. With MLXDIST_TLS=1 a connection's TLS handshake runs "   \
    "when it is made.")                                                                           \
  X(SPIN_US, "MLXDIST_SPIN_US", "1000", MLXD_TK_NUMBER(0, 1000000, "microseconds"),               \
    "Microseconds a waiting thread polls before it blocks. Unset, a host with more of the "       \
    "group's ranks than CPUs the process may run on (sched_getaffinity) polls 100 us, with "      \
    "sched_yield between polls, so a peer that needs the CPU gets it; set, it applies to "        \
    "every host (the yield still follows the crowding).")                                         \
  X(WORKER_IDLE, "MLXDIST_WORKER_IDLE", "1", MLXD_TK_FLAG(),                                      \
    "1: stream worker threads run at idle priority (SCHED_IDLE), so queued "                      \
    "work never preempts a busy thread; a thread that waits for a result runs "                   \
    "its task itself. 0: normal priority (more overlap of queued work with a "                    \
    "busy CPU, at the cost of a wake-up per op).")                                                \
  X(TRANSPORT, "MLXDIST_TRANSPORT", "auto", MLXD_TK_CHOICE("auto|tcp|shm"),                       \
    "Ring transport: auto (shared memory between ranks on one host, tcp "                         \
    "otherwise), tcp, or shm.")                                                                   \
  X(RING_ADDR, "MLXDIST_RING_ADDR", "", MLXD_TK_HOST(),                                           \
    "Address this rank listens on when bootstrapped by a caller's "                               \
    "all-gather (default: the address of the host name, else 127.0.0.1).")                        \
  X(RING_CONNECTIONS, "MLXDIST_RING_CONNECTIONS", "1", MLXD_TK_INTEGER(1, 64, "connections"),     \
    "Connections per peer when bootstrapped by a caller's all-gather.")                           \
  X(SMALL_BYTES, "MLXDIST_SMALL_BYTES", "65536", MLXD_TK_INTEGER(0, 16777216, "bytes"),           \
    "Reductions up to this many bytes use the low-latency algorithm (0: never).")                 \
  X(SMALL_ALGO, "MLXDIST_SMALL_ALGO", "auto", MLXD_TK_CHOICE("auto|direct|logn"),                 \
    "all_sum/max/min, all_gather and sum_scatter up to MLXDIST_SMALL_BYTES: direct sends every "  \
    "rank's buffer to every other rank in one step; logn runs recursive doubling (all_sum; "      \
    "all_gather but over shared memory below 128 ranks: Bruck's) and recursive halving (log2 "    \
    "of the group size steps); auto: "                                                            \
    "direct in small groups, logn in large ones, as measured (docs/performance.md). Read once "   \
    "per process; must be the same on every rank.")                                               \
  X(PLUGIN_PATH, "MLXDIST_PLUGIN_PATH", "", MLXD_TK_PATHS(),                                      \
    "Colon-separated directories searched first for backend plugins "                             \
    "(libmlxdist-<name>.so).")                                                                    \
  X(CUDART, "MLXDIST_CUDART", "", MLXD_TK_FILE(),                                                 \
    "The CUDA runtime library the GPU provider opens (a file name or path). Unset: "              \
    "libcudart.so.13, then libcudart.so.12. See docs/nccl.md.")                                   \
  X(SHM_CMA_BYTES, "MLXDIST_SHM_CMA_BYTES", "0", MLXD_TK_INTEGER(0, 1099511627776.0, "bytes"),    \
    "Shared-memory transport: messages of at least this many bytes are read "                     \
    "in one copy from the sender's memory (process_vm_readv) where the "                          \
    "kernel allows it; 0 disables that (every message goes through the "                          \
    "shared rings). Unset, a host with more of the group's ranks than CPUs "                      \
    "the process may run on (sched_getaffinity) uses 33554432 (32 MiB); on "                      \
    "any other host point-to-point messages take the rings and "                                  \
    "collectives' messages what the machine's calibration chose (0 or "                           \
    "16384 to 1048576, measured once a boot; mlxdist-info shows it); set, to any "                \
    "value, 0 included, it applies to every host and nothing is calibrated "                      \
    "(the way to turn the calibration off). Where every rank of a group is "                      \
    "crowded, all_gather sends blocks of 32 MiB and more whole to each "                          \
    "peer, so that this copy reads them, whatever the value (see "                                \
    "docs/ring.md).")                                                                             \
  X(VERBS_ZCOPY_BYTES, "MLXDIST_VERBS_ZCOPY_BYTES", "262144",                                     \
    MLXD_TK_INTEGER(0, 1099511627776.0, "bytes"),                                                 \
    "verbs transport (jaccl): messages of at least this many bytes skip the "                     \
    "staging slots: the receiver RDMA-reads them from the sender's registered "                   \
    "buffer (0: never). See docs/jaccl.md.")                                                      \
  X(VERBS_MR_CACHE_MB, "MLXDIST_VERBS_MR_CACHE_MB", "256", MLXD_TK_INTEGER(1, 1048576, "MiB"),    \
    "verbs transport: megabytes of buffers kept registered for zero-copy "                        \
    "messages per transport (also bounded by RLIMIT_MEMLOCK).")                                   \
  X(BUFFER_CACHE_MB, "MLXDIST_BUFFER_CACHE_MB", "1024", MLXD_TK_INTEGER(0, 1048576, "MiB"),       \
    "Megabytes of freed large buffers (>= 64 KiB) kept for reuse by later "                       \
    "arrays and transfers (0: give every buffer back at once).")                                  \
  X(MPI_CHUNK_BYTES, "MLXDIST_MPI_CHUNK_BYTES", "1073741824",                                     \
    MLXD_TK_INTEGER(16, 1073741824, "bytes"),                                                     \
    "mpi backend: the most bytes one MPI call moves; larger ops are split "                       \
    "(read by the plugin; lowered by tests to exercise the split paths).")                        \
  X(LAUNCH_TIMEOUT, "MLXDIST_LAUNCH_TIMEOUT", "0", MLXD_TK_NUMBER(0, 31536000, "seconds"),        \
    "mlxdist-launch: seconds before every rank is killed and the launcher "                       \
    "exits 124 (0: no limit; --timeout overrides it).")                                           \
  X(LAUNCH_GATE, "MLXDIST_LAUNCH_GATE", "", MLXD_TK_WORD("FD:INODE, two decimal numbers"),        \
    "Set by mlxdist-launch for its ranks: FD:INODE of the gate, a pipe the launcher writes one "  \
    "byte into once every rank is started. Init waits for it (at most 4 x "                       \
    "MLXDIST_CONNECT_TIMEOUT) before it connects; the pipe closed without the byte (the "         \
    "launcher died or could not start a rank) fails init. See docs/launch.md.")                   \
  X(SECRET_FILE, "MLXDIST_SECRET_FILE", "", MLXD_TK_FILE(),                                       \
    "Path of the job's shared secret (a private file of 16 to 4096 bytes, mode 0600): every "     \
    "connection then proves both ends hold it (HMAC-SHA256 challenge-response). See "             \
    "docs/security.md.")                                                                          \
  X(TLS, "MLXDIST_TLS", "0", MLXD_TK_FLAG(),                                                      \
    "1: every TCP connection of the transport runs TLS 1.3, keyed from MLXDIST_SECRET_FILE "      \
    "(required) as a pre-shared key; 0: plain TCP. Shared memory is unaffected. See "             \
    "docs/security.md.")                                                                          \
  X(TCP_UNEXPECTED_MB, "MLXDIST_TCP_UNEXPECTED_MB", "4096", MLXD_TK_INTEGER(1, 268435456, "MiB"), \
    "TCP transport: megabytes of messages that arrived before their receive was posted that "     \
    "a rank buffers per peer; a peer going beyond fails the transport, naming it.")               \
  X(JOB_TOKEN, "MLXDIST_JOB_TOKEN", "", MLXD_TK_HEX(32),                                          \
    "The job's identity: 32 hex digits every connection of the job must carry (mlxdist-launch "   \
    "sets a random one per job). Unset: derived from the hostfile (cross-job protection, not "    \
    "authentication). See docs/security.md.")                                                     \
  X(HOST_ID, "MLXDIST_HOST_ID", "", MLXD_TK_HOST(),                                               \
    "Ring and jaccl transports: the host this rank counts as (at most 127 characters). Ranks "    \
    "with the same id use shared memory among themselves and TCP (jaccl: verbs where the device " \
    "matrix links the pair, else TCP) to the others; unset: the machine, its network and IPC "    \
    "namespaces. Lets one machine emulate several hosts (tests).")                                \
  X(RENDEZVOUS, "MLXDIST_RENDEZVOUS", "", MLXD_TK_WORD("ip:port or [ipv6]:port"),                 \
    "ip:port (or [ipv6]:port) of mlxdist-launch's rendezvous: with MLX_HOSTFILE unset, the ring " \
    "backend posts its addresses there (the launcher is the job's all-gather), authenticated "    \
    "with MLXDIST_JOB_TOKEN (required). Set by mlxdist-launch across hosts. See docs/ring.md.")   \
  X(SHM_SESSION, "MLXDIST_SHM_SESSION", "", MLXD_TK_WORD("a shared-memory session name"),         \
    "Set by mlxdist-launch when it starts every rank on this host: the ring's ranks meet in "     \
    "this shared-memory session for their first group (their host records travel through it, "    \
    "not over TCP); 1 to 200 letters, digits, '-' or '.', the same on every rank; empty: none "   \
    "(the launcher empties it with MLXDIST_TRANSPORT=tcp). See docs/ring.md.")                    \
  X(IFNAME, "MLXDIST_IFNAME", "", MLXD_TK_WORD("a network interface's name"),                     \
    "Bootstrapped ranks (all-gather or rendezvous) listen on this network interface's first "     \
    "IPv4 address, else its IPv6 one, when MLXDIST_RING_ADDR is unset (like "                     \
    "NCCL_SOCKET_IFNAME).")                                                                       \
  X(PORT_RANGE, "MLXDIST_PORT_RANGE", "", MLXD_TK_WORD("A-B, ports 1 <= A <= B <= 65535"),        \
    "A-B: bootstrapped ranks listen on the first free ports from A to B instead of ephemeral "    \
    "ones (for firewalled sites); none free is an error naming the range.")                       \
  X(PMIX, "MLXDIST_PMIX", "auto", MLXD_TK_CHOICE("auto|on|off"),                                  \
    "Ring under a PMIx server (srun --mpi=pmix, mpirun) with no other configuration: auto takes " \
    "rank, size and addresses from PMIx for init(\"ring\") (init(\"any\") leaves such a job to "  \
    "the mpi backend); on: for init(\"any\") too; off: never. See docs/pmix.md.")                 \
  X(PMIX_LIB, "MLXDIST_PMIX_LIB", "", MLXD_TK_FILE(),                                             \
    "The libpmix to load at run time under a PMIx server (a file name for the dynamic loader or " \
    "a path); empty: libpmix.so.2, then libpmix.so. mlxdist never links against it.")             \
  X(ALGO, "MLXDIST_ALGO", "auto", MLXD_TK_CHOICE("auto|flat|hier"),                               \
    "Ring backend, groups that span hosts: auto and hier run all_sum/max/min, all_gather and "    \
    "sum_scatter in two levels (inside each host, then across hosts) where the group spans >= 2 " \
    "hosts with >= 2 ranks on some host (auto: at every size, as measured; hier: the same, kept " \
    "for testing); flat runs the one-level algorithms over every rank. Read when a group is "     \
    "created; must be the same on every rank. See docs/ring.md.")                                 \
  X(HIER_SEGMENT, "MLXDIST_HIER_SEGMENT", "4194304", MLXD_TK_INTEGER(0, 1073741824, "bytes"),     \
    "Two-level all_sum/max/min above this many bytes: the buffer goes through the phases in "     \
    "segments of about this size, overlapped (one crosses the hosts while the next is reduced "   \
    "inside the host and the last one spread there; at most 256 segments); 0: in one piece. "     \
    "Read when a group is created; must be the same on every rank.")                              \
  X(STRICT_ENV, "MLXDIST_STRICT_ENV", "0", MLXD_TK_FLAG(),                                        \
    "1: an MLXDIST_* variable that mlxdist does not know (a typo) makes init "                    \
    "fail naming it and the nearest known name (mlxdist-launch then refuses to start). 0: "       \
    "one warning line per unknown name, once per process, and the name is ignored.")              \
  X(ENV_REPORTED, "MLXDIST_ENV_REPORTED", "",                                                     \
    MLXD_TK_WORDS("MLXDIST_* names separated by ':'", 4096),                                      \
    "Set by mlxdist-launch: the unknown MLXDIST_* names it has already warned about, which its "  \
    "ranks then do not warn about again (an unknown name not listed still gets its warning).")    \
  X(IBVERBS_LIB, "MLXDIST_IBVERBS_LIB", "", MLXD_TK_FILE(),                                       \
    "jaccl: the libibverbs to load at run time (a file name for the dynamic loader or a path); "  \
    "empty: libibverbs.so.1. mlxdist never links against it. See docs/jaccl.md.")                 \
  X(IB_PORT, "MLXDIST_IB_PORT", "0", MLXD_TK_INTEGER(0, 255, "port number"),                      \
    "jaccl: the port of each RDMA device to use (1, 2, ...); 0: the first ACTIVE port. "          \
    "mlxdist-info shows every port and its state.")                                               \
  X(IB_GID_INDEX, "MLXDIST_IB_GID_INDEX", "-1", MLXD_TK_INTEGER(-1, 1023, "GID table index"),     \
    "jaccl: the GID table entry to use on an Ethernet (RoCE) port; -1: chosen by content, the "   \
    "first RoCE v2 entry holding an IPv4-mapped address (its index depends on timing, so it is "  \
    "not fixed). InfiniBand ports use the LID. mlxdist-info shows the choice.")

typedef enum mlxd_tunable {
#define MLXD_TUNABLE_ENUM(id, env, def, spec, doc) MLXD_T_##id,
  MLXD_TUNABLES(MLXD_TUNABLE_ENUM)
#undef MLXD_TUNABLE_ENUM
      MLXD_T_COUNT
} mlxd_tunable;

/* The raw value: the environment's if set and non-empty, else the default. */
const char* mlxd_tunable_str(mlxd_tunable t);
/* The value as a number, always valid for t's spec: a value that does not
 * pass mlxd_tunable_parse prints one warning to stderr and gives the default
 * (init never gets there: mlxd_tunables_check fails first). FLAG: 0 or 1;
 * CHOICE: the index of the word; HOST, PATHS: 0. */
double mlxd_tunable_double(mlxd_tunable t);
long mlxd_tunable_long(mlxd_tunable t);
/* mlxd_tunable_double from the value a caller's thread last read (util/env.h),
 * never the environment itself, on any thread: for the host table, which
 * plugins call from threads of their own. */
double mlxd_tunable_kept_double(mlxd_tunable t);
const char* mlxd_tunable_env_name(mlxd_tunable t);
const char* mlxd_tunable_default(mlxd_tunable t);
const char* mlxd_tunable_doc(mlxd_tunable t);
const mlxd_tunable_spec* mlxd_tunable_spec_of(mlxd_tunable t);
/* The tunable whose variable is the len bytes at name, or -1. */
int mlxd_tunable_find(const char* name, size_t len);

/* What a value of t must be, in words: "seconds, a number from 0.001 to
 * 86400", "auto, tcp or shm", ... Returns buf. */
const char* mlxd_tunable_expected(mlxd_tunable t, char* buf, size_t len);

/* Parse text (NUL-terminated) as a value of t; pure (no environment). On
 * success returns 0 and stores the value in *out (as mlxd_tunable_double
 * describes; out may be NULL). On failure returns -1 with why = "NAME='text'
 * <what is wrong>; expected <what>". Numbers may have blanks around them;
 * words and addresses may not. */
int mlxd_tunable_parse(mlxd_tunable t, const char* text, double* out, char* why, size_t why_len);

/* Check every MLXDIST_* variable set in the environment; on the first bad
 * ones, fail st (MLXD_EINVAL, plain) naming each of them. Returns st->code. */
int mlxd_tunables_check(mlxd_status* st);

#endif

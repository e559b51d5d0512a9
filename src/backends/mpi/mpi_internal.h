/* Private to the mpi backend plugin (libmlxdist-mpi.so): the types and the
 * functions its files share. Nothing here is exported (the plugin is built
 * with hidden visibility; only the entry point in mpi_plugin.c is).
 *
 * The files:
 * - mpi_runtime.c: process-wide state, launcher detection, MPI start and
 *   finalisation at exit, the live-op count, the kind's functions.
 * - mpi_progress.c: group failure, the turnstile, the bounded waits on MPI
 *   requests, background completion of sends (the progress thread).
 * - mpi_dtype.c: mlx dtypes to MPI datatypes, reductions as MPI ops.
 * - mpi_ops.c: groups, staging buffers, the collectives, split and destroy.
 * - mpi_p2p.c: send and recv.
 * - mpi_a2a.c: all_to_all (ABI v4's run), run's memory checks, abort.
 * - mpi_check.c: MLXDIST_CHECK=1, the signatures exchanged before each op.
 * - mpi_plugin.c: the entry point and the plugin table.
 * - mpi_abi.h: which plugin ABI header this build speaks (v4; v1-v3 for tests).
 *
 * Rules kept by the plugin (docs/mpi.md explains them for users):
 * - MPI is started only when the process was launched by an MPI launcher
 *   (or the application initialised MPI itself), never as a singleton.
 * - MPI_Init_thread asks for MPI_THREAD_MULTIPLE; with SERIALIZED every MPI
 *   call is made under one mutex; anything lower is refused.
 * - Each group owns a duplicate of MPI_COMM_WORLD (or a split of one) with
 *   MPI_ERRORS_RETURN. Collectives are issued in sequence-number order (a
 *   turnstile), so concurrent streams never issue them in different orders
 *   on different ranks.
 * - Every wait polls non-blocking MPI requests (spin, then sleep) against a
 *   deadline of MLXDIST_TIMEOUT seconds without progress. A timeout fails
 *   the group: later ops fail fast with the same message.
 * - A send posts its data (a copy, or the held array: below) and returns; it is
 *   completed in the background, so sends posted before receives on both
 *   sides never deadlock.
 * - Collectives, send and recv called through ABI v3's *_ref ops give MPI
 *   the caller's memory directly (no staging copy). A request given up on (a
 *   timeout) may still use that memory, so the plugin then takes a hold on
 *   the caller's arrays (the bufref) and releases it only once MPI has
 *   completed the request (the progress thread polls such requests; the exit
 *   hook gives them one last bounded wait); a send holds its array from the
 *   start until the data has left. Through the plain ops (ABI v1/v2 hosts)
 *   MPI works on staging copies, freed the same way.
 * - If this plugin initialised MPI, it finalises it once, at process exit.
 * - Failures are structured (util/status.h, compiled in) and rendered once,
 *   when the op returns through the ABI: "[mpi] <op> #<seq> on rank R:
 *   <detail>", the peer set where there is one; a group failed earlier
 *   makes later ops fail with its first failure, naming the op that failed it.
 * - MLXDIST_CHECK=1 (agreed by all ranks at create): every op first
 *   exchanges a signature of the call (mpi_check.c); a send's data leaves
 *   only once the receiver's answer agrees. Without it nothing changes.
 *
 * The plugin does not link libmlxdist: the reduction kernels, the dtype sizes
 * and the tunables come through the host table given to mlxdist_plugin_v4
 * (the frozen ABI, mlx/c/plugin/plugin_v4.h; docs/plugin-abi.md). The
 * front-end's guarantees (size >= 2, valid peer, dtype, op, byte counts)
 * are written in that header. */
#ifndef MLXDIST_BACKENDS_MPI_MPI_INTERNAL_H
#define MLXDIST_BACKENDS_MPI_MPI_INTERNAL_H

#include <mpi.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "backends/mpi/mpi_abi.h"
#include "util/status.h"

/* Idle staging buffers kept per group. */
#define MPI_STAGE_POOL 2

/* A call's signature (mpi_check.c): what this rank is doing. */
enum {
  MPIP_SIG_ALL_SUM = 1,
  MPIP_SIG_ALL_MAX,
  MPIP_SIG_ALL_MIN,
  MPIP_SIG_ALL_GATHER,
  MPIP_SIG_SUM_SCATTER,
  MPIP_SIG_MAX_SCATTER,
  MPIP_SIG_MIN_SCATTER,
  MPIP_SIG_SEND,
  MPIP_SIG_RECV,
  MPIP_SIG_SPLIT,
  MPIP_SIG_ALL_TO_ALL,
  MPIP_SIG_OPS
};
#define MPIP_SIG_BYTES 24
#define MPIP_SIG_NO_DTYPE 0xFF /* all_gather, send/recv, split: bytes only */
typedef struct mpip_sig {
  uint8_t op;     /* MPIP_SIG_* */
  uint8_t dtype;  /* mpip_dtype, or MPIP_SIG_NO_DTYPE */
  uint32_t size;  /* the group size */
  uint64_t count; /* elements (reductions), bytes (the others) */
  uint64_t seq;   /* the op's sequence number */
} mpip_sig;

/* Point-to-point tags of one message (mlxd_mpi_p2p_tags). */
typedef struct mpip_tags {
  int data, sig, answer; /* sig/answer: -1 without the check */
} mpip_tags;

/* A staging buffer (see mlxd_mpi_stage_get). */
typedef struct stage {
  void* p;
  size_t cap;
} stage;

typedef struct mpi_group {
  mpip_backend base; /* first */
  MPI_Comm comm;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC */
  uint64_t next_seq; /* the collective allowed to be issued next */
  bool failed;
  int failed_flag; /* failed, read without mu (__atomic) by check-mode waits */
  bool check;      /* MLXDIST_CHECK=1 agreed at create (constant) */
  int abort_flag;  /* set (__atomic) by abort (ABI v4): waits end at once once failed */
  mlxd_status fail_st;
  stage pool[MPI_STAGE_POOL]; /* idle staging buffers (under mu) */
} mpi_group;

/* A send handed to the progress thread (mpi_progress.c). */
typedef struct pending_send {
  struct pending_send* next;
  mpi_group* g; /* NULL once the group is destroyed */
  MPI_Request* reqs;
  int nreq;
  int left;
  void* buf;
  size_t nbytes;
  int dst;
  double deadline;
  /* ABI v3 send_ref: buf is the caller's array, held (held set) and released
   * once the data has left (mlxd_mpi_pending_free, never under g_send_mu);
   * else buf is the plugin's copy, freed with p. */
  bool held;
  mpip_hold hold;
  void (*release)(mpip_hold* hold);
  /* MLXDIST_CHECK=1 (mpi_check.c): the signature went out first, and the
   * data (reqs) is posted only once the receiver's answer agrees. */
  bool awaiting_answer;
  MPI_Request check_reqs[2]; /* [0] our signature, [1] the answer */
  unsigned char check_buf[2 * MPIP_SIG_BYTES];
  uint64_t seq;
  MPI_Comm comm;
  int data_tag;
} pending_send;

/* ---- mpi_runtime.c ---------------------------------------------------- */

/* The host table given to the entry point (copied once, then read-only). */
extern mpip_host mlxd_mpi_host;

/* Failures inside the plugin are structured (util/status.h, whose one
 * self-contained file is compiled into the plugin: it links no libmlxdist):
 * a detail without "[mpi]", op or rank, and the peer where MPI names it. The
 * op at the ABI boundary renders it once (mlxd_mpi_done):
 *   [mpi] all_sum #17 on rank 0: <detail> */
__attribute__((format(printf, 3, 4))) int mlxd_mpi_fail(mlxd_status* st, int code, const char* fmt,
                                                        ...);
/* "<call> failed in <what>: <MPI_Error_string>" ("<call> failed: ..." without what). */
int mlxd_mpi_fail_call(mlxd_status* st, int code, int mpi_rc, const char* call, const char* what);
/* At the plugin ABI's boundary: 0 when rc is 0; else render s once, with the
 * op and its sequence number (op NULL: none, e.g. create) and this rank
 * (rank < 0: unknown), into out (code, message, peer) and return the code.
 * A group failed earlier (MPIP_EABORTED, s->op set by the op that failed
 * it) also names that op. */
int mlxd_mpi_done(int rc, mlxd_status* s, const char* op, uint64_t seq, int rank, mpip_status* out);

/* Around every MPI call: a mutex only under MPI_THREAD_SERIALIZED. */
void mlxd_mpi_call_lock(void);
void mlxd_mpi_call_unlock(void);
double mlxd_mpi_timeout_s(void);
void mlxd_mpi_cv_init_monotonic(pthread_cond_t* cv);
struct timespec mlxd_mpi_abs_monotonic(double deadline);

/* What requests given up on still use, released once MPI completes them. */
typedef struct mpi_keep {
  const mpip_bufref* ref; /* the caller's arrays (ABI v3): a hold is taken, then released */
  void* own;              /* the plugin's memory (a staging buffer): freed */
  /* A hold taken earlier (a send's, pending_send.held): moved into the set,
   * released once complete. Without ref or own the progress thread is not
   * woken (the caller may be it, under g_send_mu); it polls anyway. */
  const mpip_hold* held;
  void (*release)(mpip_hold* hold);
} mpi_keep;
/* Requests given up on (a timeout), remembered for the exit hook and polled
 * by the progress thread. mlxd_mpi_abandon keeps whatever they use forever
 * (the caller leaks it). mlxd_mpi_abandon_keep takes keep's resources:
 * released at once when no request is left, else when all have completed
 * (a late peer) on the progress thread or at exit, never otherwise; it
 * starts the progress thread, so it must not be called with g_send_mu held
 * (the progress thread's own sends use mlxd_mpi_abandon). keep may be NULL. */
void mlxd_mpi_abandon(const MPI_Request* reqs, int n);
void mlxd_mpi_abandon_keep(const MPI_Request* reqs, int n, const mpi_keep* keep);
/* Test every abandoned request once (g_send_mu not held); release what the
 * completed ones kept (no lock held). *completed: some set completed.
 * Returns whether any is left. */
bool mlxd_mpi_lost_poll(bool* completed);
/* Whether any abandoned request is left (cheap). */
bool mlxd_mpi_lost_pending(void);
/* Every op that calls MPI runs between these, so the exit hook never
 * finalises under it. */
int mlxd_mpi_op_begin(mlxd_status* st);
void mlxd_mpi_op_end(void);

/* Copy the host table (the entry point checked it). */
void mlxd_mpi_set_host(const mpip_host* host);
#if MPIP_HAS_DESCRIBE
/* The describe op (ABI v2): MPI library and version, thread level, size. */
void mlxd_mpi_describe(mpip_backend* b, char* buf, size_t len);
#endif

/* The kind's functions. */
bool mlxd_mpi_is_available(char* why, size_t why_len);
bool mlxd_mpi_is_configured(bool with_bootstrap);
int mlxd_mpi_create(mpip_bootstrap* bs, mpip_backend** out, mpip_status* st);

/* ---- mpi_progress.c --------------------------------------------------- */

int mlxd_mpi_test_all(int n, MPI_Request* reqs, int* flag);
void mlxd_mpi_group_fail(mpi_group* g, const mlxd_status* st);
int mlxd_mpi_group_check(mpi_group* g, mlxd_status* st);
/* An op of g at the ABI boundary: mlxd_mpi_done with g's rank; an op whose
 * failure failed the group is noted in it, so later ops name it. */
int mlxd_mpi_group_done(mpi_group* g, int rc, mlxd_status* s, const char* op, uint64_t seq,
                        mpip_status* out);
int mlxd_mpi_turn_wait(mpi_group* g, uint64_t seq, const char* what, mlxd_status* st);
void mlxd_mpi_turn_done(mpi_group* g);
/* Wait (bounded) for reqs; what names them in messages ("recv of 40 bytes
 * from rank 1"), peer is the rank they talk to (-1: a collective), set as
 * the failure's peer. */
int mlxd_mpi_wait_reqs(mpi_group* g, MPI_Request* reqs, int n, MPI_Status* statuses,
                       bool cancel_on_timeout, const char* what, int peer, mlxd_status* st);
/* The same; on failure what is left is abandoned with keep
 * (mlxd_mpi_abandon_keep takes keep's resources), on success keep is untouched. */
int mlxd_mpi_wait_reqs_keep(mpi_group* g, MPI_Request* reqs, int n, MPI_Status* statuses,
                            bool cancel_on_timeout, const mpi_keep* keep, const char* what,
                            int peer, mlxd_status* st);
/* Make sure the progress thread runs and polls the abandoned requests soon. */
void mlxd_mpi_progress_kick(void);

void mlxd_mpi_progress_init(void);
/* Free p: its copy, or release its hold (then never with g_send_mu held). */
void mlxd_mpi_pending_free(pending_send* p);
int mlxd_mpi_sends_add(pending_send* p, mlxd_status* st);
/* Sends of a destroyed group finish in the background without it. */
void mlxd_mpi_sends_forget_group(mpi_group* g);
/* At exit: let pending sends finish (each bounded), then stop the thread. */
void mlxd_mpi_sends_stop(void);

/* ---- mpi_dtype.c ------------------------------------------------------ */

MPI_Datatype mlxd_mpi_dtype(mpip_dtype d);
MPI_Op mlxd_mpi_op(mpip_dtype d, mpip_op op);
int mlxd_mpi_create_user_ops(mlxd_status* st);
void mlxd_mpi_free_user_ops(void);
const char* mlxd_mpi_reduce_name(mpip_op op);
const char* mlxd_mpi_scatter_name(mpip_op op);

/* ---- mpi_ops.c -------------------------------------------------------- */

size_t mlxd_mpi_chunk_bytes(void);
mpi_group* mlxd_mpi_group_new(MPI_Comm comm, mlxd_status* st);
int mlxd_mpi_stage_get(mpi_group* g, size_t n, stage* out);
void mlxd_mpi_stage_put(mpi_group* g, stage* sgs);

/* ---- mpi_check.c ------------------------------------------------------ */

bool mlxd_mpi_check_env(void);
void mlxd_mpi_sig_encode(unsigned char out[MPIP_SIG_BYTES], const mpip_sig* s);
void mlxd_mpi_sig_decode(const unsigned char in[MPIP_SIG_BYTES], mpip_sig* s);
/* dtype < 0: none. */
mpip_sig mlxd_mpi_sig(const mpi_group* g, int op, int dtype, uint64_t count, uint64_t seq);
void mlxd_mpi_sig_str(const mpip_sig* s, char* out, size_t n);
int mlxd_mpi_sig_mismatch(mlxd_status* st, int ra, const mpip_sig* a, int rb, const mpip_sig* b,
                          int peer);
/* At create: g->check = whether any rank set MLXDIST_CHECK=1. */
int mlxd_mpi_check_agree(mpi_group* g, mlxd_status* st);
/* Collectives, with the turn held: 0, or the mismatch (group failed). */
int mlxd_mpi_check_coll(mpi_group* g, const mpip_sig* mine, const char* name, mlxd_status* st);
mpip_tags mlxd_mpi_p2p_tags(const mpi_group* g, uint64_t seq);
int mlxd_mpi_check_recv(mpi_group* g, uint64_t seq, size_t nbytes, int src, mlxd_status* st);
int mlxd_mpi_check_send_post(pending_send* p, mpi_group* g, uint64_t seq, mlxd_status* st);
int mlxd_mpi_check_send_answer(const pending_send* p, int rank, mlxd_status* st);

/* ---- mpi_p2p.c -------------------------------------------------------- */

/* Post the data pieces of p (p->reqs, p->nreq set); 0 or the MPI failure. */
int mlxd_mpi_send_post_data(pending_send* p, mlxd_status* st);

int mlxd_mpi_send(mpip_backend* b, uint64_t seq, const void* buf, size_t nbytes, int dst,
                  mpip_status* st);
#if MPIP_HAS_REF
/* send from the caller's array directly, held until the data has left (ABI v3). */
int mlxd_mpi_send_ref(mpip_backend* b, uint64_t seq, const void* buf, size_t nbytes, int dst,
                      const mpip_bufref* ref, mpip_status* st);
#endif
int mlxd_mpi_recv(mpip_backend* b, uint64_t seq, void* buf, size_t nbytes, int src,
                  mpip_status* st);
#if MPIP_HAS_REF
/* recv into the caller's array directly (ABI v3). */
int mlxd_mpi_recv_ref(mpip_backend* b, uint64_t seq, void* buf, size_t nbytes, int src,
                      const mpip_bufref* ref, mpip_status* st);
#endif

/* ---- mpi_a2a.c -------------------------------------------------------- */

#if MPIP_HAS_RUN
/* all_to_all on the caller's arrays: MPI_Ialltoall of bytes, parts above the
 * chunk bound (MLXDIST_MPI_CHUNK_BYTES, at most 1 GiB) in pieces of a strided
 * type; rendered at the boundary as the ops are. */
int mlxd_mpi_all_to_all(mpip_backend* b, uint64_t seq, const void* in, void* out, size_t part_bytes,
                        const mpip_bufref* ref, mpip_status* st);
/* 0, or the call's buffer in a memory kind MPI cannot address here (device
 * memory, an unknown kind): rendered, and the group failed for a collective
 * (the other ranks may have issued it). */
int mlxd_mpi_run_check(mpip_backend* b, const mpip_call* call, const char* name, mpip_status* st);
/* ABI v4's abort: fail the group with reason; its waits end at once. */
void mlxd_mpi_abort(mpip_backend* b, const char* reason);
#endif

#endif

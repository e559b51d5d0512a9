/* The mpi plugin's call checks (MLXDIST_CHECK=1): what each rank is
 * calling, exchanged before the data moves, so ranks that make different
 * calls fail with both calls named instead of hanging or mixing data.
 *
 * - Every collective (all_sum/max/min, all_gather, sum_scatter, all_to_all,
 *   split) first all-gathers a 24-byte signature over the group's
 *   communicator (op, dtype, element count or bytes, group size, sequence
 *   number), in its turn. If any rank's differs from rank 0's, every rank fails the op with
 *   the same message: rank 0 against the lowest rank that differs. No data
 *   collective is issued, so MPI stays in step.
 * - A send first sends its signature (its own tag); the receiver answers
 *   with its own, and only then does the sender's progress thread post the
 *   data (mpi_progress.c). Both sides compare the same pair and fail with
 *   the same message; the send itself returns once posted (as without the
 *   check), so the sender learns of a mismatch when the answer arrives: its
 *   group fails and its pending and later ops fail with the message.
 * - Whether a group checks is agreed at create (any rank that sets
 *   MLXDIST_CHECK=1 turns it on for all): ranks that disagreed would issue
 *   different MPI calls.
 * The messages use the ring backend's words (transport/match.c,
 * mlxd_sig_mismatch), with this plugin's own formatter (the plugin does not
 * link the core); the op at the ABI boundary adds "[mpi] <op> #<seq> on
 * rank R: " (mlxd_mpi_done). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/mpi/mpi_internal.h"

/* ---------------------------------------------------------------------- */
/* The setting. */

/* MLXDIST_CHECK as the core's FLAG rule reads it (blanks around 0 or 1;
 * the core's init has refused anything else). */
bool mlxd_mpi_check_env(void) {
  const char* v = getenv("MLXDIST_CHECK");
  if (!v) return false;
  while (*v == ' ' || *v == '\t') v++;
  return *v == '1';
}

/* ---------------------------------------------------------------------- */
/* Signatures. */

static void put_be(unsigned char* p, uint64_t v, int n) {
  for (int i = n - 1; i >= 0; i--, v >>= 8) p[i] = (unsigned char)(v & 0xFF);
}
static uint64_t get_be(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v = (v << 8) | p[i];
  return v;
}

void mlxd_mpi_sig_encode(unsigned char out[MPIP_SIG_BYTES], const mpip_sig* s) {
  memset(out, 0, MPIP_SIG_BYTES);
  out[0] = s->op;
  out[1] = s->dtype;
  put_be(out + 4, s->size, 4);
  put_be(out + 8, s->count, 8);
  put_be(out + 16, s->seq, 8);
}
void mlxd_mpi_sig_decode(const unsigned char in[MPIP_SIG_BYTES], mpip_sig* s) {
  s->op = in[0];
  s->dtype = in[1];
  s->size = (uint32_t)get_be(in + 4, 4);
  s->count = get_be(in + 8, 8);
  s->seq = get_be(in + 16, 8);
}

mpip_sig mlxd_mpi_sig(const mpi_group* g, int op, int dtype, uint64_t count, uint64_t seq) {
  mpip_sig s = {(uint8_t)op, (uint8_t)(dtype < 0 ? MPIP_SIG_NO_DTYPE : dtype),
                (uint32_t)g->base.size, count, seq};
  return s;
}

static const char* sig_op_name(unsigned op) {
  static const char* const names[MPIP_SIG_OPS] = {[MPIP_SIG_ALL_SUM] = "all_sum",
                                                  [MPIP_SIG_ALL_MAX] = "all_max",
                                                  [MPIP_SIG_ALL_MIN] = "all_min",
                                                  [MPIP_SIG_ALL_GATHER] = "all_gather",
                                                  [MPIP_SIG_SUM_SCATTER] = "sum_scatter",
                                                  [MPIP_SIG_MAX_SCATTER] = "max_scatter",
                                                  [MPIP_SIG_MIN_SCATTER] = "min_scatter",
                                                  [MPIP_SIG_SEND] = "send",
                                                  [MPIP_SIG_RECV] = "recv",
                                                  [MPIP_SIG_SPLIT] = "split",
                                                  [MPIP_SIG_ALL_TO_ALL] = "all_to_all"};
  return op < MPIP_SIG_OPS ? names[op] : NULL;
}

static const char* dtype_name(unsigned d) {
  static const char* const names[] = {
      [MPIP_BOOL] = "bool",         [MPIP_UINT8] = "uint8",        [MPIP_UINT16] = "uint16",
      [MPIP_UINT32] = "uint32",     [MPIP_UINT64] = "uint64",      [MPIP_INT8] = "int8",
      [MPIP_INT16] = "int16",       [MPIP_INT32] = "int32",        [MPIP_INT64] = "int64",
      [MPIP_FLOAT16] = "float16",   [MPIP_FLOAT32] = "float32",    [MPIP_FLOAT64] = "float64",
      [MPIP_BFLOAT16] = "bfloat16", [MPIP_COMPLEX64] = "complex64"};
  return d < sizeof names / sizeof names[0] ? names[d] : NULL;
}

/* "all_sum(float32 x 10)", "all_gather(20 bytes)", "send(40 bytes)", "split". */
void mlxd_mpi_sig_str(const mpip_sig* s, char* out, size_t n) {
  const char* name = sig_op_name(s->op);
  char unknown[32];
  if (!name) {
    snprintf(unknown, sizeof unknown, "an unknown op (%u)", (unsigned)s->op);
    name = unknown;
  }
  if (s->op == MPIP_SIG_SPLIT) {
    snprintf(out, n, "%s", name);
  } else if (s->op == MPIP_SIG_ALL_TO_ALL) {
    snprintf(out, n, "%s(%llu bytes a part)", name, (unsigned long long)s->count);
  } else if (s->dtype == MPIP_SIG_NO_DTYPE) {
    snprintf(out, n, "%s(%llu bytes)", name, (unsigned long long)s->count);
  } else {
    const char* dt = dtype_name(s->dtype);
    char other[24];
    if (!dt) {
      snprintf(other, sizeof other, "dtype %u", (unsigned)s->dtype);
      dt = other;
    }
    snprintf(out, n, "%s(%s x %llu)", name, dt, (unsigned long long)s->count);
  }
}

/* Whether a message signed `a` may meet a call signed `b` (a send meets a recv). */
static bool sig_agree(const mpip_sig* a, const mpip_sig* b) {
  bool ops = a->op == b->op || (a->op == MPIP_SIG_SEND && b->op == MPIP_SIG_RECV) ||
             (a->op == MPIP_SIG_RECV && b->op == MPIP_SIG_SEND);
  return ops && a->dtype == b->dtype && a->size == b->size && a->count == b->count &&
         a->seq == b->seq;
}

/* "mismatched calls: rank A called X, rank B called Y" (A < B), plus what
 * else differs; code EINVAL, peer set (the op at the boundary adds
 * "[mpi] <op> #<seq> on rank R: "). */
int mlxd_mpi_sig_mismatch(mlxd_status* st, int ra, const mpip_sig* a, int rb, const mpip_sig* b,
                          int peer) {
  if (ra > rb) {
    const mpip_sig* ts = a;
    int tr = ra;
    a = b, ra = rb;
    b = ts, rb = tr;
  }
  char sa[96], sb[96], extra[128] = "";
  mlxd_mpi_sig_str(a, sa, sizeof sa);
  mlxd_mpi_sig_str(b, sb, sizeof sb);
  size_t len = 0;
  if (a->size != b->size)
    len += (size_t)snprintf(extra + len, sizeof extra - len,
                            " (rank %d sees a group of %u, rank %d of %u)", ra, (unsigned)a->size,
                            rb, (unsigned)b->size);
  if (a->seq != b->seq && len < sizeof extra)
    snprintf(extra + len, sizeof extra - len, " (rank %d is at #%llu, rank %d at #%llu)", ra,
             (unsigned long long)a->seq, rb, (unsigned long long)b->seq);
  int code =
      mlxd_mpi_fail(st, MPIP_EINVAL, "mismatched calls: rank %d called %s, rank %d called %s%s", ra,
                    sa, rb, sb, extra);
  mlxd_status_set_peer(st, peer, NULL);
  return code;
}

/* ---------------------------------------------------------------------- */
/* Agreement at create. */

int mlxd_mpi_check_agree(mpi_group* g, mlxd_status* st) {
  /* Heap, not stack: after a timeout MPI may still write into it (kept then). */
  int* v = malloc(2 * sizeof *v);
  if (!v) return mlxd_mpi_fail(st, MPIP_ENOMEM, "out of memory in init");
  v[0] = mlxd_mpi_check_env() ? 1 : 0;
  v[1] = 0;
  MPI_Request req = MPI_REQUEST_NULL;
  mlxd_mpi_call_lock();
  int mrc = MPI_Iallreduce(&v[0], &v[1], 1, MPI_INT, MPI_MAX, g->comm, &req);
  mlxd_mpi_call_unlock();
  if (mrc != MPI_SUCCESS) {
    free(v);
    return mlxd_mpi_fail_call(st, MPIP_EUNAVAIL, mrc, "MPI_Iallreduce",
                              "init (agreeing on MLXDIST_CHECK)");
  }
  int rc = mlxd_mpi_wait_reqs(g, &req, 1, NULL, false, "init (agreeing on MLXDIST_CHECK)", -1, st);
  if (rc) return rc; /* v is kept */
  g->check = v[1] != 0;
  free(v);
  return 0;
}

/* ---------------------------------------------------------------------- */
/* Collectives: the signature all-gather (turn held by the caller). */

int mlxd_mpi_check_coll(mpi_group* g, const mpip_sig* mine, const char* name, mlxd_status* st) {
  int n = g->base.size;
  /* [0, n): every rank's signature; [n]: ours (kept together if MPI keeps them). */
  unsigned char* buf = malloc(((size_t)n + 1) * MPIP_SIG_BYTES);
  if (!buf) {
    mlxd_mpi_fail(st, MPIP_ENOMEM, "out of memory in the call check (MLXDIST_CHECK=1)");
    mlxd_mpi_group_fail(g, st);
    return MPIP_ENOMEM;
  }
  unsigned char* own = buf + (size_t)n * MPIP_SIG_BYTES;
  mlxd_mpi_sig_encode(own, mine);
  char what[128];
  snprintf(what, sizeof what, "the call check (MLXDIST_CHECK=1) of %s", name);
  MPI_Request req = MPI_REQUEST_NULL;
  mlxd_mpi_call_lock();
  int mrc =
      MPI_Iallgather(own, MPIP_SIG_BYTES, MPI_BYTE, buf, MPIP_SIG_BYTES, MPI_BYTE, g->comm, &req);
  mlxd_mpi_call_unlock();
  if (mrc != MPI_SUCCESS) {
    free(buf);
    int rc = mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Iallgather", what);
    mlxd_mpi_group_fail(g, st);
    return rc;
  }
  int rc = mlxd_mpi_wait_reqs(g, &req, 1, NULL, false, what, -1, st);
  if (rc) return rc; /* buf is kept: MPI may still write into it */
  int first = -1;
  for (int r = 1; r < n && first < 0; r++)
    if (memcmp(buf + (size_t)r * MPIP_SIG_BYTES, buf, MPIP_SIG_BYTES) != 0) first = r;
  if (first >= 0) {
    mpip_sig s0, sr;
    mlxd_mpi_sig_decode(buf, &s0);
    mlxd_mpi_sig_decode(buf + (size_t)first * MPIP_SIG_BYTES, &sr);
    int rank = g->base.rank;
    rc = mlxd_mpi_sig_mismatch(st, 0, &s0, first, &sr, rank == 0 ? first : 0);
    mlxd_mpi_group_fail(g, st);
  }
  free(buf);
  return rc;
}

/* ---------------------------------------------------------------------- */
/* Point to point. */

/* Tags: without the check, the sequence number mod 32768 (the standard's
 * least MPI_TAG_UB is 32767). With it, three tags per message in the same
 * range: data, the send's signature, the receiver's answer. */
#define MPI_P2P_TAG_MOD 32768u
#define MPI_CHECK_TAG_MOD 10922u /* 3 * 10922 <= 32767 */
mpip_tags mlxd_mpi_p2p_tags(const mpi_group* g, uint64_t seq) {
  mpip_tags t;
  if (!g->check) {
    t.data = (int)(seq % MPI_P2P_TAG_MOD);
    t.sig = t.answer = -1;
  } else {
    int base = 3 * (int)(seq % MPI_CHECK_TAG_MOD);
    t.data = base;
    t.sig = base + 1;
    t.answer = base + 2;
  }
  return t;
}

/* Receiver: take the send's signature, answer with ours, compare. */
int mlxd_mpi_check_recv(mpi_group* g, uint64_t seq, size_t nbytes, int src, mlxd_status* st) {
  mpip_tags tags = mlxd_mpi_p2p_tags(g, seq);
  mpip_sig mine = mlxd_mpi_sig(g, MPIP_SIG_RECV, -1, nbytes, seq);
  /* [0]: theirs, [1]: ours (kept if MPI keeps them). */
  unsigned char* buf = malloc(2 * MPIP_SIG_BYTES);
  if (!buf)
    return mlxd_mpi_fail(st, MPIP_ENOMEM, "out of memory in the call check (MLXDIST_CHECK=1)");
  unsigned char* ours = buf + MPIP_SIG_BYTES;
  mlxd_mpi_sig_encode(ours, &mine);
  char what[128];
  snprintf(what, sizeof what, "the call check (MLXDIST_CHECK=1) of a recv from rank %d", src);
  MPI_Request req = MPI_REQUEST_NULL;
  mlxd_mpi_call_lock();
  int mrc = MPI_Irecv(buf, MPIP_SIG_BYTES, MPI_BYTE, src, tags.sig, g->comm, &req);
  mlxd_mpi_call_unlock();
  if (mrc != MPI_SUCCESS) {
    free(buf);
    int rc = mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Irecv", what);
    mlxd_mpi_group_fail(g, st);
    return rc;
  }
  MPI_Status mst;
  int rc = mlxd_mpi_wait_reqs(g, &req, 1, &mst, true, what, src, st);
  if (rc) {
    if (req == MPI_REQUEST_NULL) free(buf); /* cancelled: nothing uses it */
    return rc;
  }
  int got = 0;
  MPI_Get_count(&mst, MPI_BYTE, &got);
  if (got != MPIP_SIG_BYTES) {
    free(buf);
    rc = mlxd_mpi_fail(st, MPIP_EINVAL,
                       "the call check from rank %d had %d bytes, not %d "
                       "(is MLXDIST_CHECK set the same way on every rank?)",
                       src, got, MPIP_SIG_BYTES);
    mlxd_status_set_peer(st, src, NULL);
    mlxd_mpi_group_fail(g, st);
    return rc;
  }
  /* Answer, whatever the outcome: the sender waits for it. */
  mlxd_mpi_call_lock();
  mrc = MPI_Isend(ours, MPIP_SIG_BYTES, MPI_BYTE, src, tags.answer, g->comm, &req);
  mlxd_mpi_call_unlock();
  if (mrc != MPI_SUCCESS) {
    free(buf);
    rc = mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Isend", what);
    mlxd_mpi_group_fail(g, st);
    return rc;
  }
  /* The sender posted the receive of the answer with its signature: prompt. */
  rc = mlxd_mpi_wait_reqs(g, &req, 1, NULL, false, what, src, st);
  if (rc) return rc; /* buf is kept */
  mpip_sig theirs;
  mlxd_mpi_sig_decode(buf, &theirs);
  free(buf);
  if (!sig_agree(&theirs, &mine)) {
    rc = mlxd_mpi_sig_mismatch(st, src, &theirs, g->base.rank, &mine, src);
    mlxd_mpi_group_fail(g, st);
  }
  return rc;
}

/* Sender: post the signature and the receive of the answer (into p->check). */
int mlxd_mpi_check_send_post(pending_send* p, mpi_group* g, uint64_t seq, mlxd_status* st) {
  mpip_tags tags = mlxd_mpi_p2p_tags(g, seq);
  mpip_sig mine = mlxd_mpi_sig(g, MPIP_SIG_SEND, -1, p->nbytes, seq);
  mlxd_mpi_sig_encode(p->check_buf, &mine);
  p->check_reqs[0] = p->check_reqs[1] = MPI_REQUEST_NULL;
  p->seq = seq;
  p->comm = g->comm;
  p->data_tag = tags.data;
  mlxd_mpi_call_lock();
  int mrc = MPI_Irecv(p->check_buf + MPIP_SIG_BYTES, MPIP_SIG_BYTES, MPI_BYTE, p->dst, tags.answer,
                      g->comm, &p->check_reqs[1]);
  if (mrc == MPI_SUCCESS)
    mrc = MPI_Isend(p->check_buf, MPIP_SIG_BYTES, MPI_BYTE, p->dst, tags.sig, g->comm,
                    &p->check_reqs[0]);
  mlxd_mpi_call_unlock();
  if (mrc != MPI_SUCCESS) {
    char what[96];
    snprintf(what, sizeof what, "the call check (MLXDIST_CHECK=1) of a send to rank %d", p->dst);
    int rc = mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Isend", what);
    mlxd_status_set_peer(st, p->dst, NULL);
    return rc;
  }
  p->awaiting_answer = true;
  return 0;
}

/* Sender, once both check requests completed: compare the answer (0 when
 * the calls agree; the mismatch otherwise, st filled). */
int mlxd_mpi_check_send_answer(const pending_send* p, int rank, mlxd_status* st) {
  mpip_sig mine, theirs;
  mlxd_mpi_sig_decode(p->check_buf, &mine);
  mlxd_mpi_sig_decode(p->check_buf + MPIP_SIG_BYTES, &theirs);
  if (sig_agree(&mine, &theirs)) return 0;
  return mlxd_mpi_sig_mismatch(st, rank, &mine, p->dst, &theirs, p->dst);
}

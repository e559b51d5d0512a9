/* The shared-memory transport: tag-matched messages between processes on
 * one host through one POSIX shared-memory segment.
 *
 * Segments. The first rank to get there creates /dev/shm/<name> (shm_open
 * O_EXCL + ftruncate + mmap); the others open it (this user's, mode 0600,
 * the group's size) and wait, bounded by MLXDIST_CONNECT_TIMEOUT, for the
 * magic its creator writes last.
 * It holds a header (geometry, a magic word written last), one record per
 * rank (pid, state, failure message, a futex "doorbell", heartbeat, a hello
 * counter) and one hello bitmap per rank. Each rank counts itself in with an
 * atomic increment; the rank that completes the count unlinks the name.
 * The lanes of a pair live in a segment of their own, <name>~<lo>-<hi>~<pids>~<pid ns> (pair_name),
 * made on the pair's first isend/irecv (shm_setup.c mlxd_shm_pair_attach):
 * O_EXCL picks the one creator, the other checks owner, mode and size and
 * waits for its magic (t->mu dropped around each sleep); the creator sets
 * its bit in the peer's hello bitmap and rings it, so the peer maps the pair
 * at its next progress pass; the second to map it unlinks the name. Pairs that never talk map nothing.
 *
 * Lanes. A lane is a single-producer single-consumer queue of SHM_NSLOTS
 * fixed slots of SHM_SLOT_BYTES, each with a 64-byte header (kind, tag,
 * message length, chunk length, address; in a message's first chunk the
 * sender's call signature). The pair's first page holds its header, both
 * lanes' control words and both lanes' slot headers; the data slots follow.
 * A chunk of at most SHM_INLINE_BYTES travels in its header, so a pair that
 * only exchanges small messages touches that one page (each page a rank
 * touches first costs a page fault: ~20-40 us on a VM with shadow page
 * tables, where the slots' pages were most of the CPU of a 256-rank job's
 * small ops; docs/scale.md). The producer owns `head`, the
 * consumer owns `tail` and `acked`, each on its own cache line; they are
 * C11 atomics published with release and read with acquire, and the slot
 * contents are plain memory ordered by them. A message is a sequence of
 * chunks in consecutive slots of its lane (so chunks of different messages
 * never interleave on one lane; a zero-byte message is one empty chunk).
 *
 * Large messages (>= cma_min) use a single copy when cross-memory attach
 * works (probed when a pair is first mapped, by a rank with a threshold: it
 * reads a value from its peer with process_vm_readv and says so in the
 * pair's header): the sender puts one "ready to send" slot holding its
 * buffer's address, the receiver reads the bytes straight from the sender's
 * memory into the receive buffer and bumps `acked`; the send completes when
 * its ticket is acked. Where CMA is refused (ptrace policy, seccomp) every
 * message takes the two-copy lane path, which pipelines because producer
 * and consumer work on different slots at the same time. A send that makes
 * the pair finds no probe yet and takes the lanes. The threshold (spin.h
 * mlxd_shm_cma_bytes_for, by the tag's kind): MLXDIST_SHM_CMA_BYTES when
 * set (0: off); unset, 32 MiB on a crowded host (more of the group's ranks
 * on it than CPUs this process may run on), where a lane step waits for
 * the sender and the receiver to be on a CPU at once and a single copy
 * needs only the receiver; otherwise, for point to point, off (one way,
 * the lanes' two copies run on two cores at once), and for collectives,
 * where every rank sends while it receives, what this machine's
 * calibration chose (cma_calib.h: once a boot, an exchange of 16 KiB-1 MiB
 * between two threads over lanes against process_vm_readv, in at most
 * ~10 ms, kept in /dev/shm/.mlxdist-cma-<uid> for the boot's other
 * processes): off where process_vm_readv is slow (VMs with paravirtualised
 * page tables, docs/ring.md), 16 KiB on the Intel Xeon VM. The
 * ranks need not agree on it: the sender picks the path, the receiver
 * takes either (shm_setup.c, cma_min). The crowded rule's 32 MiB stays
 * above the pipeline's 256 KiB chunks: it reaches whole-buffer messages
 * (send/recv, the direct all_gather of 2 ranks, and of more where every
 * rank is crowded: mlxd_transport.whole_min); docs/performance.md,
 * "Single copy by default on a crowded host" and "Single copy: calibrated
 * where the host is not crowded", has the measurements.
 *
 * Matching. The receiver drains every mapped incoming lane whenever it makes
 * progress. The first chunk of a message is matched by (peer, tag) against
 * the posted receives of that peer, in posting order; a match gets its
 * bytes written straight into its buffer. A message without a posted
 * receive, of any size, stays in its lane (its receive, posted a moment
 * later, takes it with one copy; its sender waits meanwhile, on a full lane
 * or for the ack of a single copy) until the waiter is idle for
 * SHM_DEFER_S or would sleep; then it is buffered (mlxd_buffer_alloc, or
 * read at once through CMA and acked), so two ranks that both send before
 * receiving never deadlock, and a message with no receive coming does not
 * hold up the messages behind it in its lane for longer than that; a later
 * receive takes it over (a partly arrived one continues). Buffering at once
 * (a large message, a full lane: the rule before) was a second copy and a
 * staging buffer whenever the receive came a moment after the message, as
 * in a window of sends whose receives a stream posts one after another
 * (4 MiB: 1.1 ms -> 0.44-0.51 ms a message).
 * Signatures must agree (sig_clash: the message's with its receive's, or
 * with any receive or message of the same operation when the tags differ);
 * a disagreement fails the transport (published: the peers fail with it
 * too). A size mismatch of unsigned messages fails that receive only; the
 * bytes are drained and dropped.
 *
 * Progress and waiting. There is no background thread: isend/irecv try to
 * move data at once and waitall drives every lane. All local state is under
 * one mutex. A waiting thread polls for MLXDIST_SPIN_US after the last
 * event (with sched_yield when there are more ranks than CPUs, so spinning
 * ranks do not starve the rank they wait for), then sleeps on its rank's
 * doorbell (a futex in the segment, at most t->check_s at a time). Whoever
 * publishes something a rank waits for (a chunk; slots freed in a lane it
 * found full; an ack) bumps that rank's doorbell and wakes it if it sleeps
 * (a seq_cst fence on both sides closes the lost-wake-up window); a rank's
 * own doorbell is rung for its other waiting threads only when there are
 * any.
 *
 * Failure. Every 100 ms without progress (500 ms on a host with more than
 * SHM_CROWDED_FACTOR times as many ranks as CPUs) the waiter checks the peers its
 * pending requests involve: a process that exited ("lost connection to
 * rank N: its process exited", peer address "pid P"), a transport that was
 * closed, or one that failed (its structured status is published in the
 * segment; this rank relays it with "reported by" that rank), and their
 * liveness (liveness.h): each rank's watchdog bumps a heartbeat counter in
 * its record every beat_s, so a peer whose counter stands still for
 * MLXDIST_TIMEOUT (stopped, frozen) is dead, while one that is alive but
 * not there yet gets one warning after MLXDIST_WARN_AFTER and fails the
 * wait only after MLXDIST_OP_TIMEOUT without progress. At the end of every
 * wait one load per peer of its state catches a failure a peer published
 * (it gave up on this operation): the wait fails. Any of these fails the
 * whole transport: pending and later operations fail with the first status,
 * and the failure is published in the segment so peers waiting on this rank
 * fail promptly too. Sizes are size_t throughout (CMA reads are looped), so
 * messages above 2 GiB work. */
#include "transport/shm.h"
#include "transport/shm_impl.h"

#include <math.h>

#include "util/ztable.h"

/* ---- small helpers ---- */

static long futex(_Atomic uint32_t* addr, int op, uint32_t val, const struct timespec* ts) {
  return syscall(SYS_futex, (uint32_t*)addr, op, val, ts, NULL, 0);
}

/* Wake rank r if a thread of it sleeps on its doorbell. */
static void ring_bell(shm_transport* t, int r) {
  shm_rank_rec* rec = rank_rec(t, r);
#if SHM_TSAN
  /* TSan does not model fences: an RMW orders the same way (slower). */
  if (atomic_fetch_add_explicit(&rec->sleepers, 0, memory_order_seq_cst) != 0) {
#else
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&rec->sleepers, memory_order_relaxed) != 0) {
#endif
    atomic_fetch_add_explicit(&rec->doorbell, 1, memory_order_seq_cst);
    futex(&rec->doorbell, FUTEX_WAKE, INT_MAX, NULL);
  }
}

/* Wake every peer that may wait on this rank: those whose pair with it is
 * mapped here, and those that made one this rank has not mapped yet (its
 * hello bits). A rank without a pair with this one has nothing of it to
 * wait for (and its record stays untouched: at 1,024 ranks ringing every
 * rank faulted in the host segment's 256 pages of records in every rank). */
static void ring_paired(shm_transport* t) {
  for (int k = 0; k < t->nactive; k++) ring_bell(t, t->active[k]);
  _Atomic uint64_t* bits = hello_bits(t, t->base.rank);
  for (size_t w = 0; w < hello_words(t->base.size); w++) {
    uint64_t v = atomic_load_explicit(&bits[w], memory_order_acquire);
    while (v) {
      int pi = (int)(w * 64) + __builtin_ctzll(v);
      v &= v - 1;
      if (pi < t->base.size && pi != t->base.rank && !t->peers[pi].mapped) ring_bell(t, pi);
    }
  }
}

static void shm_fail_posted(void* ctx, mlxd_match_link* l) {
  shm_transport* t = ctx;
  mlxd_eng_req* r = MLXD_MATCH_ENTRY(l, mlxd_eng_req, link);
  r->where = MLXD_ENG_NONE;
  r->m.complete = true;
  r->m.code = t->eng.err.code;
}

/* Fail the whole transport with *st (the first failure wins); publish it
 * to the peers. Called with mu held. */
static void shm_fail(shm_transport* t, const mlxd_status* st) {
  if (!mlxd_match_fail_first(&t->eng.err, st)) return;
  /* receives are posted only to peers whose pair is mapped (req_start) */
  for (int k = 0; k < t->nactive; k++)
    mlxd_match_fail_posted(&t->peers[t->active[k]].ep.mq, shm_fail_posted, t);
  shm_rank_rec* me = rank_rec(t, t->base.rank);
  mlxd_fail_rec_fill(&me->fail, &t->eng.err);
  atomic_store_explicit(&me->state, RANK_FAILED, memory_order_release);
  atomic_fetch_add(&t->hdr->nfailed, 1);
  ring_paired(t);
}

void mlxd_shm_fail(shm_transport* t, const mlxd_status* st) { shm_fail(t, st); }

/* ---- requests ---- */

static void list_push(shm_req** head, shm_req** tail, shm_req* r) {
  r->next = NULL;
  if (*tail)
    (*tail)->next = r;
  else
    *head = r;
  *tail = r;
}

static void list_remove(shm_req** head, shm_req** tail, shm_req* r) {
  shm_req* prev = NULL;
  for (shm_req* c = *head; c; prev = c, c = c->next) {
    if (c != r) continue;
    if (prev)
      prev->next = c->next;
    else
      *head = c->next;
    if (*tail == c) *tail = prev;
    c->next = NULL;
    return;
  }
}

/* ---- progress ---- */

/* Slot idx's data: in its header for a chunk of <= SHM_INLINE_BYTES
 * (sender and receiver decide alike, by the chunk's length), else its slot. */
static char* slot_data(shm_slot_hdr* hdrs, char* slots, uint64_t idx, size_t chunk) {
  if (chunk <= SHM_INLINE_BYTES) return (char*)hdrs[idx % SHM_NSLOTS].u.data;
  return slots + (size_t)(idx % SHM_NSLOTS) * SHM_SLOT_STRIDE;
}

/* How far lane_in goes: a wait's pass; the pass of an idle wait (it
 * buffers what has no receive yet); the pass of a receive being posted. */
typedef enum { IN_PASS, IN_IDLE, IN_POST } shm_in_mode;

/* Drain the lane from peer pi; a message without a receive stays in it
 * unless IN_IDLE (see "Matching" above).
 * IN_POST stops at a message of more than one slot or a single-copy read:
 * posting a receive takes a small message at once (post and first poll in
 * one), but copying a large one there would hold back this rank's own
 * sends, which the caller posts next, until the copy is done, and two
 * ranks that exchange (all_gather, all_to_all, sendrecv) would copy in
 * turn, not at the same time; the wait takes it.
 * Returns events (slots consumed) or -1. */
static int lane_in(shm_transport* t, int pi, shm_in_mode mode) {
  bool buffer = mode == IN_IDLE;
  shm_peer* p = &t->peers[pi];
  mlxd_eng_cur* cur = &p->ep.cur;
  uint64_t head = atomic_load_explicit(&p->in->head, memory_order_acquire);
  int ev = 0;
  /* The sender waits on this lane only when it found it full (its next
   * chunk has no slot) or for a single-copy ack: only then does it need its
   * bell rung (a seq_cst fence each time). A sender that fills the lane after
   * this pass rang our bell with its chunks, and our next pass sees it full. */
  bool wake = head - p->in_tail >= SHM_NSLOTS;
  while (p->in_tail != head) {
    shm_slot_hdr* h = &p->in_hdrs[p->in_tail % SHM_NSLOTS];
    if (mode == IN_POST && (h->kind == SLOT_RTS || h->msg_len > SHM_SLOT_BYTES)) break;
    if (!cur->active) {
      bool now = buffer;
      mlxd_sig sent;
      mlxd_sig_decode(h->sig, &sent);
      int sm = mlxd_eng_arrive(&t->eng, pi, &p->ep, h->tag, (size_t)h->msg_len, &sent, now);
      if (sm < 0) return -1;
      if (sm > 0) break;
    }
    if (h->kind == SLOT_RTS) {
      char* dst = mlxd_eng_dest(cur);
      int err = 0;
      if (dst && cur->len && mlxd_shm_cma_read(p->pid, dst, h->u.addr, cur->len, &err) != 0) {
        mlxd_status s;
        mlxd_fail_at(&s, MLXD_ESYS, MLXD_LAYER_SHM,
                     "reading a %zu-byte message from rank %d failed", cur->len, shm_name(t, pi));
        mlxd_status_set_peer(&s, shm_name(t, pi), p->addr);
        mlxd_status_set_sys(&s, "process_vm_readv", err);
        shm_fail(t, &s);
        return -1;
      }
      cur->off = cur->len;
      wake = true;
      atomic_store_explicit(&p->in->acked,
                            atomic_load_explicit(&p->in->acked, memory_order_relaxed) + 1,
                            memory_order_release);
    } else {
      size_t c = (size_t)h->chunk_len; /* the peer's word: checked before it is used */
      if (c > SHM_SLOT_BYTES || c > cur->len - cur->off) {
        mlxd_status s;
        mlxd_fail_at(&s, MLXD_EREMOTE, MLXD_LAYER_SHM,
                     "rank %d wrote a malformed chunk: %zu bytes at offset %zu of a %zu-byte "
                     "message (a slot holds %zu): its shared memory is corrupt",
                     shm_name(t, pi), c, cur->off, cur->len, (size_t)SHM_SLOT_BYTES);
        mlxd_status_set_peer(&s, shm_name(t, pi), p->addr);
        shm_fail(t, &s);
        return -1;
      }
      char* dst = mlxd_eng_dest(cur);
      if (dst && c) memcpy(dst + cur->off, slot_data(p->in_hdrs, p->in_slots, p->in_tail, c), c);
      cur->off += c;
      if (cur->ux) cur->ux->got = cur->off;
    }
    if (cur->off >= cur->len) mlxd_eng_finish(cur);
    p->in_tail++;
    atomic_store_explicit(&p->in->tail, p->in_tail, memory_order_release);
    ev++;
    if (p->in_tail == head) {
      head = atomic_load_explicit(&p->in->head, memory_order_acquire);
      if (head - p->in_tail >= SHM_NSLOTS) wake = true;
    }
  }
  if (ev && wake) ring_bell(t, pi);
  return ev;
}

/* Push queued sends to peer pi as far as its lane has room; collect acks. */
static int lane_out(shm_transport* t, int pi) {
  shm_peer* p = &t->peers[pi];
  int ev = 0;
  if (p->ack_head) {
    uint64_t acked = atomic_load_explicit(&p->out->acked, memory_order_acquire);
    while (p->ack_head && p->ack_head->ticket <= acked) {
      shm_req* r = p->ack_head;
      p->ack_head = r->next;
      if (!p->ack_head) p->ack_tail = NULL;
      r->next = NULL;
      r->q.where = MLXD_ENG_NONE;
      r->q.m.complete = true;
      ev++;
    }
  }
  int pushed = 0;
  while (p->sq_head) {
    if (p->out_head - p->out_tail_seen >= SHM_NSLOTS) {
      p->out_tail_seen = atomic_load_explicit(&p->out->tail, memory_order_acquire);
      if (p->out_head - p->out_tail_seen >= SHM_NSLOTS) break;
    }
    shm_req* r = p->sq_head;
    shm_slot_hdr* h = &p->out_hdrs[p->out_head % SHM_NSLOTS];
    h->tag = r->q.m.tag;
    h->msg_len = r->q.m.n;
    if (r->off == 0) mlxd_sig_encode(h->sig, &r->q.m.sig); /* the message's first chunk */
    bool finished;
    if (r->cma) {
      h->kind = SLOT_RTS;
      h->u.addr = (uint64_t)(uintptr_t)r->q.buf;
      h->chunk_len = 0;
      finished = true;
    } else {
      size_t c = r->q.m.n - r->off < SHM_SLOT_BYTES ? r->q.m.n - r->off : SHM_SLOT_BYTES;
      h->kind = SLOT_EAGER;
      h->chunk_len = c;
      if (c) memcpy(slot_data(p->out_hdrs, p->out_slots, p->out_head, c), r->q.buf + r->off, c);
      r->off += c;
      finished = r->off == r->q.m.n;
    }
    p->out_head++;
    atomic_store_explicit(&p->out->head, p->out_head, memory_order_release);
    pushed++;
    if (finished) {
      p->sq_head = r->next;
      if (!p->sq_head) p->sq_tail = NULL;
      r->next = NULL;
      if (r->cma) {
        r->ticket = ++p->rts_sent;
        r->q.where = W_ACKQ;
        list_push(&p->ack_head, &p->ack_tail, r);
      } else {
        r->q.where = MLXD_ENG_NONE;
        r->q.m.complete = true;
      }
    }
  }
  if (pushed) ring_bell(t, pi);
  return ev + pushed;
}

#define SHM_OF(e) ((shm_transport*)((char*)(e)-offsetof(shm_transport, eng)))

/* One pass over every mapped pair (the engine's progress op, engine.h:
 * `buffer` is its idle). */
static int progress_all(mlxd_engine* e, bool buffer) {
  shm_transport* t = SHM_OF(e);
  int ev = 0;
  t->eng.deferred = false;
  if (mlxd_shm_pair_hellos(t) < 0) return 0;
  for (int k = 0; k < t->nactive && !t->eng.err.code; k++) {
    int i = t->active[k];
    int a = lane_in(t, i, buffer ? IN_IDLE : IN_PASS);
    if (a < 0) break;
    int b = lane_out(t, i);
    ev += a + b;
  }
  /* Other threads of this rank waiting on this transport may wait for these
   * (a thread sleeps on the doorbell only inside a wait, counted in waiting). */
  if (ev && t->eng.waiting > 1) ring_bell(t, t->base.rank);
  return ev;
}

/* Sum of the shared counters peers move for this rank (changes = activity). */
static uint64_t activity(shm_transport* t) {
  uint64_t s = atomic_load(&rank_rec(t, t->base.rank)->hello); /* a new pair */
  for (int k = 0; k < t->nactive; k++) {
    int i = t->active[k];
    shm_peer* p = &t->peers[i];
    s += atomic_load(&p->in->head) + atomic_load(&p->out->tail) + atomic_load(&p->out->acked);
    s += (uint64_t)atomic_load(&rank_rec(t, i)->state) << 40;
  }
  return s;
}

/* ---- liveness ---- */

/* Check the peers the given pending requests wait for. Returns true if the
 * transport failed. Called with mu held. */
static bool check_peers(shm_transport* t, shm_req** reqs, int n) {
  for (int i = 0; i < n && !t->eng.err.code; i++) {
    shm_req* r = reqs[i];
    if (!r || r->q.m.complete) continue;
    int pi = r->q.m.peer;
    shm_rank_rec* rec = rank_rec(t, pi);
    int state = atomic_load_explicit(&rec->state, memory_order_acquire);
    if (state == RANK_FAILED) {
      mlxd_status s;
      mlxd_shm_fail_read(t, pi, &s);
      shm_fail(t, &s);
      continue;
    }
    bool dead = mlxd_shm_pid_dead(t->peers[pi].pid);
    if (!dead && state != RANK_CLOSED) continue;
    /* A peer that closed or exited may have written (or acked) what r waits
     * for after this rank's last progress pass: drain once more before
     * calling it lost, so only a request it really left unfinished fails. */
    progress_all(&t->eng, true);
    if (r->q.m.complete || t->eng.err.code) continue;
    if (dead) {
      mlxd_eng_fail_lost(&t->eng, pi, ": its process exited");
    } else {
      char why[96];
      snprintf(why, sizeof why, ": it closed its transport while rank %d still waits for it",
               shm_name(t, t->base.rank));
      mlxd_eng_fail_lost(&t->eng, pi, why);
    }
  }
  return t->eng.err.code != 0;
}

/* ---- transport ops ---- */

/* Common start of isend/irecv: a request for (peer, tag, buf, n) with mu
 * held, or NULL with mu released, st and *rc set. The front-end guarantees
 * the arguments (transport.h). */
static shm_req* shm_req_start(shm_transport* t, int kind, int peer, uint64_t tag,
                              const mlxd_sig* sig, const void* buf, size_t n, mlxd_req** req,
                              mlxd_status* st, int* rc) {
  assert(req && peer >= 0 && peer < t->base.size && peer != t->base.rank && (buf || n == 0));
  *req = NULL;
  shm_lock_acquire(&t->mu);
  mlxd_shm_peer_ident(t, peer);
  shm_req* r = t->eng.err.code ? NULL : (shm_req*)mlxd_eng_req_alloc(&t->eng, sizeof(shm_req));
  if (!r) {
    *rc = mlxd_eng_req_refused(&t->eng, kind, peer, st);
    shm_lock_release(&t->mu);
    return NULL;
  }
  /* First contact; mu is dropped while it waits for the peer to finish the
   * pair (its failure is the transport's if the transport failed meanwhile,
   * and r is not queued yet, so nothing else sees it). */
  if (!t->peers[peer].mapped && mlxd_shm_pair_attach(t, peer, true, st) != 0) {
    /* first contact failed: the transport fails with it (published) */
    shm_fail(t, st);
    mlxd_eng_req_release(&t->eng, &r->q);
    *rc = mlxd_eng_fail_status(&t->eng, st);
    ring_bell(t, t->base.rank);
    shm_lock_release(&t->mu);
    return NULL;
  }
  mlxd_eng_req_init(&r->q, kind, peer, t->peers[peer].addr, tag, sig, buf, n);
  return r;
}

static int shm_isend(mlxd_transport* tt, int peer, uint64_t tag, const mlxd_sig* sig,
                     const void* buf, size_t n, mlxd_req** req, mlxd_status* st) {
  shm_transport* t = (shm_transport*)tt;
  int rc = 0;
  shm_req* r = shm_req_start(t, REQ_SEND, peer, tag, sig, buf, n, req, st, &rc);
  if (!r) return rc;
  shm_peer* p = &t->peers[peer];
  /* By this rank's threshold and the peer's probe: the peer probes only if
   * it has a threshold itself, and reads an RTS slot whatever its own, so
   * ranks with different thresholds stay correct (shm_setup.c, cma_min). */
  size_t min = mlxd_tag_kind(tag) == MLXD_TAG_P2P ? t->cma_p2p_min : t->cma_min;
  r->cma = min && n >= min && atomic_load_explicit(p->peer_reads, memory_order_relaxed) == CMA_OK;
  r->q.where = W_SENDQ;
  list_push(&p->sq_head, &p->sq_tail, r);
  lane_out(t, peer);
  shm_lock_release(&t->mu);
  *req = (mlxd_req*)r;
  return 0;
}

static int shm_irecv(mlxd_transport* tt, int peer, uint64_t tag, const mlxd_sig* sig, void* buf,
                     size_t n, mlxd_req** req, mlxd_status* st) {
  shm_transport* t = (shm_transport*)tt;
  int rc = 0;
  shm_req* r = shm_req_start(t, REQ_RECV, peer, tag, sig, buf, n, req, st, &rc);
  if (!r) return rc;
  mlxd_eng_unexp* u = NULL;
  int k = mlxd_eng_recv(&t->eng, &t->peers[peer].ep, &r->q, &u);
  if (k < 0) {
    rc = mlxd_eng_fail_status(&t->eng, st);
    shm_lock_release(&t->mu);
    return rc;
  }
  if (k == 0)
    lane_in(t, peer, IN_POST);
  else
    mlxd_eng_unexp_free(&t->eng, u); /* shm pulls nothing: k == 1 */
  shm_lock_release(&t->mu);
  *req = (mlxd_req*)r;
  return 0;
}

/* Sleep on this rank's doorbell unless something moved since `snap`.
 * Called without mu. */
static void doorbell_sleep(shm_transport* t, uint64_t snap, double max_s) {
  shm_rank_rec* me = rank_rec(t, t->base.rank);
  uint32_t v = atomic_load(&me->doorbell);
  atomic_fetch_add(&me->sleepers, 1); /* seq_cst, then seq_cst loads in activity() */
  if (activity(t) == snap) {
    if (max_s > t->eng.check_s) max_s = t->eng.check_s;
    if (max_s < 1e-4) max_s = 1e-4;
    struct timespec ts = {(time_t)max_s, (long)((max_s - (double)(time_t)max_s) * 1e9)};
    futex(&me->doorbell, FUTEX_WAIT, v, &ts);
  }
  atomic_fetch_sub(&me->sleepers, 1);
}

/* The end of a wait: a peer that published a failure (it gave up on an
 * operation, maybe this one) fails this wait too (transport.h). One load
 * of the failure counter; the ranks' states only when it moved (a rank
 * bumps it after it stores RANK_FAILED: acquire here sees the state). mu
 * held. */
static void check_failed(shm_transport* t) {
  uint32_t nf = atomic_load_explicit(&t->hdr->nfailed, memory_order_acquire);
  if (nf == t->nfailed_seen) return;
  t->nfailed_seen = nf;
  for (int r = 0; r < t->base.size && !t->eng.err.code; r++) {
    if (r == t->base.rank) continue;
    if (atomic_load_explicit(&rank_rec(t, r)->state, memory_order_acquire) == RANK_FAILED) {
      mlxd_status s;
      mlxd_shm_fail_read(t, r, &s);
      shm_fail(t, &s);
    }
  }
}

/* ---- the engine's ops (engine.h) ---- */

static bool shm_op_check(mlxd_engine* e, mlxd_req** reqs, int n, mlxd_wait_state* ws, double now) {
  shm_transport* t = SHM_OF(e);
  if (check_peers(t, (shm_req**)reqs, n)) return true;
  return mlxd_shm_live_check(t, (shm_req**)reqs, n, ws->start, ws->last_change, now, &ws->warned);
}

static int shm_op_sleep(mlxd_engine* e, double max_s) {
  shm_transport* t = SHM_OF(e);
  uint64_t snap = activity(t);
  shm_lock_release(&t->mu);
  doorbell_sleep(t, snap, max_s);
  shm_lock_acquire(&t->mu);
  return 0; /* the next pass moves what woke it */
}

static void shm_op_lock(mlxd_engine* e) { shm_lock_acquire(&SHM_OF(e)->mu); }
static void shm_op_unlock(mlxd_engine* e) { shm_lock_release(&SHM_OF(e)->mu); }
static void shm_op_fail(mlxd_engine* e, const mlxd_status* st) { shm_fail(SHM_OF(e), st); }
static void shm_op_settle(mlxd_engine* e, const mlxd_wait_state* ws) {
  (void)ws;
  check_failed(SHM_OF(e));
}
static void shm_op_wake(mlxd_engine* e) { ring_bell(SHM_OF(e), SHM_OF(e)->base.rank); }
static int shm_op_name(mlxd_engine* e, int pi) { return shm_name(SHM_OF(e), pi); }
static const char* shm_op_addr(mlxd_engine* e, int pi) { return SHM_OF(e)->peers[pi].addr; }
static mlxd_eng_peer* shm_op_peer(mlxd_engine* e, int pi) { return &SHM_OF(e)->peers[pi].ep; }

static void shm_op_unlink(mlxd_engine* e, mlxd_eng_req* q) {
  shm_req* r = (shm_req*)q;
  shm_peer* p = &SHM_OF(e)->peers[q->m.peer];
  if (q->where == W_SENDQ) list_remove(&p->sq_head, &p->sq_tail, r);
  if (q->where == W_ACKQ) list_remove(&p->ack_head, &p->ack_tail, r);
}

/* Nothing a pass must move for others (engine.h, quiet): no send queued
 * in a lane that had no room, no peer waiting for this rank to answer its
 * first contact. */
static bool shm_op_quiet(mlxd_engine* e) {
  shm_transport* t = SHM_OF(e);
  if (atomic_load_explicit(&rank_rec(t, t->base.rank)->hello, memory_order_relaxed) !=
      t->hello_seen)
    return false;
  for (int k = 0; k < t->nactive; k++)
    if (t->peers[t->active[k]].sq_head) return false;
  return true;
}

static const mlxd_eng_ops shm_eng_ops = {
    .progress = progress_all,
    .check = shm_op_check,
    .sleep = shm_op_sleep,
    .lock = shm_op_lock,
    .unlock = shm_op_unlock,
    .fail = shm_op_fail,
    .wake = shm_op_wake,
    .name = shm_op_name,
    .addr = shm_op_addr,
    .peer = shm_op_peer,
    .unlink = shm_op_unlink,
    .settle = shm_op_settle,
    .quiet = shm_op_quiet,
};

void mlxd_shm_engine_init(shm_transport* t) {
  t->eng.ops = &shm_eng_ops;
  t->eng.layer = MLXD_LAYER_SHM;
  t->eng.me = t->base.rank;
  t->eng.req_size = sizeof(shm_req);
  t->eng.ux_pooled = true;
  t->eng.check_from_event = true;
  t->eng.defer_s = SHM_DEFER_S;
}

static int shm_waitall(mlxd_transport* tt, mlxd_req** rr, int n, mlxd_status* st) {
  shm_transport* t = (shm_transport*)tt;
  shm_lock_acquire(&t->mu);
  int rc = mlxd_eng_waitall(&t->eng, rr, n, st);
  shm_lock_release(&t->mu);
  return rc;
}

static int shm_wait_slice(mlxd_transport* tt, mlxd_req** rr, int n, double max_s,
                          mlxd_wait_state* ws, mlxd_status* st) {
  shm_transport* t = (shm_transport*)tt;
  shm_lock_acquire(&t->mu);
  int rc = mlxd_eng_wait_slice(&t->eng, rr, n, max_s, ws, st);
  shm_lock_release(&t->mu);
  return rc;
}

static void free_req_list(shm_transport* t, shm_req* r) {
  while (r) {
    shm_req* nx = r->next;
    mlxd_eng_req_release(&t->eng, &r->q);
    r = nx;
  }
}

void mlxd_shm_destroy(mlxd_transport* tt) {
  shm_transport* t = (shm_transport*)tt;
  if (!t) return;
  mlxd_shm_live_stop(t); /* no heartbeat runs from here on */
  if (t->map) {
    shm_rank_rec* me = rank_rec(t, t->base.rank);
    int s = RANK_ATTACHED;
    atomic_compare_exchange_strong(&me->state, &s, RANK_CLOSED);
    ring_paired(t);
  }
  /* Requests and buffered messages exist only for peers whose pair is
   * mapped (shm_req_start maps it first; messages come through it): the rest
   * of the peer table is never read (at 1,024 ranks it is 62 pages). */
  int nactive = t->nactive;
  if (t->map) mlxd_shm_pair_release_all(t); /* after the state above (see there) */
  if (t->peers && t->active) {
    for (int k = 0; k < nactive; k++) {
      shm_peer* p = &t->peers[t->active[k]];
      free_req_list(t, p->sq_head);
      free_req_list(t, p->ack_head);
      mlxd_eng_drain_queues(&t->eng, &p->ep.mq);
    }
  }
  mlxd_eng_req_drain(&t->eng);
  if (t->map) munmap(t->map, t->map_len);
  mlxd_ztable_free(t->peers, (size_t)t->base.size, sizeof *t->peers);
  free(t->active);
  free(t->names);
  free(t);
}

static void shm_abort(mlxd_transport* tt, const mlxd_status* st) {
  shm_transport* t = (shm_transport*)tt;
  shm_lock_acquire(&t->mu);
  shm_fail(t, st); /* publishes it and rings every doorbell, this rank's included */
  ring_bell(t, t->base.rank);
  shm_lock_release(&t->mu);
}

const mlxd_transport_ops mlxd_shm_ops = {
    .name = "shm",
    .isend = shm_isend,
    .irecv = shm_irecv,
    .waitall = shm_waitall,
    .wait_slice = shm_wait_slice,
    .abort = shm_abort,
    .destroy = mlxd_shm_destroy,
};

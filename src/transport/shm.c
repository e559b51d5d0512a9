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
 * The rings of a pair live in a segment of their own, <name>~<lo>-<hi>~<pids>~<pid ns> (pair_name),
 * made on the pair's first isend/irecv (shm_setup.c mlxd_shm_pair_attach):
 * O_EXCL picks the one creator, the other checks owner, mode and size and
 * waits for its magic (t->mu dropped around each sleep); the creator sets
 * its bit in the peer's hello bitmap and rings it, so the peer maps the pair
 * at its next progress pass; the second to map it unlinks the name. Pairs that never talk map nothing.
 *
 * Rings. A ring is a single-producer single-consumer queue of SHM_NSLOTS
 * fixed slots of SHM_SLOT_BYTES, each with a 64-byte header (kind, tag,
 * message length, chunk length, address; in a message's first chunk the
 * sender's call signature). The pair's first page holds its header, both
 * rings' control words and both rings' slot headers; the data slots follow.
 * A chunk of at most SHM_INLINE_BYTES travels in its header, so a pair that
 * only exchanges small messages touches that one page (each page a rank
 * touches first costs a page fault: ~20-40 us on a VM with shadow page
 * tables, where the slots' pages were most of the CPU of a 256-rank job's
 * small ops; docs/scale.md). The producer owns `head`, the
 * consumer owns `tail` and `acked`, each on its own cache line; they are
 * C11 atomics published with release and read with acquire, and the slot
 * contents are plain memory ordered by them. A message is a sequence of
 * chunks in consecutive slots of its ring (so chunks of different messages
 * never interleave on one ring; a zero-byte message is one empty chunk).
 *
 * Large messages (>= cma_min) use a single copy when cross-memory attach
 * works (probed when a pair is first mapped, by a rank with a threshold: it
 * reads a value from its peer with process_vm_readv and says so in the
 * pair's header): the sender puts one "ready to send" slot holding its
 * buffer's address, the receiver reads the bytes straight from the sender's
 * memory into the receive buffer and bumps `acked`; the send completes when
 * its ticket is acked. Where CMA is refused (ptrace policy, seccomp) every
 * message takes the two-copy ring path, which pipelines because producer
 * and consumer work on different slots at the same time. A send that makes
 * the pair finds no probe yet and takes the rings. The threshold (spin.h
 * mlxd_shm_cma_bytes_for): MLXDIST_SHM_CMA_BYTES when set (0: off); unset,
 * 32 MiB on a crowded host (more of the group's ranks on it than CPUs this
 * process may run on), where a ring step waits for the sender and the
 * receiver to be on a CPU at once and a single copy needs only the
 * receiver, and off otherwise: on VMs with paravirtualised page tables
 * process_vm_readv is slower than memcpy and the rings win at every size
 * measured (docs/ring.md). The ring algorithms' 256 KiB chunks stay below
 * 32 MiB: the rule reaches whole-buffer messages (send/recv, the direct
 * all_gather of 2 ranks, and of more where every rank is crowded:
 * mlxd_transport.whole_min); docs/performance.md, "Single copy by default
 * on a crowded host", has the measurements.
 *
 * Matching. The receiver drains every mapped incoming ring whenever it makes
 * progress. The first chunk of a message is matched by (peer, tag) against
 * the posted receives of that peer, in posting order; a match gets its
 * bytes written straight into its buffer. A message (up to SHM_DEFER_MAX)
 * without a posted receive stays in its ring (its receive, posted a moment later, takes it
 * with one copy) until the waiter is idle for SHM_DEFER_S, would sleep, or
 * the ring is full; then it is buffered (mlxd_buffer_alloc, or read at once
 * through CMA and acked), so two ranks that both send before receiving never
 * deadlock; a later receive takes it over (a partly arrived one continues).
 * Signatures must agree (sig_clash: the message's with its receive's, or
 * with any receive or message of the same operation when the tags differ);
 * a disagreement fails the transport (published: the peers fail with it
 * too). A size mismatch of unsigned messages fails that receive only; the
 * bytes are drained and dropped.
 *
 * Progress and waiting. There is no background thread: isend/irecv try to
 * move data at once and waitall drives every ring. All local state is under
 * one mutex. A waiting thread polls for MLXDIST_SPIN_US after the last
 * event (with sched_yield when there are more ranks than CPUs, so spinning
 * ranks do not starve the rank they wait for), then sleeps on its rank's
 * doorbell (a futex in the segment, at most t->check_s at a time). Whoever
 * publishes something a rank waits for (a chunk; slots freed in a ring it
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

static void fail_posted(void* ctx, mlxd_match_link* l) {
  shm_transport* t = ctx;
  shm_req* r = MLXD_MATCH_ENTRY(l, shm_req, link);
  r->where = W_NONE;
  r->m.complete = true;
  r->m.code = t->err.code;
}

/* Fail the whole transport with *st (the first failure wins); publish it
 * to the peers. Called with mu held. */
static void shm_fail(shm_transport* t, const mlxd_status* st) {
  if (!mlxd_match_fail_first(&t->err, st)) return;
  /* receives are posted only to peers whose pair is mapped (req_start) */
  for (int k = 0; k < t->nactive; k++)
    mlxd_match_fail_posted(&t->peers[t->active[k]].mq, fail_posted, t);
  shm_rank_rec* me = rank_rec(t, t->base.rank);
  mlxd_shm_fail_publish(&me->fail, &t->err);
  atomic_store_explicit(&me->state, RANK_FAILED, memory_order_release);
  atomic_fetch_add(&t->hdr->nfailed, 1);
  ring_paired(t);
}

void mlxd_shm_fail(shm_transport* t, const mlxd_status* st) { shm_fail(t, st); }

/* Fail the transport: peer pi is gone (why: e.g. ": its process exited"). */
static void fail_lost(shm_transport* t, int pi, const char* why) {
  mlxd_status s;
  mlxd_match_lost(&s, MLXD_LAYER_SHM, shm_name(t, pi), t->peers[pi].addr, why, NULL, 0);
  shm_fail(t, &s);
}

/* Fail the transport: out of memory handling peer pi's message. */
static void fail_nomem(shm_transport* t, int pi, const char* what, size_t n) {
  mlxd_status s;
  mlxd_fail_at(&s, MLXD_ENOMEM, MLXD_LAYER_SHM, "out of memory %s (%zu bytes) from rank %d", what,
               n, shm_name(t, pi));
  mlxd_status_set_peer(&s, shm_name(t, pi), t->peers[pi].addr);
  shm_fail(t, &s);
}

/* ---- requests ---- */

static shm_req* req_alloc(shm_transport* t) {
  shm_req* r = t->free_reqs;
  if (r) {
    t->free_reqs = r->next;
    t->nfree--;
  } else {
    r = malloc(sizeof *r);
    if (!r) return NULL;
  }
  memset(r, 0, sizeof *r);
  return r;
}

static void req_release(shm_transport* t, shm_req* r) {
  if (t->nfree < 64) {
    r->next = t->free_reqs;
    t->free_reqs = r;
    t->nfree++;
  } else {
    free(r);
  }
}

/* A receive from peer matched a message of `sent` bytes: fails it alone. */
static void req_mismatch(shm_req* r, size_t sent) {
  r->m.complete = true;
  r->m.code = MLXD_EINVAL;
  r->m.mismatch = true;
  r->m.sent = sent;
}

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

/* Take an unfinished request out of whatever list refers to it. */
static void req_unlink(shm_transport* t, shm_req* r) {
  shm_peer* p = &t->peers[r->m.peer];
  switch (r->where) {
    case W_SENDQ: list_remove(&p->sq_head, &p->sq_tail, r); break;
    case W_ACKQ: list_remove(&p->ack_head, &p->ack_tail, r); break;
    case W_POSTED: mlxd_match_remove(&p->mq.posted, &r->link); break;
    case W_CUR:
      if (p->cur_req == r) p->cur_req = NULL; /* the rest of it is dropped */
      break;
    default: break;
  }
  r->where = W_NONE;
}

/* ---- progress ---- */

/* Slot idx's data: in its header for a chunk of <= SHM_INLINE_BYTES
 * (sender and receiver decide alike, by the chunk's length), else its slot. */
static char* slot_data(shm_slot_hdr* hdrs, char* slots, uint64_t idx, size_t chunk) {
  if (chunk <= SHM_INLINE_BYTES) return (char*)hdrs[idx % SHM_NSLOTS].u.data;
  return slots + (size_t)(idx % SHM_NSLOTS) * SHM_SLOT_STRIDE;
}

/* Whether this rank's call `mine` and a message of the same operation from
 * peer pi, signed `theirs`, disagree; if so the transport has failed with
 * both calls named (mu held). */
static bool sig_clash(shm_transport* t, int pi, const mlxd_sig* mine, const mlxd_sig* theirs) {
  /* Equal calls always agree (mlxd_sig_agree): every message of a matching
   * collective takes this test, not the call. */
  if (mine->op == theirs->op && mine->dtype == theirs->dtype && mine->size == theirs->size &&
      mine->count == theirs->count)
    return false;
  mlxd_status s;
  if (!mlxd_sig_check(&s, MLXD_LAYER_SHM, shm_name(t, t->base.rank), mine, shm_name(t, pi),
                      t->peers[pi].addr, theirs))
    return false;
  shm_fail(t, &s);
  ring_bell(t, t->base.rank); /* from irecv: other threads of this rank may sleep */
  return true;
}

/* First chunk of a message from peer pi: compare its signature with this
 * rank's call, then bind it to a posted receive or a new unexpected buffer
 * (without `buffer`: leave it in the ring, return 1). -1: the transport failed. */
static int start_message(shm_transport* t, int pi, const shm_slot_hdr* h, bool buffer) {
  shm_peer* p = &t->peers[pi];
  size_t len = (size_t)h->msg_len;
  uint64_t tag = h->tag;
  shm_req* r = MLXD_MATCH_ENTRY(mlxd_match_find(&p->mq.posted, tag), shm_req, link);
  if (!r && !buffer) {
    t->deferred = true;
    return 1;
  }
  mlxd_sig sent;
  mlxd_sig_decode(h->sig, &sent);
  if (sent.op != MLXD_SIG_NONE) {
    shm_req* same = r;
    if (!same) same = MLXD_MATCH_ENTRY(mlxd_match_find_op(&p->mq.posted, tag), shm_req, link);
    if (same && sig_clash(t, pi, &same->m.sig, &sent)) return -1;
  }
  p->cur_active = true;
  p->cur_len = len;
  p->cur_off = 0;
  p->cur_req = NULL;
  p->cur_ux = NULL;
  if (r) {
    mlxd_match_remove(&p->mq.posted, &r->link);
    r->where = W_NONE;
    if (r->m.n != len) {
      req_mismatch(r, len);
    } else {
      r->where = W_CUR;
      p->cur_req = r;
    }
    return 0;
  }
  shm_unexp* u = calloc(1, sizeof *u);
  char* buf = len ? mlxd_buffer_alloc(len) : NULL;
  if (!u || (len && !buf)) {
    free(u);
    mlxd_buffer_free(buf, len);
    fail_nomem(t, pi, "buffering a message that arrived before its receive", len);
    return -1;
  }
  u->len = len;
  u->buf = buf;
  u->sig = sent;
  mlxd_match_push(&p->mq.unexpected, &u->link, tag);
  p->cur_ux = u;
  return 0;
}

static void finish_message(shm_peer* p) {
  if (p->cur_req) {
    p->cur_req->m.complete = true;
    p->cur_req->where = W_NONE;
  }
  if (p->cur_ux) {
    p->cur_ux->complete = true;
    p->cur_ux->got = p->cur_len;
  }
  p->cur_active = false;
  p->cur_req = NULL;
  p->cur_ux = NULL;
}

static char* cur_dest(shm_peer* p) {
  if (p->cur_req) return p->cur_req->buf;
  if (p->cur_ux) return p->cur_ux->buf;
  return NULL;
}

/* Drain the ring from peer pi; a message without a receive stays unless
 * `buffer`, the ring is full, or it is larger than SHM_DEFER_MAX (its
 * sender streams it: draining it as it comes keeps both ranks copying).
 * Returns events (slots consumed) or -1. */
static int progress_in(shm_transport* t, int pi, bool buffer) {
  shm_peer* p = &t->peers[pi];
  uint64_t head = atomic_load_explicit(&p->in->head, memory_order_acquire);
  int ev = 0;
  /* The sender waits on this ring only when it found it full (its next
   * chunk has no slot) or for a rendezvous ack: only then does it need its
   * bell rung (a seq_cst fence each time). A sender that fills the ring after
   * this pass rang our bell with its chunks, and our next pass sees it full. */
  bool wake = head - p->in_tail >= SHM_NSLOTS;
  while (p->in_tail != head) {
    shm_slot_hdr* h = &p->in_hdrs[p->in_tail % SHM_NSLOTS];
    if (!p->cur_active) {
      bool now = buffer || head - p->in_tail >= SHM_NSLOTS || h->msg_len > SHM_DEFER_MAX;
      int sm = start_message(t, pi, h, now);
      if (sm < 0) return -1;
      if (sm > 0) break;
    }
    if (h->kind == SLOT_RTS) {
      char* dst = cur_dest(p);
      int err = 0;
      if (dst && p->cur_len && mlxd_shm_cma_read(p->pid, dst, h->u.addr, p->cur_len, &err) != 0) {
        mlxd_status s;
        mlxd_fail_at(&s, MLXD_ESYS, MLXD_LAYER_SHM,
                     "reading a %zu-byte message from rank %d failed", p->cur_len, shm_name(t, pi));
        mlxd_status_set_peer(&s, shm_name(t, pi), p->addr);
        mlxd_status_set_sys(&s, "process_vm_readv", err);
        shm_fail(t, &s);
        return -1;
      }
      p->cur_off = p->cur_len;
      wake = true;
      atomic_store_explicit(&p->in->acked,
                            atomic_load_explicit(&p->in->acked, memory_order_relaxed) + 1,
                            memory_order_release);
    } else {
      size_t c = (size_t)h->chunk_len; /* the peer's word: checked before it is used */
      if (c > SHM_SLOT_BYTES || c > p->cur_len - p->cur_off) {
        mlxd_status s;
        mlxd_fail_at(&s, MLXD_EREMOTE, MLXD_LAYER_SHM,
                     "rank %d wrote a malformed chunk: %zu bytes at offset %zu of a %zu-byte "
                     "message (a slot holds %zu): its shared memory is corrupt",
                     shm_name(t, pi), c, p->cur_off, p->cur_len, (size_t)SHM_SLOT_BYTES);
        mlxd_status_set_peer(&s, shm_name(t, pi), p->addr);
        shm_fail(t, &s);
        return -1;
      }
      char* dst = cur_dest(p);
      if (dst && c) memcpy(dst + p->cur_off, slot_data(p->in_hdrs, p->in_slots, p->in_tail, c), c);
      p->cur_off += c;
      if (p->cur_ux) p->cur_ux->got = p->cur_off;
    }
    if (p->cur_off >= p->cur_len) finish_message(p);
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

/* Push queued sends to peer pi as far as the ring has room; collect acks. */
static int progress_out(shm_transport* t, int pi) {
  shm_peer* p = &t->peers[pi];
  int ev = 0;
  if (p->ack_head) {
    uint64_t acked = atomic_load_explicit(&p->out->acked, memory_order_acquire);
    while (p->ack_head && p->ack_head->ticket <= acked) {
      shm_req* r = p->ack_head;
      p->ack_head = r->next;
      if (!p->ack_head) p->ack_tail = NULL;
      r->next = NULL;
      r->where = W_NONE;
      r->m.complete = true;
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
    h->tag = r->m.tag;
    h->msg_len = r->m.n;
    if (r->off == 0) mlxd_sig_encode(h->sig, &r->m.sig); /* the message's first chunk */
    bool finished;
    if (r->rndv) {
      h->kind = SLOT_RTS;
      h->u.addr = (uint64_t)(uintptr_t)r->buf;
      h->chunk_len = 0;
      finished = true;
    } else {
      size_t c = r->m.n - r->off < SHM_SLOT_BYTES ? r->m.n - r->off : SHM_SLOT_BYTES;
      h->kind = SLOT_EAGER;
      h->chunk_len = c;
      if (c) memcpy(slot_data(p->out_hdrs, p->out_slots, p->out_head, c), r->buf + r->off, c);
      r->off += c;
      finished = r->off == r->m.n;
    }
    p->out_head++;
    atomic_store_explicit(&p->out->head, p->out_head, memory_order_release);
    pushed++;
    if (finished) {
      p->sq_head = r->next;
      if (!p->sq_head) p->sq_tail = NULL;
      r->next = NULL;
      if (r->rndv) {
        r->ticket = ++p->rts_sent;
        r->where = W_ACKQ;
        list_push(&p->ack_head, &p->ack_tail, r);
      } else {
        r->where = W_NONE;
        r->m.complete = true;
      }
    }
  }
  if (pushed) ring_bell(t, pi);
  return ev + pushed;
}

static int progress_all(shm_transport* t, bool buffer) {
  int ev = 0;
  t->deferred = false;
  if (mlxd_shm_pair_hellos(t) < 0) return 0;
  for (int k = 0; k < t->nactive && !t->err.code; k++) {
    int i = t->active[k];
    int a = progress_in(t, i, buffer);
    if (a < 0) break;
    int b = progress_out(t, i);
    ev += a + b;
  }
  /* Other threads of this rank waiting on this transport may wait for these
   * (a thread sleeps on the doorbell only inside wait_run, counted in waiting). */
  if (ev && t->waiting > 1) ring_bell(t, t->base.rank);
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
  for (int i = 0; i < n && !t->err.code; i++) {
    shm_req* r = reqs[i];
    if (!r || r->m.complete) continue;
    int pi = r->m.peer;
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
    progress_all(t, true);
    if (r->m.complete || t->err.code) continue;
    if (dead) {
      fail_lost(t, pi, ": its process exited");
    } else {
      char why[96];
      snprintf(why, sizeof why, ": it closed its transport while rank %d still waits for it",
               shm_name(t, t->base.rank));
      fail_lost(t, pi, why);
    }
  }
  return t->err.code != 0;
}

/* ---- transport ops ---- */

/* The transport's failure into st; returns its code. */
static int fail_status(shm_transport* t, mlxd_status* st) {
  if (st) *st = t->err;
  return t->err.code;
}

/* Common start of isend/irecv: a request for (peer, tag, buf, n) with mu
 * held, or NULL with mu released, st and *rc set. The front-end guarantees
 * the arguments (transport.h). */
static shm_req* req_start(shm_transport* t, int kind, int peer, uint64_t tag, const mlxd_sig* sig,
                          const void* buf, size_t n, mlxd_req** req, mlxd_status* st, int* rc) {
  assert(req && peer >= 0 && peer < t->base.size && peer != t->base.rank && (buf || n == 0));
  *req = NULL;
  shm_lock_acquire(&t->mu);
  mlxd_shm_peer_ident(t, peer);
  shm_req* r = t->err.code ? NULL : req_alloc(t);
  if (!r) {
    if (t->err.code) {
      *rc = fail_status(t, st);
    } else {
      *rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_SHM, "out of memory for a %s request",
                         kind == REQ_SEND ? "send" : "receive");
      mlxd_status_set_peer(st, shm_name(t, peer), t->peers[peer].addr);
    }
    shm_lock_release(&t->mu);
    return NULL;
  }
  /* First contact; mu is dropped while it waits for the peer to finish the
   * pair (its failure is the transport's if the transport failed meanwhile,
   * and r is not queued yet, so nothing else sees it). */
  if (!t->peers[peer].mapped && mlxd_shm_pair_attach(t, peer, true, st) != 0) {
    /* first contact failed: the transport fails with it (published) */
    shm_fail(t, st);
    req_release(t, r);
    *rc = fail_status(t, st);
    ring_bell(t, t->base.rank);
    shm_lock_release(&t->mu);
    return NULL;
  }
  r->kind = kind;
  r->m.peer = peer;
  r->m.addr = t->peers[peer].addr;
  r->m.tag = tag;
  r->m.sig = mlxd_sig_or_none(sig);
  r->buf = (char*)(uintptr_t)buf; /* a send's buffer is only read */
  r->m.n = n;
  return r;
}

static int shm_isend(mlxd_transport* tt, int peer, uint64_t tag, const mlxd_sig* sig,
                     const void* buf, size_t n, mlxd_req** req, mlxd_status* st) {
  shm_transport* t = (shm_transport*)tt;
  int rc = 0;
  shm_req* r = req_start(t, REQ_SEND, peer, tag, sig, buf, n, req, st, &rc);
  if (!r) return rc;
  shm_peer* p = &t->peers[peer];
  r->rndv = t->cma_min && n >= t->cma_min &&
            atomic_load_explicit(p->peer_reads, memory_order_relaxed) == CMA_OK;
  r->where = W_SENDQ;
  list_push(&p->sq_head, &p->sq_tail, r);
  progress_out(t, peer);
  shm_lock_release(&t->mu);
  *req = (mlxd_req*)r;
  return 0;
}

static int shm_irecv(mlxd_transport* tt, int peer, uint64_t tag, const mlxd_sig* sig, void* buf,
                     size_t n, mlxd_req** req, mlxd_status* st) {
  shm_transport* t = (shm_transport*)tt;
  int rc = 0;
  shm_req* r = req_start(t, REQ_RECV, peer, tag, sig, buf, n, req, st, &rc);
  if (!r) return rc;
  shm_peer* p = &t->peers[peer];
  /* Compare with a message of the same operation that arrived first. */
  shm_unexp* u = MLXD_MATCH_ENTRY(mlxd_match_find(&p->mq.unexpected, tag), shm_unexp, link);
  shm_unexp* same = u;
  if (!same && r->m.sig.op != MLXD_SIG_NONE)
    same = MLXD_MATCH_ENTRY(mlxd_match_find_op(&p->mq.unexpected, tag), shm_unexp, link);
  if (same && sig_clash(t, peer, &r->m.sig, &same->sig)) {
    req_release(t, r);
    rc = fail_status(t, st);
    shm_lock_release(&t->mu);
    return rc;
  }
  /* Take over a message that arrived first. */
  if (u) {
    mlxd_match_remove(&p->mq.unexpected, &u->link);
    bool current = p->cur_ux == u;
    if (u->len != n) {
      req_mismatch(r, u->len);
      if (current) p->cur_ux = NULL; /* drop the rest */
    } else {
      if (u->got) memcpy(r->buf, u->buf, u->got);
      if (u->complete) {
        r->m.complete = true;
      } else {
        p->cur_ux = NULL;
        p->cur_req = r;
        r->where = W_CUR;
      }
    }
    mlxd_buffer_free(u->buf, u->len);
    free(u);
  } else {
    r->where = W_POSTED;
    mlxd_match_push(&p->mq.posted, &r->link, tag);
    progress_in(t, peer, false);
  }
  shm_lock_release(&t->mu);
  *req = (mlxd_req*)r;
  return 0;
}

/* Sleep on this rank's doorbell unless something moved since `snap`.
 * Called without mu. */
static void block_wait(shm_transport* t, uint64_t snap, double max_s) {
  shm_rank_rec* me = rank_rec(t, t->base.rank);
  uint32_t v = atomic_load(&me->doorbell);
  atomic_fetch_add(&me->sleepers, 1); /* seq_cst, then seq_cst loads in activity() */
  if (activity(t) == snap) {
    if (max_s > t->check_s) max_s = t->check_s;
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
  for (int r = 0; r < t->base.size && !t->err.code; r++) {
    if (r == t->base.rank) continue;
    if (atomic_load_explicit(&rank_rec(t, r)->state, memory_order_acquire) == RANK_FAILED) {
      mlxd_status s;
      mlxd_shm_fail_read(t, r, &s);
      shm_fail(t, &s);
    }
  }
}

/* Drive every ring until no request of reqs is pending (returns true;
 * also when the transport failed) or until `until` (returns false, after
 * at least one pass). ws keeps the wait's clocks across calls (start,
 * last_change: the last progress, next_check: the last liveness check).
 * mu held (dropped while spinning or asleep). */
static bool any_pending(shm_req** reqs, int n) {
  for (int i = 0; i < n; i++)
    if (reqs[i] && !reqs[i]->m.complete) return true;
  return false;
}

static bool wait_loop(shm_transport* t, shm_req** reqs, int n, double until, mlxd_wait_state* ws) {
  if (!ws->started) {
    /* The first pass reads no clock: a small message that is already there
     * (the common case of a small collective) costs one pass. */
    int ev = t->err.code ? 0 : progress_all(t, false);
    if (!any_pending(reqs, n) || t->err.code) return true;
    double now = mlxd_now();
    *ws = (mlxd_wait_state){
        .started = true, .start = now, .last_change = now, .next_check = now, .last_event = now};
    if (ev && now >= until) return false;
  }
  for (;;) {
    int ev = t->err.code ? 0 : progress_all(t, false);
    /* idle for SHM_DEFER_S (or about to sleep): buffer unmatched messages */
    if (!ev && t->deferred && !t->err.code && mlxd_now() - ws->last_event >= SHM_DEFER_S)
      ev = progress_all(t, true);
    if (!any_pending(reqs, n) || t->err.code) return true;
    double now = mlxd_now();
    if (ev) {
      ws->last_change = ws->next_check = ws->last_event = now;
      if (now >= until) return false;
      continue;
    }
    if (now - ws->next_check >= t->check_s) {
      ws->next_check = now;
      if (check_peers(t, reqs, n)) return true;
      if (mlxd_shm_live_check(t, reqs, n, ws->start, ws->last_change, now, &ws->warned))
        return true;
    }
    if (now >= until) return false;
    if (now - ws->last_change < t->spin_s) {
      shm_lock_release(&t->mu);
      if (t->oversubscribed)
        sched_yield();
      else
        shm_cpu_relax();
      shm_lock_acquire(&t->mu);
      continue;
    }
    if (t->deferred && progress_all(t, true) > 0) continue;
    uint64_t snap = activity(t);
    double to_check = t->check_s - (now - ws->next_check);
    if (until - now < to_check) to_check = until - now;
    shm_lock_release(&t->mu);
    block_wait(t, snap, to_check);
    shm_lock_acquire(&t->mu);
  }
}

/* wait_loop, counted in t->waiting (progress_all wakes the other waiters
 * of this rank only when there are any). */
static bool wait_run(shm_transport* t, shm_req** reqs, int n, double until, mlxd_wait_state* ws) {
  t->waiting++;
  bool done = wait_loop(t, reqs, n, until, ws);
  t->waiting--;
  return done;
}

static int shm_waitall(mlxd_transport* tt, mlxd_req** rr, int n, mlxd_status* st) {
  shm_transport* t = (shm_transport*)tt;
  shm_req** reqs = (shm_req**)rr;
  assert(n >= 0 && (n == 0 || reqs));
  shm_lock_acquire(&t->mu);
  mlxd_wait_state ws = {0};
  wait_run(t, reqs, n, INFINITY, &ws);
  if (!t->err.code) check_failed(t);
  int rc = mlxd_match_result(st, &t->err, MLXD_LAYER_SHM, rr, n);
  if (rc == 0 && t->err.code) rc = fail_status(t, st); /* failed meanwhile: not a success */
  for (int i = 0; i < n; i++) {
    shm_req* r = reqs[i];
    if (!r) continue;
    if (!r->m.complete) req_unlink(t, r);
    req_release(t, r);
    reqs[i] = NULL;
  }
  shm_lock_release(&t->mu);
  return rc;
}

static int shm_wait_slice(mlxd_transport* tt, mlxd_req** rr, int n, double max_s,
                          mlxd_wait_state* ws, mlxd_status* st) {
  shm_transport* t = (shm_transport*)tt;
  assert(n >= 0 && (n == 0 || rr) && max_s >= 0);
  shm_lock_acquire(&t->mu);
  ws->done = wait_run(t, (shm_req**)rr, n, mlxd_now() + max_s, ws);
  int rc = 0;
  if (t->err.code) {
    ws->done = true;
    rc = fail_status(t, st);
  }
  shm_lock_release(&t->mu);
  return rc;
}

static void free_req_list(shm_transport* t, shm_req* r) {
  while (r) {
    shm_req* nx = r->next;
    req_release(t, r);
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
   * mapped (req_start maps it first; messages come through it): the rest
   * of the peer table is never read (at 1,024 ranks it is 62 pages). */
  int nactive = t->nactive;
  if (t->map) mlxd_shm_pair_release_all(t); /* after the state above (see there) */
  if (t->peers && t->active) {
    for (int k = 0; k < nactive; k++) {
      shm_peer* p = &t->peers[t->active[k]];
      free_req_list(t, p->sq_head);
      free_req_list(t, p->ack_head);
      mlxd_match_link* l;
      while ((l = mlxd_match_pop(&p->mq.posted)))
        req_release(t, MLXD_MATCH_ENTRY(l, shm_req, link));
      while ((l = mlxd_match_pop(&p->mq.unexpected))) {
        shm_unexp* u = MLXD_MATCH_ENTRY(l, shm_unexp, link);
        mlxd_buffer_free(u->buf, u->len);
        free(u);
      }
    }
  }
  while (t->free_reqs) {
    shm_req* nx = t->free_reqs->next;
    free(t->free_reqs);
    t->free_reqs = nx;
  }
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

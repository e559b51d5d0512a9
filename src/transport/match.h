/* Private: the plumbing every point-to-point transport needs around its
 * wire (tcp.c, shm.c and verbs.c through the message engine, engine.h,
 * which owns their queues; tcp.c also keeps its arriving messages in a
 * queue of its own; router.c through its parts):
 *
 *  - tag matching: per peer, a queue of posted receives and a queue of
 *    messages that arrived before their receive, both in arrival/posting
 *    order and searched by tag (the first match wins, so equal tags match
 *    in order). The queues are intrusive: a transport embeds an
 *    mlxd_match_link in its own request / incoming-message struct and gets
 *    the struct back with MLXD_MATCH_ENTRY, so matching costs no allocation
 *    and no lock of its own (the caller holds the transport's lock);
 *  - the failures every transport words the same way (size mismatch, lost
 *    peer, timeout), as structured statuses (util/status.h): a detail without
 *    any "[tag]" prefix, the layer, the peer and its address, the syscall
 *    and errno;
 *  - the first failure of a transport, which fails every pending and later
 *    request with the same status.
 *
 * Nothing here blocks or takes a lock; nothing here is thread-safe by
 * itself: the transport's lock protects the queues and the failure. */
#ifndef MLXD_MATCH_H
#define MLXD_MATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"
#include "util/status.h"

struct mlxd_req; /* a transport's request (transport.h) */

typedef struct mlxd_match_link {
  struct mlxd_match_link *prev, *next;
  uint64_t tag;
} mlxd_match_link;

typedef struct mlxd_match_queue {
  mlxd_match_link *head, *tail;
} mlxd_match_queue;

/* One peer's matching state. */
typedef struct mlxd_match_peer {
  mlxd_match_queue posted;     /* receives posted, no message seen yet */
  mlxd_match_queue unexpected; /* messages (whole or partial) with no receive yet */
} mlxd_match_peer;

/* The struct of `type` whose `member` is the link l (NULL for NULL; l is
 * evaluated once). */
#define MLXD_MATCH_ENTRY(l, type, member) ((type*)mlxd_match_entry_((l), offsetof(type, member)))
static inline void* mlxd_match_entry_(mlxd_match_link* l, size_t off) {
  return l ? (void*)((char*)l - off) : NULL;
}

/* Append l with tag at the tail of q. */
static inline void mlxd_match_push(mlxd_match_queue* q, mlxd_match_link* l, uint64_t tag) {
  l->tag = tag;
  l->next = NULL;
  l->prev = q->tail;
  if (q->tail)
    q->tail->next = l;
  else
    q->head = l;
  q->tail = l;
}

/* Take l (which is in q) out of q. */
static inline void mlxd_match_remove(mlxd_match_queue* q, mlxd_match_link* l) {
  if (l->prev)
    l->prev->next = l->next;
  else
    q->head = l->next;
  if (l->next)
    l->next->prev = l->prev;
  else
    q->tail = l->prev;
  l->prev = l->next = NULL;
}

/* The oldest entry of q with this tag, or NULL. */
static inline mlxd_match_link* mlxd_match_find(const mlxd_match_queue* q, uint64_t tag) {
  mlxd_match_link* l = q->head;
  while (l && l->tag != tag) l = l->next;
  return l;
}

/* Find the oldest entry with this tag and take it out of q; NULL if none. */
static inline mlxd_match_link* mlxd_match_take(mlxd_match_queue* q, uint64_t tag) {
  mlxd_match_link* l = mlxd_match_find(q, tag);
  if (l) mlxd_match_remove(q, l);
  return l;
}

/* The operation a tag belongs to: its kind and sequence number, without
 * the phase, the segment and the step (transport.h: mlxd_tag). Messages of
 * one call share it. */
static inline uint64_t mlxd_tag_op(uint64_t tag) {
  return mlxd_tag_with_segment(mlxd_tag_with_phase(tag, 0), 0) >> 16;
}

/* The oldest entry of q of the same operation as tag (mlxd_tag_op), or NULL.
 * Used only when the exact tag found nothing, to compare the signatures of
 * two calls that line up in sequence but not in their steps. */
static inline mlxd_match_link* mlxd_match_find_op(const mlxd_match_queue* q, uint64_t tag) {
  uint64_t op = mlxd_tag_op(tag);
  mlxd_match_link* l = q->head;
  while (l && mlxd_tag_op(l->tag) != op) l = l->next;
  return l;
}

/* Take the oldest entry out of q; NULL when q is empty. */
static inline mlxd_match_link* mlxd_match_pop(mlxd_match_queue* q) {
  mlxd_match_link* l = q->head;
  if (l) mlxd_match_remove(q, l);
  return l;
}

/* "collective #12 step 3": a tag in words (see mlxd_tag in transport.h). */
void mlxd_match_tag_str(uint64_t tag, char* out, size_t n);

/* ---- the failures every transport reports alike (all return code) ---- */

/* A matched pair disagrees on the size: fails that receive only.
 * "size mismatch: rank 1 sent a 8-byte message (collective #3 step 0) but
 * the receive posted for it expects 4 bytes". */
int mlxd_match_mismatch(mlxd_status* st, mlxd_layer layer, int peer, const char* addr, uint64_t tag,
                        size_t sent, size_t expected);

/* A peer is gone: "lost connection to rank 2" followed by why (e.g.
 * ": it closed the connection"; "" for none). syscall/err: the call that
 * found out (NULL/0 for none). Code MLXD_EREMOTE. */
int mlxd_match_lost(mlxd_status* st, mlxd_layer layer, int peer, const char* addr, const char* why,
                    const char* syscall, int err);

/* A wait made no progress for timeout_s: "timed out after 3 s waiting for
 * rank 1 in a receive of 64 bytes (collective #3 step 0, 0 bytes moved); is
 * that rank alive and running the same operations? MLXDIST_TIMEOUT sets the
 * limit". Code MLXD_ETIMEDOUT. */
int mlxd_match_timeout(mlxd_status* st, mlxd_layer layer, double timeout_s, int peer,
                       const char* addr, bool is_send, size_t n, uint64_t tag, size_t moved);

/* ---- signatures (transport.h: mlxd_sig) ---- */

/* The 16 bytes a signature travels as (big-endian, as util/bytes.h), and back. decode
 * accepts any bytes (an unknown op or dtype is printed as such, never
 * indexed with). */
void mlxd_sig_encode(unsigned char out[MLXD_SIG_BYTES], const mlxd_sig* s);
void mlxd_sig_decode(const unsigned char in[MLXD_SIG_BYTES], mlxd_sig* s);
/* A NULL pointer as the all-zero signature (nothing to compare). */
mlxd_sig mlxd_sig_or_none(const mlxd_sig* s);
/* Whether a message signed `sent` may meet a receive signed `posted`:
 * true when either is unset, else the same call (a send meets a recv with
 * the same dtype, byte count and group size). */
bool mlxd_sig_agree(const mlxd_sig* sent, const mlxd_sig* posted);
/* The call in words: "all_sum(float32 x 10)", "send(float32 x 10, 40 bytes)",
 * "split(16 bytes)". */
void mlxd_sig_str(const mlxd_sig* s, char* out, size_t n);
/* Two ranks made different calls for one operation: fails st (MLXD_EINVAL,
 * structured, peer set) with both sides, lower rank first: "mismatched
 * calls: rank 0 called all_sum(float32 x 10), rank 1 called
 * all_gather(int32 x 20)". mine: this rank's; theirs: the peer's. A
 * transport fails for good with it (the calls of the group no longer line
 * up) and relays it to its peers. */
int mlxd_sig_mismatch(mlxd_status* st, mlxd_layer layer, int rank, const mlxd_sig* mine, int peer,
                      const char* addr, const mlxd_sig* theirs);
/* Compare this rank's call `mine` with the signature `theirs` of a message
 * from peer for the same operation (either may be NULL: nothing to compare).
 * 0 when they agree (mlxd_sig_agree), else mlxd_sig_mismatch's code with st
 * filled: the caller fails its transport with st. */
int mlxd_sig_check(mlxd_status* st, mlxd_layer layer, int rank, const mlxd_sig* mine, int peer,
                   const char* addr, const mlxd_sig* theirs);

/* ---- the first failure of a transport ---- */

/* Keep *st as the transport's failure unless one is kept already. Returns
 * whether it was the first (the caller then fails every pending request,
 * e.g. with mlxd_match_fail_posted, and tells its peers). */
bool mlxd_match_fail_first(mlxd_status* first, const mlxd_status* st);

/* Take every posted receive of peer off its queue and hand it to
 * fail(ctx, link) (which marks the request failed; its status is the
 * transport's first failure). */
void mlxd_match_fail_posted(mlxd_match_peer* peer, void (*fail)(void* ctx, mlxd_match_link* l),
                            void* ctx);

/* What every transport's request records about itself and its outcome. A
 * transport's request struct starts with it (so an mlxd_req* points to it). */
typedef struct mlxd_match_req {
  int peer;
  int code; /* 0, MLXD_EINVAL for a mismatch, else the transport failed */
  bool complete;
  bool mismatch; /* recv: the sender sent `sent` bytes, not n */
  uint64_t tag;
  size_t n;
  size_t sent;
  const char* addr; /* the peer's address (owned by the transport) */
  mlxd_sig sig;     /* what the caller said it is doing (all zero: unchecked) */
} mlxd_match_req;

/* A receive matched a message of `sent` bytes, not its n: it fails alone. */
static inline void mlxd_match_req_mismatch(mlxd_match_req* m, size_t sent) {
  m->complete = true;
  m->code = MLXD_EINVAL;
  m->mismatch = true;
  m->sent = sent;
}

/* The outcome of waiting for reqs[0..n) (NULL entries skipped; each starts
 * with an mlxd_match_req): the first completed request's error (a size
 * mismatch, or the transport's failure `first`), else `first` if a request
 * is still pending after the transport failed, else 0. */
int mlxd_match_result(mlxd_status* st, const mlxd_status* first, mlxd_layer layer,
                      struct mlxd_req* const* reqs, int n);

#endif

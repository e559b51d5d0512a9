/* Private: a view of a transport, a transport over a subset of another
 * transport's ranks, renumbered 0..k-1, whose messages carry a phase and
 * a segment of their own in their tags (transport.h: mlxd_tag_with_phase,
 * mlxd_tag_with_segment). The flat algorithms of src/algo run unchanged on
 * a view; the two-level collectives (src/algo/hier.c) run them on "the
 * ranks of my host" and on "the ranks with my local index on every host",
 * one phase (and, segmented, one segment of the buffer) each, under the one
 * sequence number of the user's call, without any phase or segment
 * matching another one's messages.
 *
 * A view owns nothing: it lives on its caller's stack for one phase of one
 * call (views of one parent may be used from several threads at once, as
 * the parent may), it allocates nothing, and its requests are the
 * parent's. Waits, liveness, signatures and failures are the parent's: a
 * failure seen through a view fails the parent (and with it every other
 * view of it), and aborting a view aborts the parent. destroy does
 * nothing. */
#ifndef MLXD_VIEW_H
#define MLXD_VIEW_H

#include "transport/transport.h"

typedef struct mlxd_view {
  mlxd_transport base; /* rank: this rank's index in ranks; size: k */
  mlxd_transport* parent;
  const int* ranks; /* ranks[i]: the parent's rank of the view's rank i (k entries) */
  unsigned phase;   /* 1..MLXD_TAG_PHASES-1 */
  unsigned segment; /* 0..MLXD_TAG_SEGMENTS-1 */
} mlxd_view;

/* A view of parent over ranks[0..k) (distinct parent ranks, the parent's
 * own rank among them at index me) whose messages carry phase and segment
 * 0. ranks must stay valid as long as the view is used. */
void mlxd_view_init(mlxd_view* v, mlxd_transport* parent, const int* ranks, int k, int me,
                    unsigned phase);
/* The same view for the messages of segment (0..MLXD_TAG_SEGMENTS-1). */
void mlxd_view_set_segment(mlxd_view* v, unsigned segment);

/* ---- split children: persistent views with a tag space of their own ----
 *
 * A split child (backends/ring/ring.c) runs over a view of the transport
 * its family started with (the "root": the group made at init), not over
 * connections of its own. The root transport is shared, reference counted
 * (mlxd_tshare): the group made at init holds one reference, each child's
 * view another, and the last release destroys the transport (its orderly
 * close), so a parent freed before its child leaves the child's
 * connections open. A child of a child is a view of the root again (its
 * ranks mapped to the root's), never a view of a view.
 *
 * A child view's messages carry the child's group id in their tags
 * (transport.h: mlxd_tag_with_group) and nothing else changes: the
 * child's algorithms, its own sequence numbers and its own two-level
 * views (phase and segment) run on it as on any transport. Ids come from
 * the split's exchange (mlxd_tshare_split_begin / _end): every rank
 * proposes the next id it has never used over this root, a child takes the
 * largest proposal of its members, and every member's next proposal is
 * larger than every id it has taken; so no two groups a rank belongs to
 * share an id, and two ranks exchange messages of one id only in one
 * group. Ids are never reused: 65535 children (and their children) per
 * root and rank, then split fails with a message saying so.
 *
 * Waits, liveness, signatures and failures are the root's, as for any
 * view: a failure seen through a child (a lost peer, a signature mismatch,
 * abort) fails the root transport, and with it the parent and every other
 * group over it. */
typedef struct mlxd_tshare mlxd_tshare;

/* Share t (which the share then owns): one reference, the caller's. NULL
 * with st set: out of memory (t is left as it was). */
mlxd_tshare* mlxd_tshare_new(mlxd_transport* t, mlxd_status* st);
/* Drop a reference; the last one destroys the transport (transport.h's
 * destroy: its caller's rules hold for the last releaser: no op in flight
 * on any group over it). NULL is a no-op. Thread-safe. */
void mlxd_tshare_release(mlxd_tshare* s);
mlxd_transport* mlxd_tshare_transport(const mlxd_tshare* s);

/* A split over s: begin takes this rank's split lock of s (one split over a
 * root at a time on a rank: two threads splitting groups of one family at
 * once are serialised, so their ids never collide; the lock is held across
 * the split's exchange, whose waits are bounded) and returns the id this
 * rank proposes (1..). end records that this rank took id (0: none, the
 * split failed or made no view) and releases the lock. Not reentrant. */
unsigned mlxd_tshare_split_begin(mlxd_tshare* s);
void mlxd_tshare_split_end(mlxd_tshare* s, unsigned id);

/* A child view: the transport of s seen by root_ranks[0..k) (distinct ranks
 * of the root, this rank among them at index me, copied), messages tagged
 * with group id (1..MLXD_TAG_GROUPS-1). It takes a reference on s; its
 * destroy drops it and frees the view. Every op is the root's (any thread;
 * abort and failures are the root's; forget closes the root's descriptors,
 * as often as called). NULL with st set: out of memory. */
mlxd_transport* mlxd_view_child_new(mlxd_tshare* s, const int* root_ranks, int k, int me,
                                    unsigned id, mlxd_status* st);
/* For a child view: the root rank of its rank i; the share it holds. */
int mlxd_view_child_root_rank(const mlxd_transport* t, int i);
mlxd_tshare* mlxd_view_child_share(const mlxd_transport* t);
bool mlxd_view_is_child(const mlxd_transport* t);

#endif

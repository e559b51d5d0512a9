/* Private: a view of a transport, a transport over a subset of another
 * transport's ranks, renumbered 0..k-1, whose messages carry a phase and
 * a segment of their own in their tags (transport.h: mlxd_tag_with_phase,
 * mlxd_tag_with_segment). The flat algorithms of src/algo run unchanged on
 * a view; the two-level collectives (src/algo/hier.c) run them on "the
 * ranks of my host" and on "the ranks with my local index on every host",
 * one phase (and, pipelined, one segment of the buffer) each, under the one
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

#endif

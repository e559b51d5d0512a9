/* The two-level collectives' view of a group (hier.h): hosts, local
 * indices, columns; and MLXDIST_ALGO. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo_impl.h"
#include "algo/hier.h"
#include "util/tunables.h"

void mlxd_hier_free(mlxd_hier* h) {
  if (!h) return;
  free(h->host_count);
  free(h->host_start);
  free(h->by_host);
  free(h->col);
  free(h->leaders);
  free(h);
}

mlxd_hier* mlxd_hier_new(int rank, int size, const int* host_of, mlxd_status* st) {
  assert(size >= 1 && rank >= 0 && rank < size && host_of);
  for (int p = 0; p < size; p++)
    if (host_of[p] < 0 || host_of[p] > p || host_of[host_of[p]] != host_of[p]) {
      mlxd_algo_fail(st, MLXD_EINVAL,
                     "rank %d's host is given as rank %d, which is not the lowest rank of a host",
                     p, host_of[p]);
      return NULL;
    }
  mlxd_hier* h = calloc(1, sizeof *h);
  int* hidx = calloc((size_t)size, sizeof *hidx); /* host index of each rank */
  if (h) {
    h->host_count = calloc((size_t)size, sizeof *h->host_count);
    h->host_start = calloc((size_t)size + 1, sizeof *h->host_start);
    h->by_host = calloc((size_t)size, sizeof *h->by_host);
    h->leaders = calloc((size_t)size, sizeof *h->leaders);
    h->col = calloc((size_t)size, sizeof *h->col);
  }
  if (!h || !hidx || !h->host_count || !h->host_start || !h->by_host || !h->leaders || !h->col) {
    free(hidx);
    mlxd_hier_free(h);
    mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for the group's host map");
    return NULL;
  }
  h->size = size;
  h->rank = rank;
  h->seg_bytes = (size_t)mlxd_tunable_long(MLXD_T_HIER_SEGMENT);
  for (int p = 0; p < size; p++) {
    hidx[p] = host_of[p] == p ? h->nhosts++ : hidx[host_of[p]];
    h->host_count[hidx[p]]++;
  }
  for (int g = 0; g < h->nhosts; g++) h->host_start[g + 1] = h->host_start[g] + h->host_count[g];
  int* fill = calloc((size_t)h->nhosts, sizeof *fill);
  if (!fill) {
    free(hidx);
    mlxd_hier_free(h);
    mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for the group's host map");
    return NULL;
  }
  h->min_local = size;
  for (int p = 0; p < size; p++) {
    int g = hidx[p];
    if (p == rank) h->local_rank = fill[g];
    h->by_host[h->host_start[g] + fill[g]++] = p;
  }
  h->host = hidx[rank];
  h->nlocal = h->host_count[h->host];
  for (int g = 0; g < h->nhosts; g++) {
    int c = h->host_count[g];
    if (c < h->min_local) h->min_local = c;
    if (c > h->max_local) h->max_local = c;
    h->leaders[g] = h->by_host[h->host_start[g]];
  }
  if (h->local_rank < h->min_local)
    for (int g = 0; g < h->nhosts; g++) h->col[g] = h->by_host[h->host_start[g] + h->local_rank];
  else {
    free(h->col);
    h->col = NULL;
  }
  free(fill);
  free(hidx);
  return h;
}

bool mlxd_hier_applies(const mlxd_hier* h) { return h && h->nhosts >= 2 && h->max_local >= 2; }

int mlxd_hier_mode(void) { return (int)mlxd_tunable_long(MLXD_T_ALGO); }

void mlxd_hier_describe(const mlxd_hier* h, char* out, size_t n) {
  if (h->min_local == h->max_local) {
    snprintf(out, n, "%d hosts x %d", h->nhosts, h->max_local);
    return;
  }
  int k = snprintf(out, n, "%d hosts: ", h->nhosts);
  for (int g = 0; g < h->nhosts && k >= 0 && (size_t)k < n; g++)
    k += snprintf(out + k, n - (size_t)k, "%s%d", g ? "+" : "", h->host_count[g]);
  if (k >= 0 && (size_t)k < n) snprintf(out + k, n - (size_t)k, " ranks");
}

mlxd_hier_form mlxd_hier_pick(const mlxd_hier* h, size_t nbytes) {
  if (nbytes <= MLXD_HIER_TINY_BYTES && h->min_local == h->max_local) return MLXD_HIER_COLUMNS;
  return nbytes <= mlxd_algo_small_bytes() ? MLXD_HIER_LEADERS : MLXD_HIER_SLICES;
}

const char* mlxd_hier_form_note(mlxd_hier_form f) {
  return f == MLXD_HIER_COLUMNS   ? ", host sums by column"
         : f == MLXD_HIER_LEADERS ? ", via host leaders"
                                  : "";
}

/* all_to_all's choice, counted on the host with the most ranks (c of n,
 * hosts H), whose leader does the most work and whose uplink carries the
 * most messages. Each part crosses between hosts once in both forms, so the
 * wire's bytes do not enter; what the gathered form changes is:
 *   spared:  its uplink carries H - 1 messages each way instead of the
 *            flat form's c x (n - c);
 *   added:   copies by its leader of parts of P bytes: packing c x (n - c)
 *            parts for the other hosts, assembling c outputs of n parts,
 *            and the host's other c - 1 ranks' inputs and outputs through
 *            shared memory, (c - 1) x n parts each way (a shm message is
 *            one copy at least); the flat form's own shm messages, (c - 1)
 *            parts each way, are not added.
 * It pays while added x P <= spared x MLXD_A2A_MSG_BYTES: one TCP message
 * costs both its ends a system call and a wake-up, some microseconds, in
 * which one core copies about 8 KiB of warm memory. The two extra hops
 * inside the host are shm messages, counted by their copies. That is parts
 * up to 1,365 B on 2 hosts x 2 (and 2 x 4), 606 B on 3 + 1, 1,638 B on
 * 3 x 2, 1,283 B on 2 x 8, 1,755 B on 4 x 8. */
bool mlxd_hier_a2a_gathered(const mlxd_hier* h, size_t part_bytes) {
  if (part_bytes == 0) return false;
  size_t n = (size_t)h->size, c = (size_t)h->max_local, H = (size_t)h->nhosts;
  size_t flat_msgs = c * (n - c);
  if (flat_msgs <= H - 1) return false;
  size_t spared = flat_msgs - (H - 1);
  size_t added = c * (n - c) + c * n + 2 * (c - 1) * n - 2 * (c - 1);
  return part_bytes <= spared * MLXD_A2A_MSG_BYTES / added;
}

const char* mlxd_hier_a2a_note(const mlxd_hier* h, size_t part_bytes) {
  return mlxd_hier_a2a_gathered(h, part_bytes) ? ", parts gathered per host" : ", parts direct";
}

/* The two-level all_to_all (hier.h). Every part crosses between hosts at
 * most once in both forms; what differs is how many messages carry them.
 * Large parts go flat, straight from the sender's input into the reader's
 * output (no copy added). Small parts are where a rank-to-rank exchange
 * pays a message per pair of ranks on the slow links; the host-gathered
 * form is written here when it lands, and until then every size runs the
 * flat form, which is correct on any host map. */
#include "algo/algo.h"
#include "algo/hier.h"

int mlxd_algo_hier_all_to_all(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                              const mlxd_sig* sig, const void* in, void* out, size_t part_bytes,
                              mlxd_status* st) {
  (void)h;
  return mlxd_algo_all_to_all(t, seq, sig, in, out, part_bytes, st);
}

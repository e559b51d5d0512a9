/* Bootstrapping a group from a hostfile (net.h): MLX_RANK and MLX_HOSTFILE,
 * as MLX's launcher and mlxdist-launch on one host write them. Every rank
 * reads the same file (hostfile.c), takes the job's identity (auth.c: the
 * launcher's token, else one derived from the file; the secret, if any),
 * listens on its own addresses, lets the backend make the group without TCP
 * where it can (maker->local: the ring's shared-memory session of
 * mlxdist-launch), else connects (mlxd_net_tcp_open: lazy or the full mesh)
 * and hands the group to maker->make. */
#include <stdlib.h>

#include "net/net.h"
#include "security/secret.h"
#include "util/env.h"

int mlxd_net_bootstrap_hostfile(const mlxd_net_maker* maker, mlxd_backend** out, mlxd_status* st) {
  const char* rs = mlxd_env_get("MLX_RANK");
  const char* path = mlxd_env_get("MLX_HOSTFILE");
  if (!rs || !*rs || !path || !*path)
    return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP,
                        "not configured: MLX_RANK and MLX_HOSTFILE must be set (MLX_RANK=%s, "
                        "MLX_HOSTFILE=%s)",
                        rs && *rs ? rs : "(unset)", path && *path ? path : "(unset)");
  long rank = 0;
  if (mlxd_env_long("MLX_RANK", 0, 1L << 20, &rank) != 0)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "MLX_RANK='%s' is not a non-negative integer (at most %ld)", rs, 1L << 20);
  if (maker->check && maker->check(st)) return st->code; /* before anyone waits on us */
  mlxd_net_hosts hosts;
  if (mlxd_net_hostfile_load(path, &hosts, st)) return st->code;
  const int n = hosts.size, k = hosts.nconn;
  int rc = 0;
  /* The job's identity: mlxdist-launch's random token, else one derived from the
   * hostfile (every rank of the job has the same file); and the secret, if any. */
  mlxd_net_auth auth;
  bool have_token = false;
  if ((rc = mlxd_net_auth_load(&auth, st)) ||
      (rc = mlxd_net_auth_env_token(&auth, &have_token, st))) {
    mlxd_net_hosts_free(&hosts);
    mlxd_net_auth_clear(&auth);
    return rc;
  }
  if (!have_token) { /* a digest: OpenSSL must load (never a token of zeros) */
    if ((rc = mlxd_crypto_init(st))) {
      mlxd_net_hosts_free(&hosts);
      mlxd_net_auth_clear(&auth);
      return rc;
    }
    mlxd_hs_token_hosts(&hosts, auth.token);
  }
  int* lfds = NULL;
  mlxd_transport* t = NULL;
  if (rank >= n) {
    rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                      "MLX_RANK=%ld is outside the hostfile '%s', which lists %d rank(s) "
                      "(expected a rank in [0, %d))",
                      rank, path, n, n);
    goto done;
  }
  mlxd_net_log("rank %ld of %d from hostfile '%s', %d connection(s) per peer", rank, n, path, k);
  mlxd_net_addr self = hosts.addrs[rank * k];
  if (n == 1) {
    rc = maker->make(0, 1, k, &self, &auth, NULL, out, st);
    goto done;
  }
  lfds = malloc(sizeof(int) * (size_t)k);
  if (lfds)
    for (int c = 0; c < k; c++) lfds[c] = -1;
  if (!lfds) {
    rc =
        mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory connecting %d ranks", n);
    goto done;
  }
  for (int c = 0; c < k; c++) {
    mlxd_net_addr a = hosts.addrs[rank * k + c];
    if ((rc = mlxd_net_listen(&a, &lfds[c], st))) goto done;
  }
  if (maker->local) { /* started by mlxdist-launch on this host: maybe no TCP at all */
    bool made = false;
    if ((rc = maker->local((int)rank, n, k, &self, &auth, &made, out, st)) || made) goto done;
  }
  if ((rc = mlxd_net_tcp_open((int)rank, &hosts, lfds, &auth, &t, st))) goto done;
  rc = maker->make((int)rank, n, k, &self, &auth, t, out, st);
done:
  mlxd_net_auth_clear(&auth);
  if (lfds) mlxd_net_close_all(lfds, k);
  free(lfds);
  mlxd_net_hosts_free(&hosts);
  return rc;
}

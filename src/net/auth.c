/* The job's identity and secret (net.h): the token from MLXDIST_JOB_TOKEN,
 * the handshake key derived from MLXDIST_SECRET_FILE, and wiping them. What
 * every connection proves with them is handshake.h's. */
#include <stdio.h>
#include <string.h>

#include "net/net.h"
#include "security/secret.h"
#include "util/bytes.h"
#include "util/tunables.h"

void mlxd_net_auth_clear(mlxd_net_auth* a) { mlxd_wipe(a, sizeof *a); }

int mlxd_net_auth_env_token(mlxd_net_auth* a, bool* found, mlxd_status* st) {
  const char* v = mlxd_tunable_str(MLXD_T_JOB_TOKEN);
  *found = v && *v;
  if (!*found) return 0;
  if (mlxd_hs_token_parse(v, a->token) != 0)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "MLXDIST_JOB_TOKEN='%.80s%s' is not a job token (expected exactly %d hex "
                        "digits, as mlxdist-launch sets it; unset it to derive one from the "
                        "hostfile)",
                        v, strlen(v) > 80 ? "..." : "", 2 * MLXD_NET_TOKEN_BYTES);
  return 0;
}

int mlxd_net_auth_load(mlxd_net_auth* a, mlxd_status* st) {
  memset(a, 0, sizeof *a);
  mlxd_secret s;
  if (mlxd_secret_load(&s, st)) {
    /* the secret's own messages are plain; keep them, under the bootstrap layer */
    char msg[MLXD_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", st->msg);
    int code = st->code;
    mlxd_fail_at(st, code, MLXD_LAYER_BOOTSTRAP, "%s", msg);
    return code;
  }
  if (s.have) {
    if (mlxd_secret_derive(&s, "handshake", a->key) != 0) {
      memset(&s, 0, sizeof s);
      return mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP,
                          "cannot derive the handshake key from MLXDIST_SECRET_FILE (libcrypto)");
    }
    a->have_key = true;
  }
  mlxd_wipe(&s, sizeof s);
  return 0;
}

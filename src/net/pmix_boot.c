/* A group started by a PMIx server (srun --mpi=pmix, mpirun, PRRTE) with
 * no other configuration: the bootstrap of bootstrap.c with rank, size and
 * the all-gather from PMIx (net/pmix.h). Also which
 * configuration the ring uses when several are present, and the error for
 * a Slurm job step without PMIx. See docs/pmix.md. */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "net/net.h"
#include "net/pmix.h"
#include "util/env.h"
#include "util/tunables.h"

static bool env_set(const char* name) {
  const char* v = mlxd_env_get(name);
  return v && *v;
}

static bool pmix_off(void) {
  const char* v = mlxd_tunable_str(MLXD_T_PMIX);
  return v && strcasecmp(v, "off") == 0;
}

bool mlxd_net_pmix_for_any(void) {
  const char* v = mlxd_tunable_str(MLXD_T_PMIX);
  return v && strcasecmp(v, "on") == 0;
}

int mlxd_net_config_choice(void) {
  if (mlxd_net_rendezvous_configured()) return MLXD_NET_CFG_RENDEZVOUS;
  /* MLX's launcher (and mlxdist-launch) set these: they win, whatever else is there */
  if (env_set("MLX_RANK") || env_set("MLX_HOSTFILE")) return MLXD_NET_CFG_HOSTFILE;
  if (!pmix_off() && mlxd_pmix_present()) return MLXD_NET_CFG_PMIX;
  return MLXD_NET_CFG_HOSTFILE;
}

int mlxd_net_slurm_without_pmix(mlxd_status* st) {
  const char* job = mlxd_env_get("SLURM_JOB_ID");
  const char* proc = mlxd_env_get("SLURM_PROCID");
  if (!(job && *job) && !(proc && *proc)) return 0;
  if (env_set("MLX_RANK") || env_set("MLX_HOSTFILE")) return 0; /* their own errors */
  if (mlxd_pmix_present() && pmix_off())
    return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP,
                        "not configured: this is a Slurm job with PMIx, but MLXDIST_PMIX=off; "
                        "unset it, or set MLX_RANK and MLX_HOSTFILE");
  return mlxd_fail_at(
      st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP,
      "not configured: this process runs in a Slurm job (SLURM_JOB_ID=%.32s, SLURM_PROCID=%.16s) "
      "but not under PMIx (PMIX_NAMESPACE and PMIX_RANK are unset), so it cannot learn its peers; "
      "start it with `srun --mpi=pmix` (or set MpiDefault=pmix in slurm.conf), or give it "
      "MLX_RANK and MLX_HOSTFILE",
      job && *job ? job : "(unset)", proc && *proc ? proc : "(unset)");
}

static bool is_loopback(const mlxd_net_addr* a) {
  if (a->sa.ss_family == AF_INET)
    return (ntohl(((const struct sockaddr_in*)(const void*)&a->sa)->sin_addr.s_addr) >> 24) == 127;
  if (a->sa.ss_family == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6*)(const void*)&a->sa)->sin6_addr);
  return false;
}

/* A job across nodes must not listen on loopback, which is where the default
 * lands when the host name does not resolve to another address (a node whose
 * name is not in its own /etc/hosts or DNS): then the first IPv4 address of an
 * interface that is up and not loopback. 0 with *use = false: keep the default. */
static int across_nodes_addr(const mlxd_pmix_job* job, mlxd_net_addr* out, bool* use,
                             mlxd_status* st) {
  *use = false;
  if (job->local_size <= 0 || job->local_size >= job->bs.size) return 0; /* one node (or unknown) */
  const char* a = mlxd_tunable_str(MLXD_T_RING_ADDR);
  const char* i = mlxd_tunable_str(MLXD_T_IFNAME);
  if ((a && *a) || (i && *i)) return 0; /* the user's choice */
  if (mlxd_net_default_addr(out, st)) return st->code;
  if (!is_loopback(out)) return 0;
  struct ifaddrs* ifs = NULL;
  if (getifaddrs(&ifs) != 0) return 0;
  for (struct ifaddrs* f = ifs; f; f = f->ifa_next) {
    if (!f->ifa_addr || f->ifa_addr->sa_family != AF_INET) continue;
    if (!(f->ifa_flags & IFF_UP) || (f->ifa_flags & IFF_LOOPBACK)) continue;
    memset(out, 0, sizeof *out);
    memcpy(&out->sa, f->ifa_addr, sizeof(struct sockaddr_in));
    out->len = sizeof(struct sockaddr_in);
    ((struct sockaddr_in*)(void*)&out->sa)->sin_port = 0;
    mlxd_net_format_addr((struct sockaddr*)&out->sa, out->text, sizeof out->text);
    mlxd_net_log(
        "the job spans nodes and this host's name resolves to loopback only: "
        "listening on %s (interface %s; MLXDIST_IFNAME or MLXDIST_RING_ADDR choose)",
        out->text, f->ifa_name);
    *use = true;
    break;
  }
  freeifaddrs(ifs);
  if (!*use)
    return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP,
                        "the job spans nodes (%d of its %d ranks on this one), but this host has "
                        "no IPv4 address other than loopback to listen on; name one with "
                        "MLXDIST_RING_ADDR or MLXDIST_IFNAME",
                        job->local_size, job->bs.size);
  return 0;
}

int mlxd_net_bootstrap_pmix(const mlxd_net_maker* maker, mlxd_backend** out, mlxd_status* st) {
  double lt = mlxd_tunable_double(MLXD_T_LAUNCH_TIMEOUT);
  double timeout = lt > 0 ? lt : mlxd_tunable_double(MLXD_T_TIMEOUT);
  mlxd_pmix_job job;
  if (mlxd_pmix_open(&job, timeout, st)) return st->code;
  mlxd_net_log("PMIx: namespace %s, rank %d of %d, local rank %d of %d on this node (bound %g s)",
               job.nspace, job.bs.rank, job.bs.size, job.local_rank, job.local_size, timeout);
  mlxd_net_addr host;
  bool use = false;
  if (across_nodes_addr(&job, &host, &use, st)) return st->code;
  return mlxd_net_bootstrap_ranked(&job.bs, "PMIx", use ? &host : NULL, maker, out, st);
}

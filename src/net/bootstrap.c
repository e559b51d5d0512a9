/* Bootstrapping a group through a caller's all-gather (init_with_all_gather)
 * and the address records it exchanges.
 *
 * Every rank listens on MLXDIST_RING_CONNECTIONS ephemeral ports (or ports
 * of MLXDIST_PORT_RANGE) on its address (MLXDIST_RING_ADDR, else
 * MLXDIST_IFNAME's address, else the first non-loopback IPv4 address of the
 * host name, else 127.0.0.1; endpoint.c), encodes one 64-byte record per port and
 * all-gathers them. Every record that comes back is validated (magic,
 * version, checksum, rank, size, connection index) before it is used: a
 * callback that returns garbage gives an error naming the rank whose record
 * is bad, never a crash. Then the mesh is built as with a hostfile.
 *
 * Record layout (integers big-endian):
 *   0  magic "MXRB"        4  version (u16)      6  conn (u16)
 *   8  nconn (u16)        10  family (4 or 6)   12  rank (u32)
 *  16  size (u32)         20  port (u16)        22  zero (u16)
 *  24  address (16 bytes; IPv4 uses the first 4, the rest zero)
 *  40  nonce (16 random bytes of this rank)       56  zero (4 bytes)
 *  60  FNV-1a checksum of bytes 0..59
 * Version 2 added the nonce: the job token of a caller-bootstrapped group is
 * derived from every record after the all-gather (handshake.h), so it is
 * fresh and random per job and identical on every rank. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net/handshake.h"
#include "net/net.h"
#include "security/secret.h"
#include "util/bytes.h"
#include "util/env.h"
#include "util/tunables.h"

#define REC_MAGIC 0x4D585242u /* "MXRB" */
#define REC_VERSION 2u

static uint32_t fnv1a(const unsigned char* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
  return h;
}

static bool zeros(const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return false;
  return true;
}

void mlxd_net_rec_encode(unsigned char* rec, int rank, int size, int conn, int nconn,
                         const mlxd_net_addr* a, const unsigned char* nonce) {
  memset(rec, 0, MLXD_NET_REC_BYTES);
  mlxd_put32(rec, REC_MAGIC);
  mlxd_put16(rec + 4, REC_VERSION);
  mlxd_put16(rec + 6, (unsigned)conn);
  mlxd_put16(rec + 8, (unsigned)nconn);
  mlxd_put32(rec + 12, (uint32_t)rank);
  mlxd_put32(rec + 16, (uint32_t)size);
  if (a->sa.ss_family == AF_INET) {
    const struct sockaddr_in* in = (const void*)&a->sa;
    mlxd_put16(rec + 10, 4);
    mlxd_put16(rec + 20, ntohs(in->sin_port));
    memcpy(rec + 24, &in->sin_addr, 4);
  } else {
    const struct sockaddr_in6* in6 = (const void*)&a->sa;
    mlxd_put16(rec + 10, 6);
    mlxd_put16(rec + 20, ntohs(in6->sin6_port));
    memcpy(rec + 24, &in6->sin6_addr, 16);
  }
  if (nonce) memcpy(rec + 40, nonce, MLXD_NET_REC_NONCE_BYTES);
  mlxd_put32(rec + 60, fnv1a(rec, 60));
}

int mlxd_net_rec_decode(const unsigned char* rec, int r, int size, int conn, int nconn,
                        const char* via, mlxd_net_addr* out, mlxd_status* st) {
  const char* what = NULL;
  char detail[96] = "";
  unsigned fam = mlxd_get16(rec + 10);
  if (mlxd_get32(rec) != REC_MAGIC)
    what = "bad magic";
  else if (mlxd_get16(rec + 4) != REC_VERSION)
    snprintf(detail, sizeof detail, "unsupported version %u (expected %u)", mlxd_get16(rec + 4),
             REC_VERSION);
  else if (mlxd_get32(rec + 60) != fnv1a(rec, 60))
    what = "bad checksum";
  else if (mlxd_get32(rec + 12) != (uint32_t)r)
    snprintf(detail, sizeof detail, "it claims to be from rank %u", (unsigned)mlxd_get32(rec + 12));
  else if (mlxd_get32(rec + 16) != (uint32_t)size)
    snprintf(detail, sizeof detail, "it says the group has %u ranks, this rank says %d",
             (unsigned)mlxd_get32(rec + 16), size);
  else if (mlxd_get16(rec + 8) != (unsigned)nconn)
    snprintf(detail, sizeof detail, "it has %u connections per peer, this rank %d",
             mlxd_get16(rec + 8), nconn);
  else if (mlxd_get16(rec + 6) != (unsigned)conn)
    snprintf(detail, sizeof detail, "it is for connection %u, expected %d", mlxd_get16(rec + 6),
             conn);
  else if (fam != 4 && fam != 6)
    snprintf(detail, sizeof detail, "unknown address family %u", fam);
  else if (mlxd_get16(rec + 20) == 0)
    what = "port 0";
  else if (!zeros(rec + 22, 2) || (fam == 4 && !zeros(rec + 28, 12)) || !zeros(rec + 56, 4))
    what = "non-zero reserved bytes"; /* found by fuzz_ring_record: the record must be canonical */
  if (what || detail[0])
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "%s returned a malformed address record for rank %d (connection "
                        "%d: %s); it must place rank r's %d bytes at offset r * n_bytes of dst",
                        via, r, conn, what ? what : detail, MLXD_NET_REC_BYTES * nconn);
  memset(out, 0, sizeof *out);
  if (fam == 4) {
    struct sockaddr_in* in = (void*)&out->sa;
    in->sin_family = AF_INET;
    in->sin_port = htons((uint16_t)mlxd_get16(rec + 20));
    memcpy(&in->sin_addr, rec + 24, 4);
    out->len = sizeof *in;
  } else {
    struct sockaddr_in6* in6 = (void*)&out->sa;
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons((uint16_t)mlxd_get16(rec + 20));
    memcpy(&in6->sin6_addr, rec + 24, 16);
    out->len = sizeof *in6;
  }
  mlxd_net_format_addr((struct sockaddr*)&out->sa, out->text, sizeof out->text);
  return 0;
}

int mlxd_net_default_addr(mlxd_net_addr* out, mlxd_status* st) {
  const char* env = mlxd_tunable_str(MLXD_T_RING_ADDR);
  char why[300];
  if (env && *env) {
    char tmp[300];
    snprintf(tmp, sizeof tmp, strchr(env, ':') && env[0] != '[' ? "[%s]:0" : "%s:0", env);
    if (mlxd_net_parse_addr(tmp, true, out, why, sizeof why) != 0)
      return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "MLXDIST_RING_ADDR='%s' is not a usable address (%s); expected "
                          "this host's IP address",
                          env, why);
    if (mlxd_net_addr_is_wildcard(out))
      return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "MLXDIST_RING_ADDR='%s' is the wildcard address: a rank listens on, "
                          "and tells its peers, one address of this host; name it",
                          env);
    return 0;
  }
  const char* ifname = mlxd_tunable_str(MLXD_T_IFNAME); /* endpoint.c */
  if (ifname && *ifname) return mlxd_net_ifname_addr(ifname, out, st);
  char host[256];
  if (gethostname(host, sizeof host) == 0) {
    host[sizeof host - 1] = '\0';
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) == 0) {
      for (struct addrinfo* ai = res; ai; ai = ai->ai_next) {
        const struct sockaddr_in* in = (const void*)ai->ai_addr;
        if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) continue;
        memset(out, 0, sizeof *out);
        memcpy(&out->sa, ai->ai_addr, ai->ai_addrlen);
        out->len = ai->ai_addrlen;
        ((struct sockaddr_in*)(void*)&out->sa)->sin_port = 0;
        mlxd_net_format_addr((struct sockaddr*)&out->sa, out->text, sizeof out->text);
        freeaddrinfo(res);
        return 0;
      }
      freeaddrinfo(res);
    }
  }
  if (mlxd_net_parse_addr("127.0.0.1:0", true, out, why, sizeof why) != 0)
    return mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "cannot form the loopback address: %s",
                        why);
  return 0;
}

static int env_int(const char* name, long lo, long hi, long* v, mlxd_status* st) {
  int rc = mlxd_env_long(name, lo, hi, v);
  if (rc > 0)
    return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP,
                        "%s is not set (needed with a caller's all-gather: MLX_RANK and "
                        "MLX_WORLD_SIZE)",
                        name);
  if (rc < 0)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "%s='%.40s' is not an integer in [%ld, %ld]", name, mlxd_env_get(name), lo,
                        hi);
  return 0;
}

int mlxd_net_bootstrap(mlxd_bootstrap* bs, const mlxd_net_maker* maker, mlxd_backend** out,
                       mlxd_status* st) {
  long size = 0, rank = 0;
  if (env_int("MLX_WORLD_SIZE", 1, 1 << 20, &size, st)) return st->code;
  if (env_int("MLX_RANK", 0, 1 << 20, &rank, st)) return st->code;
  if (rank >= size)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "MLX_RANK=%ld is outside [0, MLX_WORLD_SIZE=%ld)", rank, size);
  bs->rank = (int)rank;
  bs->size = (int)size;
  return mlxd_net_bootstrap_ranked(bs, "the caller's all-gather", NULL, maker, out, st);
}

int mlxd_net_bootstrap_ranked(mlxd_bootstrap* bs, const char* via, const mlxd_net_addr* listen_on,
                              const mlxd_net_maker* maker, mlxd_backend** out, mlxd_status* st) {
  const long size = bs->size, rank = bs->rank;
  long K = mlxd_tunable_long(MLXD_T_RING_CONNECTIONS);
  if (K < 1 || K > 64)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "MLXDIST_RING_CONNECTIONS=%ld is outside [1, 64]", K);
  if (maker->check && maker->check(st)) return st->code;
  mlxd_net_addr host;
  if (listen_on)
    host = *listen_on;
  else if (mlxd_net_default_addr(&host, st))
    return st->code;
  mlxd_net_auth auth;
  if (mlxd_net_auth_load(&auth, st)) return st->code; /* a bad secret file: before anyone waits */
  unsigned char nonce[MLXD_NET_REC_NONCE_BYTES];
  if (mlxd_random_bytes(nonce, sizeof nonce, st)) {
    mlxd_net_auth_clear(&auth);
    return st->code;
  }
  mlxd_net_log("rank %ld of %ld: bootstrapping through %s, %ld connection(s) per peer, address %s",
               rank, size, via, K, host.text);

  int n = (int)size, k = (int)K;
  int* lfds = malloc(sizeof(int) * (size_t)k);
  mlxd_transport* t = NULL;
  mlxd_net_addr* mine = calloc((size_t)k, sizeof *mine);
  unsigned char* src = calloc((size_t)k, MLXD_NET_REC_BYTES);
  unsigned char* dst = calloc((size_t)n * (size_t)k, MLXD_NET_REC_BYTES);
  mlxd_net_hosts hosts = {n, k, calloc((size_t)n * (size_t)k, sizeof(mlxd_net_addr))};
  int rc = 0;
  if (lfds)
    for (int c = 0; c < k; c++) lfds[c] = -1;
  if (!lfds || !mine || !src || !dst || !hosts.addrs) {
    rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory bootstrapping %d ranks",
                      n);
    goto done;
  }
  if (n > 1) {
    if ((rc = mlxd_net_listen_many(&host, k, lfds, mine, st))) goto done;
  } else {
    for (int c = 0; c < k; c++) mine[c] = host;
  }
  for (int c = 0; c < k; c++)
    mlxd_net_rec_encode(src + (size_t)c * MLXD_NET_REC_BYTES, (int)rank, n, c, k, &mine[c], nonce);
  /* Called for size one too, so the callback sees the same sequence on every path. */
  if ((rc = bs->all_gather(bs, dst, src, (size_t)k * MLXD_NET_REC_BYTES, st))) {
    if (!st->code)
      rc = mlxd_fail_at(st, MLXD_ECALLBACK, MLXD_LAYER_BOOTSTRAP, "the all-gather callback failed");
    goto done;
  }
  if (n > 1) {
    for (int r = 0; r < n; r++)
      for (int c = 0; c < k; c++)
        if ((rc = mlxd_net_rec_decode(dst + ((size_t)r * k + c) * MLXD_NET_REC_BYTES, r, n, c, k,
                                      "the all-gather callback", &hosts.addrs[r * k + c], st)))
          goto done;
    /* every rank holds the same records now, with every rank's fresh nonce */
    if ((rc = mlxd_crypto_init(st))) goto done;
    mlxd_hs_token_records(dst, (size_t)n * (size_t)k * MLXD_NET_REC_BYTES, auth.token);
    if ((rc = mlxd_net_tcp_open((int)rank, &hosts, lfds, &auth, &t, st))) goto done;
  }
  rc = maker->make((int)rank, n, k, &host, &auth, t, out, st);
done:
  mlxd_net_auth_clear(&auth);
  if (lfds) mlxd_net_close_all(lfds, k);
  free(lfds);
  free(mine);
  free(src);
  free(dst);
  mlxd_net_hosts_free(&hosts);
  return rc;
}

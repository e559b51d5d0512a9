/* Fuzz target: the ring hostfile parser (net/hostfile.c,
 * mlxd_net_hostfile_parse), the whole input as the file's bytes (no NUL
 * after them). It must never crash, look anything up or read past the input;
 * what it accepts must be a well-formed group: 1..MAX ranks, the same number
 * of connections each, every address an IP with a port or a host name left
 * for later, no address twice, no byte JSON forbids (a control byte outside
 * the four whitespace bytes, or any in a string); what it refuses must say
 * why, naming the file; and the plain-file scanner and the general path (cJSON) must
 * agree on it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "net/net.h"
#include "util/json_bytes.h"

/* The parser reads a plain file (strings without escapes) with a scanner of its own and any
 * other with cJSON (mlxd_net_hostfile_parse_json): the two must give the same answer, the
 * same addresses or the same error, on every input. */
static void same_as_general_path(const uint8_t* data, size_t size, int rc, const mlxd_status* st,
                                 const mlxd_net_hosts* h) {
  mlxd_net_hosts g;
  mlxd_status gst = {0};
  int grc = mlxd_net_hostfile_parse_json((const char*)data, size, "fuzz.json", &g, &gst);
  if (grc != rc || gst.code != st->code || strcmp(gst.msg, st->msg) != 0) abort();
  if (rc == 0) {
    if (g.size != h->size || g.nconn != h->nconn ||
        memcmp(g.addrs, h->addrs, (size_t)g.size * (size_t)g.nconn * sizeof *g.addrs) != 0)
      abort();
    mlxd_net_hosts_free(&g);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mlxd_net_hosts h;
  mlxd_status st = {0};
  int rc = mlxd_net_hostfile_parse((const char*)data, size, "fuzz.json", &h, &st);
  same_as_general_path(data, size, rc, &st, &h);
  if (rc != 0) {
    if (h.addrs || h.size || !st.msg[0] || st.code != rc) abort();
    if (!strstr(st.msg, "fuzz.json") && rc != MLXD_ENOMEM) abort();
    return 0;
  }
  if (mlxd_json_bad_byte((const char*)data, size, NULL, NULL, 0)) abort();
  if (h.size < 1 || h.size > MLXD_NET_HOSTFILE_MAX_RANKS || h.nconn < 1 ||
      h.nconn > MLXD_NET_HOSTFILE_MAX_CONNECTIONS || h.size * h.nconn > MLXD_NET_HOSTFILE_MAX_ADDRS)
    abort();
  int m = h.size * h.nconn;
  for (int i = 0; i < m; i++) {
    const mlxd_net_addr* a = &h.addrs[i];
    int fam = a->sa.ss_family;
    if (fam != AF_INET && fam != AF_INET6 && fam != AF_UNSPEC) abort();
    if (!a->text[0] || strlen(a->text) > MLXD_NET_ADDR_MAX_CHARS) abort();
    if (fam != AF_UNSPEC && (a->len == 0 || a->len > sizeof a->sa)) abort();
  }
  /* no two the same (pairwise for small groups: the parser hashes) */
  if (m <= 64)
    for (int i = 0; i < m; i++)
      for (int j = i + 1; j < m; j++) {
        const mlxd_net_addr *a = &h.addrs[i], *b = &h.addrs[j];
        if (a->sa.ss_family == AF_UNSPEC || b->sa.ss_family == AF_UNSPEC) continue;
        if (a->len == b->len && memcmp(&a->sa, &b->sa, a->len) == 0) abort();
      }
  mlxd_net_hosts_free(&h);
  return 0;
}

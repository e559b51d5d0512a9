/* The ring hostfile (MLX_HOSTFILE): a JSON list with one entry per rank, each
 * a list of "ip:port" strings; entry r, string c is the address rank r
 * listens on for connection c. Every rank must list the same number of
 * addresses. A plain file (the launcher's: strings without escapes) is read
 * by a scanner of its own; any other is parsed with cJSON, which names any
 * fault (parse_plain below).
 *
 * Three steps, so that the parser can be fuzzed: read (a regular file,
 * bounded), parse (pure: one JSON document, every fault named,
 * util/json_doc.h; limits, addresses that are IP literals, duplicates),
 * resolve (host names, then duplicates again).
 * Arrays are walked with cJSON_ArrayForEach: cJSON_GetArrayItem is O(n). */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "net/net.h"
#include "util/cjson_rt.h"
#include "util/json_doc.h"
#include "util/user_file.h"

#define EXPECTED_FORMAT "a JSON list with one list of \"ip:port\" strings per rank"

void mlxd_net_hosts_free(mlxd_net_hosts* h) {
  free(h->addrs);
  h->addrs = NULL;
  h->size = h->nconn = 0;
}

void mlxd_net_format_addr(const struct sockaddr* sa, char* buf, size_t n) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in* in = (const struct sockaddr_in*)(const void*)sa;
    inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip);
    snprintf(buf, n, "%s:%u", ip, (unsigned)ntohs(in->sin_port));
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6* in6 = (const struct sockaddr_in6*)(const void*)sa;
    inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof ip);
    snprintf(buf, n, "[%s]:%u", ip, (unsigned)ntohs(in6->sin6_port));
  } else {
    snprintf(buf, n, "(address family %d)", (int)sa->sa_family);
  }
}

/* ---- one address ---- */

/* "host:port" or "[v6]:port" into host (brackets removed) and port. */
static int split_addr(const char* s, bool allow_port0, char* host, size_t host_len, long* port,
                      char* why, size_t why_len) {
  const char* colon = strrchr(s, ':');
  if (!colon) {
    snprintf(why, why_len, "'%s' has no ':port' (expected \"ip:port\")", s);
    return -1;
  }
  size_t hl = (size_t)(colon - s);
  if (hl == 0 || hl >= host_len) {
    snprintf(why, why_len, "'%s' has an empty or too long host part (expected \"ip:port\")", s);
    return -1;
  }
  memcpy(host, s, hl);
  host[hl] = '\0';
  if (host[0] == '[') { /* [v6]:port */
    if (hl < 3 || host[hl - 1] != ']') {
      snprintf(why, why_len, "'%s' has an unbalanced '[' (expected \"[ipv6]:port\")", s);
      return -1;
    }
    memmove(host, host + 1, hl - 2);
    host[hl - 2] = '\0';
  }
  const char* ps = colon + 1;
  size_t nd = strspn(ps, "0123456789");
  long p = nd > 0 && nd <= 5 && ps[nd] == '\0' ? 0 : -1; /* 5 digits at most: no overflow */
  for (size_t i = 0; p >= 0 && i < nd; i++) p = p * 10 + (ps[i] - '0');
  if (p < (allow_port0 ? 0 : 1) || p > 65535) {
    snprintf(why, why_len, "'%s' has an invalid port '%s' (expected an integer in [%d, 65535])", s,
             ps, allow_port0 ? 0 : 1);
    return -1;
  }
  *port = p;
  return 0;
}

static void set_port(struct sockaddr_storage* sa, long port) {
  if (sa->ss_family == AF_INET)
    ((struct sockaddr_in*)(void*)sa)->sin_port = htons((uint16_t)port);
  else if (sa->ss_family == AF_INET6)
    ((struct sockaddr_in6*)(void*)sa)->sin6_port = htons((uint16_t)port);
}

/* An IP literal without any lookup; false if host is not one. */
static bool numeric_host(const char* host, mlxd_net_addr* out) {
  struct sockaddr_in* in = (struct sockaddr_in*)(void*)&out->sa;
  struct sockaddr_in6* in6 = (struct sockaddr_in6*)(void*)&out->sa;
  if (inet_pton(AF_INET, host, &in->sin_addr) == 1) {
    in->sin_family = AF_INET;
    out->len = sizeof *in;
    return true;
  }
  if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    out->len = sizeof *in6;
    return true;
  }
  return false;
}

static int resolve_host(const char* s, const char* host, mlxd_net_addr* out, char* why,
                        size_t why_len) {
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0 || !res) {
    snprintf(why, why_len, "'%s': cannot resolve host '%s' (%s)", s, host, gai_strerror(rc));
    return -1;
  }
  bool ok = (res->ai_family == AF_INET || res->ai_family == AF_INET6) &&
            res->ai_addrlen <= sizeof out->sa;
  if (ok) {
    memcpy(&out->sa, res->ai_addr, res->ai_addrlen);
    out->len = res->ai_addrlen;
  }
  freeaddrinfo(res);
  if (!ok) {
    snprintf(why, why_len, "'%s': host '%s' is not an IPv4/IPv6 address", s, host);
    return -1;
  }
  return 0;
}

int mlxd_net_parse_addr(const char* s, bool allow_port0, mlxd_net_addr* out, char* why,
                        size_t why_len) {
  memset(out, 0, sizeof *out);
  snprintf(out->text, sizeof out->text, "%s", s);
  char host[256];
  long port = 0;
  if (split_addr(s, allow_port0, host, sizeof host, &port, why, why_len) != 0) return -1;
  if (!numeric_host(host, out) && resolve_host(s, host, out, why, why_len) != 0) return -1;
  set_port(&out->sa, port);
  return 0;
}

/* Pure: an IP literal is converted, a host name is only checked for its
 * characters and left for mlxd_net_hostfile_resolve (AF_UNSPEC). */
static int addr_from_text(const char* s, mlxd_net_addr* out, char* why, size_t why_len) {
  memset(out, 0, sizeof *out);
  size_t n = strlen(s);
  if (n > MLXD_NET_ADDR_MAX_CHARS) {
    snprintf(why, why_len, "'%.24s...' is %zu characters long (expected \"ip:port\" of at most %d)",
             s, n, MLXD_NET_ADDR_MAX_CHARS);
    return -1;
  }
  memcpy(out->text, s, n + 1);
  char host[MLXD_NET_ADDR_MAX_CHARS + 1];
  long port = 0;
  if (split_addr(s, false, host, sizeof host, &port, why, why_len) != 0) return -1;
  if (numeric_host(host, out)) {
    set_port(&out->sa, port);
    return 0;
  }
  size_t bad = strspn(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_%:");
  if (host[bad] != '\0') {
    unsigned char c = (unsigned char)host[bad];
    if (c > 0x20 && c < 0x7f)
      snprintf(why, why_len,
               "'%s' has the character '%c' in its host (expected an IP address or host name)", s,
               c);
    else
      snprintf(why, why_len,
               "'%s' has the byte 0x%02x in its host (expected an IP address or host name)", s, c);
    return -1;
  }
  out->sa.ss_family = AF_UNSPEC; /* a name: resolved later */
  return 0;
}

/* ---- duplicates: a hash table in one pass (a sort if it degrades) ---- */

static int addr_cmp(const mlxd_net_addr* a, const mlxd_net_addr* b) {
  int fa = a->sa.ss_family, fb = b->sa.ss_family;
  if (fa != fb) return fa < fb ? -1 : 1;
  if (fa == AF_INET) {
    const struct sockaddr_in* x = (const struct sockaddr_in*)(const void*)&a->sa;
    const struct sockaddr_in* y = (const struct sockaddr_in*)(const void*)&b->sa;
    int c = memcmp(&x->sin_addr, &y->sin_addr, sizeof x->sin_addr);
    if (c) return c;
    return (int)ntohs(x->sin_port) - (int)ntohs(y->sin_port);
  }
  if (fa == AF_INET6) {
    const struct sockaddr_in6* x = (const struct sockaddr_in6*)(const void*)&a->sa;
    const struct sockaddr_in6* y = (const struct sockaddr_in6*)(const void*)&b->sa;
    int c = memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr);
    if (c) return c;
    if (x->sin6_port != y->sin6_port) return (int)ntohs(x->sin6_port) - (int)ntohs(y->sin6_port);
    return x->sin6_scope_id < y->sin6_scope_id ? -1 : x->sin6_scope_id > y->sin6_scope_id;
  }
  return strcasecmp(a->text, b->text);
}

static int ptr_cmp(const void* pa, const void* pb) {
  const mlxd_net_addr* a = *(const mlxd_net_addr* const*)pa;
  const mlxd_net_addr* b = *(const mlxd_net_addr* const*)pb;
  int c = addr_cmp(a, b);
  if (c) return c;
  return a < b ? -1 : a > b; /* equal keys in file order */
}

/* The same key as addr_cmp: equal addresses hash alike. FNV-1a over the
 * family, the address, the port (and the scope of an IPv6 address), or over
 * the text without case for a host name not yet resolved; then mixed. */
static uint32_t addr_hash(const mlxd_net_addr* a) {
  uint32_t h = 2166136261u;
  const unsigned char* p = NULL;
  size_t n = 0;
  int fam = a->sa.ss_family;
  h = (h ^ (uint32_t)fam) * 16777619u;
  if (fam == AF_INET) {
    const struct sockaddr_in* x = (const struct sockaddr_in*)(const void*)&a->sa;
    p = (const unsigned char*)&x->sin_addr;
    n = sizeof x->sin_addr;
    h = (h ^ x->sin_port) * 16777619u;
  } else if (fam == AF_INET6) {
    const struct sockaddr_in6* x = (const struct sockaddr_in6*)(const void*)&a->sa;
    p = (const unsigned char*)&x->sin6_addr;
    n = sizeof x->sin6_addr;
    h = (h ^ x->sin6_port) * 16777619u;
    h = (h ^ x->sin6_scope_id) * 16777619u;
  } else {
    for (const char* t = a->text; *t; t++) {
      unsigned char c = (unsigned char)*t;
      if (c >= 'A' && c <= 'Z') c = (unsigned char)(c - 'A' + 'a');
      h = (h ^ c) * 16777619u;
    }
  }
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
  h ^= h >> 16; /* mix every bit into the low ones the table uses */
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  return h ^ (h >> 16);
}

/* The first address (in file order) equal to an earlier one: a hash table of
 * indices filled in one pass. Sets *first and *second, or *second = m if all
 * differ. 1 if the table could not be had (memory) or its probes pass a
 * bound (a file built to collide): the caller sorts instead. */
static int find_duplicate_hashed(const mlxd_net_hosts* h, size_t m, size_t* first, size_t* second) {
  size_t cap = 16;
  while (cap < 2 * m) cap *= 2;
  uint32_t* slot = calloc(cap, sizeof *slot); /* index + 1; 0: empty */
  if (!slot) return 1;
  size_t probes = 0, budget = 32 * m;
  *second = m;
  for (size_t i = 0; i < m; i++) {
    size_t b = addr_hash(&h->addrs[i]) & (cap - 1);
    for (; slot[b]; b = (b + 1) & (cap - 1)) {
      if (++probes > budget) {
        free(slot);
        return 1;
      }
      size_t j = slot[b] - 1;
      if (addr_cmp(&h->addrs[j], &h->addrs[i]) == 0) {
        *first = j;
        *second = i;
        free(slot);
        return 0;
      }
    }
    slot[b] = (uint32_t)(i + 1);
  }
  free(slot);
  return 0;
}

/* The same answer by sorting: O(m log m) whatever the input. */
static int find_duplicate_sorted(const mlxd_net_hosts* h, size_t m, size_t* first, size_t* second) {
  const mlxd_net_addr** p = malloc(m * sizeof *p);
  if (!p) return -1;
  for (size_t i = 0; i < m; i++) p[i] = &h->addrs[i];
  qsort(p, m, sizeof *p, ptr_cmp);
  *second = m;
  for (size_t i = 1; i < m; i++) {
    if (addr_cmp(p[i - 1], p[i]) != 0) continue;
    size_t j = (size_t)(p[i] - h->addrs);
    if (j < *second) {
      *second = j;
      *first = (size_t)(p[i - 1] - h->addrs);
    }
  }
  free(p);
  return 0;
}

/* The duplicate whose second occurrence comes first in the file is named,
 * with the occurrence before it (the only one: it is the first repeat). */
static int check_duplicates(const char* name, const mlxd_net_hosts* h, mlxd_status* st) {
  size_t m = (size_t)h->size * (size_t)h->nconn;
  if (m < 2) return 0;
  size_t first = 0, second = m;
  if (find_duplicate_hashed(h, m, &first, &second) != 0 &&
      find_duplicate_sorted(h, m, &first, &second) != 0)
    return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP,
                        "out of memory checking hostfile '%s'", name);
  if (second == m) return 0;
  int k = h->nconn;
  const mlxd_net_addr *a = &h->addrs[first], *b = &h->addrs[second];
  char same[120] = "name the same host and port"; /* host names not yet resolved */
  if (a->sa.ss_family != AF_UNSPEC) {
    char sa_text[80];
    mlxd_net_format_addr((const struct sockaddr*)&a->sa, sa_text, sizeof sa_text);
    snprintf(same, sizeof same, "are the same address %s", sa_text);
  }
  if (strcmp(a->text, b->text) == 0)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "hostfile '%s': duplicate address: rank %zu connection %zu and rank %zu "
                        "connection %zu both list '%s' (expected a different address for every "
                        "rank and connection)",
                        name, first / (size_t)k, first % (size_t)k, second / (size_t)k,
                        second % (size_t)k, a->text);
  return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                      "hostfile '%s': duplicate address: rank %zu connection %zu ('%s') and rank "
                      "%zu connection %zu ('%s') %s (expected a different address for every rank "
                      "and connection)",
                      name, first / (size_t)k, first % (size_t)k, a->text, second / (size_t)k,
                      second % (size_t)k, b->text, same);
}

/* ---- the JSON ---- */

/* The shape: a non-empty list of non-empty lists of strings, all of one
 * length, within the limits. Sets *n and *k. */
static int check_shape(const cJSON* root, const char* name, int* n_out, int* k_out,
                       mlxd_status* st) {
  if (!cJSON_IsArray(root) || !root->child)
    return mlxd_fail_at(
        st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
        "hostfile '%s' is not a non-empty JSON list: it is %s (expected " EXPECTED_FORMAT ")", name,
        mlxd_json_kind(root));
  long n = 0;
  const cJSON* e;
  cJSON_ArrayForEach(e, root) n++;
  if (n > MLXD_NET_HOSTFILE_MAX_RANKS)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "hostfile '%s' lists %ld ranks (expected at most %d)", name, n,
                        MLXD_NET_HOSTFILE_MAX_RANKS);
  int r = 0, k = -1;
  cJSON_ArrayForEach(e, root) {
    if (!cJSON_IsArray(e) || !e->child)
      return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "hostfile '%s': the entry of rank %d is not a non-empty list of "
                          "\"ip:port\" strings: it is %s",
                          name, r, mlxd_json_kind(e));
    int c = 0;
    const cJSON* s;
    cJSON_ArrayForEach(s, e) {
      if (!cJSON_IsString(s) || !s->valuestring)
        return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                            "hostfile '%s': the entry of rank %d is not a list of strings: item "
                            "%d is %s (expected \"ip:port\")",
                            name, r, c, mlxd_json_kind(s));
      if (++c > MLXD_NET_HOSTFILE_MAX_CONNECTIONS)
        return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                            "hostfile '%s': rank %d lists more than %d addresses (expected one "
                            "per connection, at most %d connections)",
                            name, r, MLXD_NET_HOSTFILE_MAX_CONNECTIONS,
                            MLXD_NET_HOSTFILE_MAX_CONNECTIONS);
    }
    if (k < 0) k = c;
    if (c != k)
      return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "hostfile '%s': rank %d lists %d addresses but rank 0 lists %d "
                          "(every rank needs the same number, one per connection)",
                          name, r, c, k);
    r++;
  }
  if (n * k > MLXD_NET_HOSTFILE_MAX_ADDRS)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "hostfile '%s' lists %ld ranks with %d addresses each, %ld in all "
                        "(expected at most %d addresses)",
                        name, n, k, n * k, MLXD_NET_HOSTFILE_MAX_ADDRS);
  *n_out = (int)n;
  *k_out = k;
  return 0;
}

#define MAX_VALUES (1 + MLXD_NET_HOSTFILE_MAX_RANKS + MLXD_NET_HOSTFILE_MAX_ADDRS)

/* ---- the plain form, without cJSON ---- */

/* What mlxdist-launch writes, and most files people write, is the plain form:
 * a list of lists of strings that hold only printable ASCII (no escape, no
 * quote), with JSON whitespace between the tokens. Such a file is read here
 * in two passes over its bytes, with no value allocated on its own: the first
 * checks the syntax and the shape and counts the ranks and connections, the
 * second converts every address into the one table. Anything else, and any
 * fault (a limit passed, a bad address, a syntax error), returns 1 without a
 * word: the general path (cJSON) then reads the file and names the fault. A
 * plain file within the limits is one the general path accepts with the same
 * addresses in the same order (the same conversion, addr_from_text), so both
 * give the same answer and every error comes from one place (fuzz_hostfile
 * checks it). A rank never maps libcjson for a plain file (util/cjson_rt.h),
 * and 65,536 ranks take 0.22 s here where cJSON's path took 0.40 s
 * (docs/scale.md, "Where a rank's CPU goes (branch init256)"). */

static const char* skip_space(const char* p, const char* end) {
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
  return p;
}

/* The plain string whose opening quote is at p: its bytes [*s, *s + *n), and
 * the byte after its closing quote; NULL if it is not plain or not closed. */
static const char* plain_string(const char* p, const char* end, const char** s, size_t* n) {
  const char* q = ++p;
  while (q < end && *q != '"') {
    unsigned char c = (unsigned char)*q;
    if (c < 0x20 || c > 0x7e || c == '\\') return NULL;
    q++;
  }
  if (q == end) return NULL;
  *s = p;
  *n = (size_t)(q - p);
  return q + 1;
}

/* One pass over a plain file. out == NULL: checks it and sets *n_out, *k_out;
 * otherwise converts its addresses into out->addrs (out->size, out->nconn set
 * by the first pass). 0, or 1: not a plain file within the limits. */
static int plain_pass(const char* text, size_t len, mlxd_net_hosts* out, int* n_out, int* k_out) {
  const char *p = skip_space(text, text + len), *end = text + len;
  if (p == end || *p != '[') return 1;
  int r = 0, k = -1;
  for (;;) {
    p = skip_space(p + 1, end);
    if (p == end || *p != '[' || r >= MLXD_NET_HOSTFILE_MAX_RANKS) return 1;
    int c = 0;
    for (;;) {
      p = skip_space(p + 1, end);
      const char* s = NULL;
      size_t sl = 0;
      if (p == end || *p != '"' || c >= MLXD_NET_HOSTFILE_MAX_CONNECTIONS ||
          !(p = plain_string(p, end, &s, &sl)))
        return 1;
      if (out) {
        char addr[MLXD_NET_ADDR_MAX_CHARS + 1], why[300];
        if (c >= out->nconn || sl > MLXD_NET_ADDR_MAX_CHARS) return 1;
        memcpy(addr, s, sl);
        addr[sl] = '\0';
        if (addr_from_text(addr, &out->addrs[(size_t)r * (size_t)out->nconn + (size_t)c], why,
                           sizeof why) != 0)
          return 1;
      }
      c++;
      p = skip_space(p, end);
      if (p == end || (*p != ',' && *p != ']')) return 1;
      if (*p == ']') break;
    }
    if (k < 0) k = c;
    if (c != k) return 1;
    r++;
    p = skip_space(p + 1, end);
    if (p == end || (*p != ',' && *p != ']')) return 1;
    if (*p == ']') break;
  }
  if (skip_space(p + 1, end) != end || (long)r * k > MLXD_NET_HOSTFILE_MAX_ADDRS) return 1;
  if (out && (r != out->size || k != out->nconn)) return 1;
  *n_out = r;
  *k_out = k;
  return 0;
}

/* A plain file into out (0), or 1 with out empty: the general path reads it. */
static int parse_plain(const char* text, size_t len, mlxd_net_hosts* out) {
  int n = 0, k = 0;
  if (plain_pass(text, len, NULL, &n, &k) != 0) return 1;
  out->addrs = calloc((size_t)n * (size_t)k, sizeof *out->addrs);
  if (!out->addrs) return 1; /* the general path says it */
  out->size = n;
  out->nconn = k;
  if (plain_pass(text, len, out, &n, &k) == 0) return 0;
  mlxd_net_hosts_free(out);
  return 1;
}

int mlxd_net_hostfile_parse(const char* text, size_t len, const char* name, mlxd_net_hosts* out,
                            mlxd_status* st) {
  memset(out, 0, sizeof *out);
  if (len > MLXD_NET_HOSTFILE_MAX_BYTES || parse_plain(text, len, out) != 0)
    return mlxd_net_hostfile_parse_json(text, len, name, out, st);
  int rc = check_duplicates(name, out, st);
  if (rc) mlxd_net_hosts_free(out);
  return rc;
}

int mlxd_net_hostfile_parse_json(const char* text, size_t len, const char* name,
                                 mlxd_net_hosts* out, mlxd_status* st) {
  memset(out, 0, sizeof *out);
  if (len > MLXD_NET_HOSTFILE_MAX_BYTES)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "hostfile '%s' is %zu bytes (expected at most %d)", name, len,
                        MLXD_NET_HOSTFILE_MAX_BYTES);
  size_t values = mlxd_json_value_bound(text, len);
  if (values > MAX_VALUES)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "hostfile '%s' holds up to %zu JSON values (expected at most %d ranks and "
                        "%d addresses in all)",
                        name, values, MLXD_NET_HOSTFILE_MAX_RANKS, MLXD_NET_HOSTFILE_MAX_ADDRS);
  cJSON* root = mlxd_json_parse_doc(text, len, "hostfile", name, EXPECTED_FORMAT, st);
  if (!root) return st->code;
  int n = 0, k = 0;
  int rc = check_shape(root, name, &n, &k, st);
  if (rc) goto done;
  out->addrs = calloc((size_t)n * (size_t)k, sizeof *out->addrs);
  if (!out->addrs) {
    rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory parsing hostfile '%s'",
                      name);
    goto done;
  }
  out->size = n;
  out->nconn = k;
  int r = 0;
  const cJSON* e;
  cJSON_ArrayForEach(e, root) {
    int c = 0;
    const cJSON* s;
    cJSON_ArrayForEach(s, e) {
      char why[300];
      if (addr_from_text(s->valuestring, &out->addrs[r * k + c], why, sizeof why) != 0) {
        rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "hostfile '%s': rank %d connection %d: bad address %s", name, r, c, why);
        goto done;
      }
      c++;
    }
    r++;
  }
  rc = check_duplicates(name, out, st);
done:
  cJSON_Delete(root);
  if (rc) mlxd_net_hosts_free(out);
  return rc;
}

int mlxd_net_hostfile_resolve(const char* name, mlxd_net_hosts* h, mlxd_status* st) {
  int m = h->size * h->nconn, resolved = 0;
  char last_host[MLXD_NET_ADDR_MAX_CHARS + 1] = "";
  mlxd_net_addr last = {0};
  for (int i = 0; i < m; i++) {
    mlxd_net_addr* a = &h->addrs[i];
    if (a->sa.ss_family != AF_UNSPEC) continue;
    char host[MLXD_NET_ADDR_MAX_CHARS + 1], why[300];
    long port = 0;
    int rc = split_addr(a->text, false, host, sizeof host, &port, why, sizeof why);
    if (rc == 0 && strcmp(host, last_host) != 0) { /* ranks often share a host: one lookup */
      rc = resolve_host(a->text, host, &last, why, sizeof why);
      snprintf(last_host, sizeof last_host, "%s", rc == 0 ? host : "");
    }
    if (rc != 0)
      return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "hostfile '%s': rank %d connection %d: bad address %s", name,
                          i / h->nconn, i % h->nconn, why);
    a->sa = last.sa;
    a->len = last.len;
    set_port(&a->sa, port);
    resolved++;
  }
  return resolved ? check_duplicates(name, h, st) : 0;
}

/* ---- the file ---- */

int mlxd_net_hostfile_read(const char* path, char** text, size_t* len, mlxd_status* st) {
  char subject[PATH_MAX + 16];
  snprintf(subject, sizeof subject, "hostfile '%s'", path);
  return mlxd_user_file_read(path, subject, MLXD_NET_HOSTFILE_MAX_BYTES, text, len, st);
}

int mlxd_net_hostfile_load(const char* path, mlxd_net_hosts* out, mlxd_status* st) {
  memset(out, 0, sizeof *out);
  char* text = NULL;
  size_t len = 0;
  if (mlxd_net_hostfile_read(path, &text, &len, st)) return st->code;
  int rc = mlxd_net_hostfile_parse(text, len, path, out, st);
  free(text);
  if (rc == 0 && (rc = mlxd_net_hostfile_resolve(path, out, st)) != 0) mlxd_net_hosts_free(out);
  return rc;
}

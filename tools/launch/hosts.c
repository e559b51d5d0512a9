/* mlxdist-launch: the hosts of a job across machines, from --hosts or a
 * hostfile in one of MLX's launcher's forms:
 *   [{"ssh": "h1", "ips": ["10.0.0.1"]}, ...]                       (a list)
 *   {"backend": "ring", "envs": ["K=V"], "hosts": [ ...as above... ]} (an object)
 * or lines "host", "host:SLOTS" or "host slots=SLOTS" ('#' starts a comment).
 * The ring's own format (a list of lists of "ip:port") is told apart and left
 * to hostfile.c. Pure (no files, no name lookups, no exit): fuzzed by
 * tests/fuzz/fuzz_launch_hostfile.c. Rank order is host-major, as MLX's. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"
#include "util/json_bytes.h"
#include "util/json_doc.h"

#define WHY(...) (snprintf(why, why_len, __VA_ARGS__), -1)

bool launch_host_name_ok(const char* s) {
  size_t n = strlen(s);
  if (n == 0 || n > 255 || s[0] == '-') return false;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!(isalnum(c) || strchr("._-:@[]%", c))) return false;
  }
  return true;
}

static bool is_local(const char* name) {
  return strcmp(name, "localhost") == 0 || strcmp(name, "127.0.0.1") == 0 ||
         strcmp(name, "::1") == 0;
}

static bool ip_literal(const char* s) {
  unsigned char b[16];
  return inet_pton(AF_INET, s, b) == 1 || inet_pton(AF_INET6, s, b) == 1;
}

void launch_hosts_free(launch_hosts* hs) {
  if (!hs) return;
  for (int i = 0; i < hs->n; i++) free(hs->h[i].rdma);
  free(hs->h);
  for (int i = 0; i < hs->n_envs; i++) free(hs->envs[i]);
  free(hs->envs);
  memset(hs, 0, sizeof *hs);
}

/* Append a host of slots ranks; -1 with why. */
static int add_host(launch_hosts* hs, const char* name, const char* ip, int slots,
                    const char* where, char* why, size_t why_len) {
  if (!launch_host_name_ok(name))
    return WHY(
        "%s: host '%.64s' is not a host name or address (1..255 letters, digits and "
        "'.-_:@[]%%', not starting with '-')",
        where, name);
  if (ip && !ip_literal(ip))
    return WHY("%s: \"ips\" entry '%.64s' of host '%.64s' is not an IPv4 or IPv6 address", where,
               ip, name);
  if (hs->n >= LAUNCH_MAX_RANKS || hs->ranks + slots > LAUNCH_MAX_RANKS)
    return WHY("%s: more than %d ranks; mlxdist-launch starts at most %d", where, LAUNCH_MAX_RANKS,
               LAUNCH_MAX_RANKS);
  if ((hs->n & (hs->n - 1)) == 0) { /* 0, 1, 2, 4, ...: grow */
    launch_host* nh = realloc(hs->h, (size_t)(hs->n ? 2 * hs->n : 1) * sizeof *nh);
    if (!nh) return WHY("out of memory");
    hs->h = nh;
  }
  launch_host* h = &hs->h[hs->n++];
  memset(h, 0, sizeof *h);
  snprintf(h->name, sizeof h->name, "%s", name);
  if (ip) snprintf(h->ip, sizeof h->ip, "%s", ip);
  h->slots = slots;
  h->local = is_local(name);
  hs->ranks += slots;
  return 0;
}

static void init(launch_hosts* hs) {
  memset(hs, 0, sizeof *hs);
  hs->backend = -1;
}

int launch_hosts_from_list(const char* list, int per_host, launch_hosts* out, char* why,
                           size_t why_len) {
  init(out);
  int k = per_host > 0 ? per_host : 1;
  const char* p = list;
  for (;;) {
    const char* c = strchr(p, ',');
    size_t n = c ? (size_t)(c - p) : strlen(p);
    char name[300];
    if (n == 0 || n >= sizeof name) {
      launch_hosts_free(out);
      return WHY(n == 0 ? "--hosts '%.200s' has an empty host name"
                        : "--hosts '%.200s' has a host name longer than 255 bytes",
                 list);
    }
    memcpy(name, p, n);
    name[n] = '\0';
    if (add_host(out, name, NULL, k, "--hosts", why, why_len) != 0) {
      launch_hosts_free(out);
      return -1;
    }
    if (!c) break;
    p = c + 1;
  }
  return 0;
}

/* ---- the JSON forms ---- */

static bool key_known(const char* k, const char* const* known) {
  for (; *known; known++)
    if (strcmp(k, *known) == 0) return true;
  return false;
}

/* One {"ssh": ..., "ips": [...]} entry, host number i. */
static int json_host(launch_hosts* hs, const cJSON* e, int i, int k, const char* name, char* why,
                     size_t why_len) {
  static const char* const known[] = {"ssh", "ips", "rdma", NULL};
  char where[300];
  snprintf(where, sizeof where, "hostfile '%.200s', host %d", name, i);
  if (!cJSON_IsObject(e))
    return WHY("%s: expected an object {\"ssh\": \"host\", \"ips\": [\"10.0.0.1\"]}", where);
  for (const cJSON* m = e->child; m; m = m->next)
    if (!m->string || !key_known(m->string, known))
      return WHY("%s: unknown key \"%.64s\" (known: \"ssh\", \"ips\", \"rdma\")", where,
                 m->string ? m->string : "");
  const cJSON* ssh = cJSON_GetObjectItemCaseSensitive(e, "ssh");
  const cJSON* ips = cJSON_GetObjectItemCaseSensitive(e, "ips");
  if (!cJSON_IsString(ssh) || !ssh->valuestring)
    return WHY("%s: \"ssh\" (the host's ssh name) is missing or not a string", where);
  const char* ip = NULL;
  if (ips) {
    if (!cJSON_IsArray(ips)) return WHY("%s: \"ips\" must be a list of addresses", where);
    for (const cJSON* a = ips->child; a; a = a->next) {
      if (!cJSON_IsString(a) || !a->valuestring || !ip_literal(a->valuestring))
        return WHY("%s: \"ips\" entries must be IPv4 or IPv6 addresses as strings", where);
      if (!ip) ip = a->valuestring;
    }
  }
  if (add_host(hs, ssh->valuestring, ip, k, where, why, why_len) != 0) return -1;
  /* "rdma": kept as compact JSON text, checked when the backend is jaccl (jaccl.c) */
  const cJSON* rdma = cJSON_GetObjectItemCaseSensitive(e, "rdma");
  if (rdma && !(hs->h[hs->n - 1].rdma = cJSON_PrintUnformatted(rdma))) return WHY("out of memory");
  return 0;
}

static int json_envs(launch_hosts* hs, const cJSON* envs, const char* name, char* why,
                     size_t why_len) {
  if (!cJSON_IsArray(envs))
    return WHY("hostfile '%.200s': \"envs\" must be a list of \"NAME=VALUE\" strings", name);
  int n = cJSON_GetArraySize(envs);
  hs->envs = calloc((size_t)n + 1, sizeof *hs->envs);
  if (!hs->envs) return WHY("out of memory");
  for (const cJSON* e = envs->child; e; e = e->next) {
    const char* s = cJSON_IsString(e) ? e->valuestring : NULL;
    const char* eq = s ? strchr(s, '=') : NULL;
    bool ok = eq && eq > s && (isalpha((unsigned char)s[0]) || s[0] == '_');
    for (const char* c = s; ok && c < eq; c++) ok = isalnum((unsigned char)*c) || *c == '_';
    if (!ok)
      return WHY(
          "hostfile '%.200s': \"envs\" entry %d is not \"NAME=VALUE\" (NAME of letters, "
          "digits and '_')",
          name, hs->n_envs);
    if (!(hs->envs[hs->n_envs++] = strdup(s))) return WHY("out of memory");
  }
  return 0;
}

static int json_object(launch_hosts* hs, const cJSON* root, int k, const char* name, char* why,
                       size_t why_len) {
  static const char* const known[] = {"backend", "envs", "hosts", NULL};
  for (const cJSON* m = root->child; m; m = m->next)
    if (!m->string || !key_known(m->string, known))
      return WHY(
          "hostfile '%.200s': unknown key \"%.64s\" (known: \"backend\", \"envs\", "
          "\"hosts\")",
          name, m->string ? m->string : "");
  const cJSON* b = cJSON_GetObjectItemCaseSensitive(root, "backend");
  if (b) {
    static const char* const names[] = {"ring", "mpi", "jaccl", "jaccl-ring"};
    hs->backend = -1;
    for (int i = 0; i < 4 && cJSON_IsString(b) && b->valuestring; i++)
      if (strcmp(b->valuestring, names[i]) == 0) hs->backend = i;
    if (hs->backend < 0)
      return WHY(
          "hostfile '%.200s': \"backend\" must be \"ring\", \"mpi\", \"jaccl\" or "
          "\"jaccl-ring\" (mlxdist has no other backend across hosts)",
          name);
  }
  const cJSON* e = cJSON_GetObjectItemCaseSensitive(root, "envs");
  if (e && json_envs(hs, e, name, why, why_len) != 0) return -1;
  const cJSON* h = cJSON_GetObjectItemCaseSensitive(root, "hosts");
  if (!cJSON_IsArray(h))
    return WHY(
        "hostfile '%.200s': \"hosts\" (a list of {\"ssh\": ..., \"ips\": [...]}) is "
        "missing or not a list",
        name);
  int i = 0;
  for (const cJSON* x = h->child; x; x = x->next)
    if (json_host(hs, x, i++, k, name, why, why_len) != 0) return -1;
  return 0;
}

static int from_json(launch_hosts* hs, const char* text, size_t len, const char* name, int k,
                     char* why, size_t why_len) {
  char bad[300];
  if (mlxd_json_bad_byte(text, len, NULL, bad, sizeof bad))
    return WHY("hostfile '%.200s': %s", name, bad);
  mlxd_status st;
  mlxd_status_clear(&st);
  cJSON* root = mlxd_json_parse_doc(text, len, "hostfile", name, "", &st);
  /* bad JSON, more after it, an escaped NUL: the ring's reader names it (the same check) */
  if (!root) return 1;
  int rc;
  if (cJSON_IsArray(root) && (!root->child || cJSON_IsArray(root->child)))
    rc = 1; /* the ring's list of lists: hostfile.c */
  else if (cJSON_IsArray(root)) {
    rc = 0;
    int i = 0;
    for (const cJSON* x = root->child; x && rc == 0; x = x->next)
      rc = json_host(hs, x, i++, k, name, why, why_len);
  } else if (cJSON_IsObject(root))
    rc = json_object(hs, root, k, name, why, why_len);
  else
    rc = WHY("hostfile '%.200s': expected a JSON list of hosts or an object with \"hosts\"", name);
  cJSON_Delete(root);
  return rc;
}

/* ---- the text form ---- */

/* Digits only, 1..LAUNCH_MAX_RANKS; -1 otherwise. */
static int slots_of(const char* s, size_t n) {
  if (n == 0 || n > 5) return -1; /* at most LAUNCH_MAX_RANKS: 5 digits */
  int v = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isdigit((unsigned char)s[i])) return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v >= 1 && v <= LAUNCH_MAX_RANKS ? v : -1;
}

/* One line "host", "host:K", "[v6]:K" or "host slots=K" (blanks trimmed). */
static int text_line(launch_hosts* hs, char* l, int lineno, int k, const char* name, char* why,
                     size_t why_len) {
  char where[300];
  snprintf(where, sizeof where, "hostfile '%.200s', line %d", name, lineno);
  char* host = l;
  const char* slots = NULL;
  char* sp = l + strcspn(l, " \t");
  if (*sp) {
    *sp++ = '\0';
    sp += strspn(sp, " \t");
    if (strncmp(sp, "slots=", 6) != 0)
      return WHY("%s: expected \"host\", \"host:SLOTS\" or \"host slots=SLOTS\", got '%.64s'",
                 where, sp);
    slots = sp + 6;
  } else if (host[0] == '[') { /* [v6] or [v6]:K */
    char* rb = strchr(host, ']');
    if (!rb) return WHY("%s: '%.64s' lacks its ']'", where, host);
    *rb = '\0';
    if (rb[1] == ':')
      slots = rb + 2;
    else if (rb[1])
      return WHY("%s: unexpected text after ']'", where);
    host++;
  } else {
    char* c = strrchr(host, ':');
    if (c && strchr(host, ':') == c) { /* exactly one ':': host:K */
      *c = '\0';
      slots = c + 1;
    }
  }
  int n = k;
  if (slots && (n = slots_of(slots, strlen(slots))) < 0)
    return WHY("%s: the slots of host '%.64s' must be an integer from 1 to %d, got '%.16s'", where,
               host, LAUNCH_MAX_RANKS, slots);
  return add_host(hs, host, NULL, n, where, why, why_len);
}

static int from_text(launch_hosts* hs, const char* text, size_t len, const char* name, int k,
                     char* why, size_t why_len) {
  size_t at = 0;
  int lineno = 0;
  while (at < len) {
    const char* s = text + at;
    const char* nl = memchr(s, '\n', len - at);
    size_t n = nl ? (size_t)(nl - s) : len - at;
    at += n + (nl != NULL);
    lineno++;
    if (memchr(s, '\0', n)) return WHY("hostfile '%.200s', line %d: a NUL byte", name, lineno);
    const char* hash = memchr(s, '#', n);
    if (hash) n = (size_t)(hash - s);
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    if (n == 0) continue;
    if (n > 512) return WHY("hostfile '%.200s', line %d: longer than 512 bytes", name, lineno);
    char l[520];
    memcpy(l, s, n);
    l[n] = '\0';
    if (text_line(hs, l, lineno, k, name, why, why_len) != 0) return -1;
  }
  return 0;
}

int launch_hosts_from_file(const char* text, size_t len, const char* name, int per_host,
                           launch_hosts* out, char* why, size_t why_len) {
  init(out);
  int k = per_host > 0 ? per_host : 1;
  size_t i = 0;
  while (i < len && isspace((unsigned char)text[i])) i++;
  int rc;
  if (i == len) return 1; /* empty: the ring's reader says so */
  if (text[i] == '[' || text[i] == '{')
    rc = from_json(out, text, len, name, k, why, why_len);
  else
    rc = from_text(out, text, len, name, k, why, why_len);
  if (rc == 0 && out->n == 0) rc = WHY("hostfile '%.200s' lists no host", name);
  if (rc != 0) launch_hosts_free(out);
  return rc;
}

int launch_hosts_of_rank(const launch_hosts* hs, int r) {
  for (int i = 0; i < hs->n; i++) {
    if (r < hs->h[i].slots) return i;
    r -= hs->h[i].slots;
  }
  return -1;
}

bool launch_hosts_all_local(const launch_hosts* hs) {
  for (int i = 0; i < hs->n; i++)
    if (!hs->h[i].local) return false;
  return true;
}

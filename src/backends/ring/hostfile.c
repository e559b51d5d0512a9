/* The ring hostfile (MLX_HOSTFILE): a JSON list with one entry per rank, each
 * a list of "ip:port" strings; entry r, string c is the address rank r
 * listens on for connection c. Every rank must list the same number of
 * addresses. Parsed with cJSON. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/ring/ring_internal.h"

void mlxd_ring_hosts_free(mlxd_ring_hosts* h) {
  free(h->addrs);
  h->addrs = NULL;
  h->size = h->nconn = 0;
}

void mlxd_ring_format_addr(const struct sockaddr* sa, char* buf, size_t n) {
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

int mlxd_ring_parse_addr(const char* s, bool allow_port0, mlxd_ring_addr* out, char* why,
                         size_t why_len) {
  memset(out, 0, sizeof *out);
  snprintf(out->text, sizeof out->text, "%s", s);
  const char* colon = strrchr(s, ':');
  if (!colon) {
    snprintf(why, why_len, "'%s' has no ':port' (expected \"ip:port\")", s);
    return -1;
  }
  char host[256];
  size_t hl = (size_t)(colon - s);
  if (hl == 0 || hl >= sizeof host) {
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
  char* end = NULL;
  errno = 0;
  long port = strtol(ps, &end, 10);
  if (*ps == '\0' || *end != '\0' || errno || port < (allow_port0 ? 0 : 1) || port > 65535) {
    snprintf(why, why_len, "'%s' has an invalid port '%s' (expected an integer in [1, 65535])", s,
             ps);
    return -1;
  }
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0 || !res) {
    snprintf(why, why_len, "'%s': cannot resolve host '%s' (%s)", s, host, gai_strerror(rc));
    return -1;
  }
  memcpy(&out->sa, res->ai_addr, res->ai_addrlen);
  out->len = res->ai_addrlen;
  freeaddrinfo(res);
  if (out->sa.ss_family == AF_INET)
    ((struct sockaddr_in*)(void*)&out->sa)->sin_port = htons((uint16_t)port);
  else if (out->sa.ss_family == AF_INET6)
    ((struct sockaddr_in6*)(void*)&out->sa)->sin6_port = htons((uint16_t)port);
  else {
    snprintf(why, why_len, "'%s': host '%s' is not an IPv4/IPv6 address", s, host);
    return -1;
  }
  return 0;
}

static char* read_file(const char* path, mlxd_status* st) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    int e = errno;
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP, "cannot read hostfile '%s' (MLX_HOSTFILE)",
                 path);
    mlxd_status_set_sys(st, "fopen", e);
    return NULL;
  }
  size_t cap = 4096, len = 0;
  char* buf = malloc(cap);
  while (buf) {
    size_t n = fread(buf + len, 1, cap - len - 1, f);
    len += n;
    if (n == 0) break;
    if (len + 1 == cap) {
      char* nb = realloc(buf, cap * 2);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
  }
  int err = ferror(f) ? errno : 0;
  fclose(f);
  if (!buf) {
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory reading hostfile '%s'",
                 path);
    return NULL;
  }
  if (err) {
    free(buf);
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP, "cannot read hostfile '%s' (MLX_HOSTFILE)",
                 path);
    mlxd_status_set_sys(st, "fread", err);
    return NULL;
  }
  buf[len] = '\0';
  return buf;
}

int mlxd_ring_hostfile_load(const char* path, mlxd_ring_hosts* out, mlxd_status* st) {
  memset(out, 0, sizeof *out);
  char* text = read_file(path, st);
  if (!text) return st->code;
  cJSON* root = cJSON_Parse(text);
  free(text);
  int rc = 0;
  if (!root) {
    rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                      "hostfile '%s' is not valid JSON (expected a list with one list of "
                      "\"ip:port\" strings per rank)",
                      path);
    goto done;
  }
  if (!cJSON_IsArray(root) || cJSON_GetArraySize(root) == 0) {
    rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                      "hostfile '%s' is not a non-empty JSON list (expected one list of "
                      "\"ip:port\" strings per rank)",
                      path);
    goto done;
  }
  int n = cJSON_GetArraySize(root);
  int k = -1;
  for (int r = 0; r < n; r++) {
    cJSON* e = cJSON_GetArrayItem(root, r);
    if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) == 0) {
      rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "hostfile '%s': the entry of rank %d is not a non-empty list of "
                        "\"ip:port\" strings",
                        path, r);
      goto done;
    }
    int kr = cJSON_GetArraySize(e);
    if (k < 0) k = kr;
    if (kr != k) {
      rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "hostfile '%s': rank %d lists %d addresses but rank 0 lists %d "
                        "(every rank needs the same number, one per connection)",
                        path, r, kr, k);
      goto done;
    }
  }
  out->addrs = calloc((size_t)n * (size_t)k, sizeof *out->addrs);
  if (!out->addrs) {
    rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory parsing hostfile '%s'",
                      path);
    goto done;
  }
  out->size = n;
  out->nconn = k;
  for (int r = 0; r < n; r++) {
    cJSON* e = cJSON_GetArrayItem(root, r);
    for (int c = 0; c < k; c++) {
      cJSON* s = cJSON_GetArrayItem(e, c);
      if (!cJSON_IsString(s) || !s->valuestring) {
        rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "hostfile '%s': the entry of rank %d is not a list of strings "
                          "(item %d is not a string; expected \"ip:port\")",
                          path, r, c);
        goto done;
      }
      char why[300];
      if (mlxd_ring_parse_addr(s->valuestring, false, &out->addrs[r * k + c], why, sizeof why) !=
          0) {
        rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "hostfile '%s': rank %d: bad address %s", path, r, why);
        goto done;
      }
    }
  }
done:
  cJSON_Delete(root);
  if (rc) mlxd_ring_hosts_free(out);
  return rc;
}

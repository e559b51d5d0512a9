/* MLXDIST_* names in the environment that mlxdist does not know: found,
 * matched to the nearest known name, warned about once per process or, under
 * MLXDIST_STRICT_ENV=1, refused (env_names.h). */
#include "util/env_names.h"

#include <ctype.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "util/env.h"
#include "util/tunables.h"

extern char** environ;

#define PREFIX "MLXDIST_"
#define PREFIX_LEN (sizeof PREFIX - 1)
#define MAX_NAME 128 /* longer names are matched to nothing (the distance is quadratic) */

/* Read outside the tunables' table, by the project's own scripts, examples
 * and tests (never by the library): known, so never warned about, but not
 * offered as a suggestion. */
static const char* const k_other_names[] = {
    "MLXDIST_FUZZ_SECONDS",  /* scripts/test.sh, scripts/fuzz.sh */
    "MLXDIST_SETUP",         /* scripts/test.sh */
    "MLXDIST_SKIP_VALGRIND", /* tests/install/check_install.sh */
    "MLXDIST_EXAMPLE_KV",    /* examples/bootstrap/tcp_kv.c */
};
#define TEST_PREFIX "MLXDIST_TEST_" /* the test suite's own (tests/) */

static atomic_bool g_warned;

static bool same(const char* name, size_t len, const char* known) {
  return strlen(known) == len && strncmp(known, name, len) == 0;
}

bool mlxd_env_name_known(const char* name, size_t len) {
  if (mlxd_tunable_find(name, len) >= 0) return true;
  for (size_t i = 0; i < sizeof k_other_names / sizeof k_other_names[0]; i++)
    if (same(name, len, k_other_names[i])) return true;
  return len > sizeof TEST_PREFIX - 1 && strncmp(name, TEST_PREFIX, sizeof TEST_PREFIX - 1) == 0;
}

/* Damerau-Levenshtein distance (optimal string alignment: a swap of two
 * neighbours is one edit), letters without case; n, m at most MAX_NAME.
 * Three rows: the one being filled and the two before it. */
static size_t distance(const char* a, size_t n, const char* b, size_t m) {
  size_t rows[3][MAX_NAME + 1];
  size_t *pp = rows[0], *p = rows[1], *c = rows[2];
  for (size_t j = 0; j <= m; j++) p[j] = j;
  for (size_t i = 1; i <= n; i++) {
    c[0] = i;
    int ca = toupper((unsigned char)a[i - 1]);
    for (size_t j = 1; j <= m; j++) {
      int cb = toupper((unsigned char)b[j - 1]);
      size_t best = p[j - 1] + (ca != cb);
      if (p[j] + 1 < best) best = p[j] + 1;
      if (c[j - 1] + 1 < best) best = c[j - 1] + 1;
      if (i > 1 && j > 1 && ca == toupper((unsigned char)b[j - 2]) &&
          toupper((unsigned char)a[i - 2]) == cb && pp[j - 2] + 1 < best)
        best = pp[j - 2] + 1;
      c[j] = best;
    }
    size_t* t = pp;
    pp = p, p = c, c = t;
  }
  return p[m];
}

const char* mlxd_env_name_closest(const char* name, size_t len) {
  if (len < PREFIX_LEN || strncmp(name, PREFIX, PREFIX_LEN) != 0 || len > MAX_NAME) return NULL;
  const char* s = name + PREFIX_LEN;
  size_t n = len - PREFIX_LEN;
  size_t limit = n / 4 > 2 ? n / 4 : 2, best_d = limit + 1;
  const char* best = NULL;
  for (int t = 0; t < MLXD_T_COUNT; t++) {
    const char* k = mlxd_tunable_env_name((mlxd_tunable)t);
    size_t kl = strlen(k);
    if (kl > MAX_NAME) continue;
    size_t dist = distance(s, n, k + PREFIX_LEN, kl - PREFIX_LEN);
    if (dist > limit && n >= 4 && strncasecmp(k + PREFIX_LEN, s, n) == 0)
      dist = limit; /* the start of a known name (MLXDIST_STRICT): near enough */
    if (dist < best_d) best_d = dist, best = k;
  }
  return best;
}

/* Whether the len bytes at name are one of the ':'-separated names of list. */
static bool listed(const char* list, const char* name, size_t len) {
  while (list && *list) {
    size_t k = strcspn(list, ":");
    if (k == len && strncmp(list, name, len) == 0) return true;
    list += k + (list[k] == ':');
  }
  return false;
}

/* A name as it goes into a message: letters, digits and '_' as they are,
 * any other byte as \xNN (the environment's bytes are not the terminal's
 * business), cut after 100 bytes. */
static void add_name(mlxd_text* t, const char* name, size_t len) {
  size_t shown = len > 100 ? 100 : len;
  for (size_t i = 0; i < shown; i++) {
    unsigned char c = (unsigned char)name[i];
    if (isalnum(c) || c == '_')
      mlxd_text_add(t, "%c", c);
    else
      mlxd_text_add(t, "\\x%02x", c);
  }
  if (shown < len) mlxd_text_add(t, "...");
}

int mlxd_env_names_unknown(const char* const* env, int n, bool skip_reported, mlxd_text* lines,
                           const char* sep, mlxd_text* names) {
  const char* reported = skip_reported ? mlxd_env_get("MLXDIST_ENV_REPORTED") : NULL;
  int count = 0;
  for (int i = 0; n < 0 ? env[i] != NULL : i < n; i++) {
    const char* e = env[i];
    if (!e || strncmp(e, PREFIX, PREFIX_LEN) != 0) continue;
    const char* eq = strchr(e, '=');
    if (!eq) continue;
    size_t len = (size_t)(eq - e);
    if (mlxd_env_name_known(e, len) || listed(reported, e, len)) continue;
    if (names && listed(names->buf, e, len)) continue; /* told already (another list) */
    const char* near = mlxd_env_name_closest(e, len);
    if (lines) {
      if (lines->used) mlxd_text_add(lines, "%s", sep);
      add_name(lines, e, len);
      mlxd_text_add(lines, " is not a variable mlxdist knows ");
      if (near)
        mlxd_text_add(lines, "(did you mean %s?)", near);
      else
        mlxd_text_add(lines, "(no close name)");
    }
    if (names) mlxd_text_add(names, "%s%.*s", names->used ? ":" : "", (int)len, e);
    count++;
  }
  return count;
}

int mlxd_env_names_check(mlxd_status* st) {
  const char* const* env = (const char* const*)environ;
  if (!env) return 0;
  if (mlxd_tunable_long(MLXD_T_STRICT_ENV) == 1) {
    char msg[MLXD_MSG_MAX - 200];
    mlxd_text t = {msg, sizeof msg, 0};
    msg[0] = '\0';
    int k = mlxd_env_names_unknown(env, -1, false, &t, "; ", NULL);
    if (k == 0) return 0;
    return mlxd_fail(st, MLXD_EINVAL,
                     "%s; MLXDIST_STRICT_ENV=1 makes an unknown MLXDIST_* name an error (fix or "
                     "unset the variable%s)",
                     msg, k > 1 ? "s" : "");
  }
  if (atomic_load(&g_warned)) return 0;
  char msg[4096];
  mlxd_text t = {msg, sizeof msg, 0};
  msg[0] = '\0';
  int k = mlxd_env_names_unknown(env, -1, true, &t, "; it is ignored\nmlxdist: warning: ", NULL);
  if (k == 0 || atomic_exchange(&g_warned, true)) return 0;
  char out[4096 + 64];
  int w = snprintf(out, sizeof out, "mlxdist: warning: %s; it is ignored\n", msg);
  if (w > 0) {
    size_t len = (size_t)w < sizeof out ? (size_t)w : sizeof out - 1;
    ssize_t r = write(2, out, len);
    (void)r;
  }
  return 0;
}

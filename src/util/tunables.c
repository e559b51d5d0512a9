/* MLXDIST_* tunables: raw values, parsed numbers, documentation.
 * Values are read from the environment on every call (so a program may set
 * them before it initialises a backend); an unparsable value gives the
 * default and one warning per variable per process. */
#include "util/tunables.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct tunable_info {
  const char* env;
  const char* def;
  const char* doc;
} tunable_info;

static const tunable_info k_tunables[MLXD_T_COUNT] = {
#define MLXD_TUNABLE_INFO(id, env, def, doc) [MLXD_T_##id] = {env, def, doc},
    MLXD_TUNABLES(MLXD_TUNABLE_INFO)
#undef MLXD_TUNABLE_INFO
};

static atomic_bool g_warned[MLXD_T_COUNT];

static int valid(mlxd_tunable t) { return (int)t >= 0 && (int)t < MLXD_T_COUNT; }

const char* mlxd_tunable_env_name(mlxd_tunable t) { return valid(t) ? k_tunables[t].env : ""; }
const char* mlxd_tunable_default(mlxd_tunable t) { return valid(t) ? k_tunables[t].def : ""; }
const char* mlxd_tunable_doc(mlxd_tunable t) { return valid(t) ? k_tunables[t].doc : ""; }

const char* mlxd_tunable_str(mlxd_tunable t) {
  if (!valid(t)) return "";
  const char* v = getenv(k_tunables[t].env);
  return v && *v ? v : k_tunables[t].def;
}

static int only_space(const char* p) {
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  return *p == '\0';
}

static int parse_double(const char* s, double* out) {
  char* end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || !only_space(end) || errno == ERANGE || !isfinite(v)) return -1;
  *out = v;
  return 0;
}

static int parse_long(const char* s, long* out) {
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || !only_space(end) || errno == ERANGE) return -1;
  *out = v;
  return 0;
}

static void warn_once(mlxd_tunable t, const char* value, const char* what) {
  bool expected = false;
  if (atomic_compare_exchange_strong(&g_warned[t], &expected, true))
    fprintf(stderr, "mlxdist: warning: %s='%s' is not %s; using the default %s\n",
            k_tunables[t].env, value, what, k_tunables[t].def);
}

double mlxd_tunable_double(mlxd_tunable t) {
  if (!valid(t)) return 0.0;
  const char* s = mlxd_tunable_str(t);
  double v = 0.0;
  if (parse_double(s, &v) == 0) return v;
  if (s != k_tunables[t].def) warn_once(t, s, "a number");
  v = 0.0;
  parse_double(k_tunables[t].def, &v);
  return v;
}

long mlxd_tunable_long(mlxd_tunable t) {
  if (!valid(t)) return 0;
  const char* s = mlxd_tunable_str(t);
  long v = 0;
  if (parse_long(s, &v) == 0) return v;
  if (s != k_tunables[t].def) warn_once(t, s, "an integer");
  v = 0;
  parse_long(k_tunables[t].def, &v);
  return v;
}

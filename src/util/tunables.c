/* MLXDIST_* tunables: raw values, validation, parsed numbers, documentation.
 * Values are read on every call through util/env.h (so a program may set
 * them before it initialises a backend; the library's own threads read the
 * snapshot that a caller's thread last read). What a value must be is declared
 * with the variable (tunables.h); mlxd_tunable_parse is the one place that
 * decides whether a value is valid. */
#include "util/tunables.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/env.h"
#include "util/text.h"

typedef struct tunable_info {
  const char* env;
  const char* def;
  mlxd_tunable_spec spec;
  const char* doc;
} tunable_info;

static const tunable_info k_tunables[MLXD_T_COUNT] = {
#define MLXD_TUNABLE_INFO(id, env, def, spec, doc) [MLXD_T_##id] = {env, def, spec, doc},
    MLXD_TUNABLES(MLXD_TUNABLE_INFO)
#undef MLXD_TUNABLE_INFO
};

static atomic_bool g_warned[MLXD_T_COUNT];

static int valid(mlxd_tunable t) { return (int)t >= 0 && (int)t < MLXD_T_COUNT; }

const char* mlxd_tunable_env_name(mlxd_tunable t) { return valid(t) ? k_tunables[t].env : ""; }
const char* mlxd_tunable_default(mlxd_tunable t) { return valid(t) ? k_tunables[t].def : ""; }
const char* mlxd_tunable_doc(mlxd_tunable t) { return valid(t) ? k_tunables[t].doc : ""; }
const mlxd_tunable_spec* mlxd_tunable_spec_of(mlxd_tunable t) {
  return valid(t) ? &k_tunables[t].spec : NULL;
}

int mlxd_tunable_find(const char* name, size_t len) {
  for (int i = 0; i < MLXD_T_COUNT; i++)
    if (strlen(k_tunables[i].env) == len && strncmp(k_tunables[i].env, name, len) == 0) return i;
  return -1;
}

const char* mlxd_tunable_str(mlxd_tunable t) {
  if (!valid(t)) return "";
  const char* v = mlxd_env_tunable(t);
  return v && *v ? v : k_tunables[t].def;
}

/* ---- what is expected, in words ---- */

/* A bound as people write it: 86400, 0.001, 1099511627776. */
static void fmt_bound(mlxd_text* t, double v) {
  if (v == floor(v) && fabs(v) < 1e15)
    mlxd_text_add(t, "%.0f", v);
  else
    mlxd_text_add(t, "%g", v);
}

/* "auto|tcp|shm" as "auto, tcp or shm". */
static void fmt_choices(mlxd_text* t, const char* words) {
  const char* p = words;
  while (*p) {
    const char* bar = strchr(p, '|');
    size_t n = bar ? (size_t)(bar - p) : strlen(p);
    if (p != words) mlxd_text_add(t, "%s", bar ? ", " : " or ");
    mlxd_text_add(t, "%.*s", (int)n, p);
    p += n + (bar ? 1 : 0);
  }
}

const char* mlxd_tunable_expected(mlxd_tunable t, char* buf, size_t len) {
  mlxd_text o = {buf, len, 0};
  if (len) buf[0] = '\0';
  if (!valid(t)) return buf;
  const mlxd_tunable_spec* s = &k_tunables[t].spec;
  switch (s->kind) {
    case MLXD_TK_NUMBER:
    case MLXD_TK_INTEGER:
      mlxd_text_add(&o, "%s, %s from ", s->what,
                    s->kind == MLXD_TK_NUMBER ? "a number" : "an integer");
      fmt_bound(&o, s->lo);
      mlxd_text_add(&o, " to ");
      fmt_bound(&o, s->hi);
      break;
    case MLXD_TK_FLAG: mlxd_text_add(&o, "0 or 1"); break;
    case MLXD_TK_CHOICE: fmt_choices(&o, s->what); break;
    case MLXD_TK_HOST:
      if (s->what && *s->what) /* MLXD_TK_WORD: what says what it is */
        mlxd_text_add(&o,
                      "empty, or %s (letters, digits and . - : [ ] %% _, at most %.0f "
                      "characters)",
                      s->what, s->hi);
      else
        mlxd_text_add(&o,
                      "empty, or an IP address or host name of this host (letters, digits and "
                      ". - : [ ] %%, at most %.0f characters)",
                      s->hi);
      break;
    case MLXD_TK_PATHS:
      mlxd_text_add(&o,
                    "empty, or directories separated by ':' (no control characters, at most "
                    "%.0f characters)",
                    s->hi);
      break;
    case MLXD_TK_HEX: mlxd_text_add(&o, "empty, or exactly %.0f hex digits", s->hi); break;
    case MLXD_TK_FILE:
      mlxd_text_add(&o, "empty, or a file's path (no control characters, at most %.0f characters)",
                    s->hi);
      break;
  }
  return buf;
}

/* ---- parsing ---- */

static bool blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool digit(char c) { return c >= '0' && c <= '9'; }

/* The value as it goes into a message: quoted by the caller, control and
 * non-ASCII bytes as \xNN, cut after 64 characters. */
static void fmt_value(mlxd_text* t, const char* v) {
  size_t i = 0;
  for (; v[i] && i < 64; i++) {
    unsigned char c = (unsigned char)v[i];
    if (c < 0x20 || c >= 0x7f)
      mlxd_text_add(t, "\\x%02x", c);
    else
      mlxd_text_add(t, "%c", c);
  }
  if (v[i]) mlxd_text_add(t, "...");
}

static int reject(mlxd_tunable t, const char* text, const char* problem, char* why,
                  size_t why_len) {
  if (!why || !why_len) return -1;
  mlxd_text o = {why, why_len, 0};
  why[0] = '\0';
  char exp[256];
  mlxd_text_add(&o, "%s='", k_tunables[t].env);
  fmt_value(&o, text);
  mlxd_text_add(&o, "' %s; expected %s", problem, mlxd_tunable_expected(t, exp, sizeof exp));
  return -1;
}

/* A decimal number: [+-]digits[.digits][(e|E)[+-]digits], or the same with
 * only the fraction ("0.5", ".5"); integer_only: [+-]digits. Returns the end
 * of the syntax, or NULL. */
static const char* scan_decimal(const char* p, bool integer_only) {
  if (*p == '+' || *p == '-') p++;
  int nd = 0;
  while (digit(*p)) p++, nd++;
  if (integer_only) return nd ? p : NULL;
  if (*p == '.') {
    p++;
    while (digit(*p)) p++, nd++;
  }
  if (!nd) return NULL;
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p == '+' || *p == '-') p++;
    if (!digit(*p)) return NULL;
    while (digit(*p)) p++;
  }
  return p;
}

static int parse_number(mlxd_tunable t, const char* text, double* out, char* why, size_t wl) {
  const mlxd_tunable_spec* s = &k_tunables[t].spec;
  bool integer = s->kind != MLXD_TK_NUMBER;
  const char* p = text;
  while (blank(*p)) p++;
  if (!*p) return reject(t, text, "is empty", why, wl);
  const char* end = scan_decimal(p, integer);
  const char* rest = end;
  if (rest)
    while (blank(*rest)) rest++;
  if (!end || *rest) {
    const char* real = integer ? scan_decimal(p, false) : NULL;
    if (real)
      while (blank(*real)) real++;
    if (real && !*real) return reject(t, text, "is not an integer", why, wl); /* "1.5", "1e3" */
    return reject(t, text, integer ? "is not a decimal integer" : "is not a decimal number", why,
                  wl);
  }
  double v;
  errno = 0;
  if (integer) {
    long long x = strtoll(p, NULL, 10);
    if (errno == ERANGE) return reject(t, text, "is out of range", why, wl);
    v = (double)x;
  } else {
    v = strtod(p, NULL);
    if (errno == ERANGE && fabs(v) > 1) return reject(t, text, "is out of range", why, wl);
    if (!isfinite(v)) return reject(t, text, "is not a finite number", why, wl);
  }
  if (!(v >= s->lo && v <= s->hi)) return reject(t, text, "is out of range", why, wl);
  if (out) *out = v;
  return 0;
}

static int parse_choice(mlxd_tunable t, const char* text, double* out, char* why, size_t wl) {
  const char* p = k_tunables[t].spec.what;
  for (int i = 0; *p; i++) {
    const char* bar = strchr(p, '|');
    size_t n = bar ? (size_t)(bar - p) : strlen(p);
    if (strlen(text) == n && strncasecmp(text, p, n) == 0) {
      if (out) *out = i;
      return 0;
    }
    p += n + (bar ? 1 : 0);
  }
  return reject(t, text, "is not valid", why, wl);
}

/* HOST, PATHS: length and characters only (an address is resolved where it
 * is used, e.g. bootstrap.c, with its own message). */
static int parse_text(mlxd_tunable t, const char* text, double* out, char* why, size_t wl) {
  const mlxd_tunable_spec* s = &k_tunables[t].spec;
  size_t n = strlen(text);
  if ((double)n > s->hi) {
    char problem[64];
    snprintf(problem, sizeof problem, "is too long (%zu characters)", n);
    return reject(t, text, problem, why, wl);
  }
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)text[i];
    bool ok;
    if (s->kind == MLXD_TK_HOST)
      ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || digit((char)c) ||
           strchr(".-:[]%_", c) != NULL;
    else
      ok = c >= 0x20 && c != 0x7f;
    if (!ok) {
      char problem[80];
      if (c >= 0x21 && c < 0x7f)
        snprintf(problem, sizeof problem, "has the character '%c' at position %zu", c, i + 1);
      else
        snprintf(problem, sizeof problem, "has the byte 0x%02x at position %zu", c, i + 1);
      return reject(t, text, problem, why, wl);
    }
  }
  if (out) *out = 0;
  return 0;
}

/* HEX: empty, or exactly hi hex digits. */
static int parse_hex(mlxd_tunable t, const char* text, double* out, char* why, size_t wl) {
  size_t n = strlen(text);
  if (n == 0) {
    if (out) *out = 0;
    return 0;
  }
  if ((double)n != k_tunables[t].spec.hi) {
    char problem[64];
    snprintf(problem, sizeof problem, "has %zu characters", n);
    return reject(t, text, problem, why, wl);
  }
  for (size_t i = 0; i < n; i++)
    if (!isxdigit((unsigned char)text[i])) {
      char problem[64];
      snprintf(problem, sizeof problem, "is not hexadecimal at position %zu", i + 1);
      return reject(t, text, problem, why, wl);
    }
  if (out) *out = 0;
  return 0;
}

int mlxd_tunable_parse(mlxd_tunable t, const char* text, double* out, char* why, size_t why_len) {
  if (why && why_len) why[0] = '\0';
  if (!valid(t)) {
    if (why && why_len) snprintf(why, why_len, "unknown tunable %d", (int)t);
    return -1;
  }
  if (!text) text = "";
  switch (k_tunables[t].spec.kind) {
    case MLXD_TK_NUMBER:
    case MLXD_TK_INTEGER: return parse_number(t, text, out, why, why_len);
    case MLXD_TK_FLAG: {
      const char* p = text;
      while (blank(*p)) p++;
      const char* e = p;
      if (*e == '0' || *e == '1') e++;
      while (e > p && blank(*e)) e++;
      if (e == p || *e) return reject(t, text, "is not 0 or 1", why, why_len);
      if (out) *out = *p - '0';
      return 0;
    }
    case MLXD_TK_CHOICE: return parse_choice(t, text, out, why, why_len);
    case MLXD_TK_HOST:
    case MLXD_TK_PATHS:
    case MLXD_TK_FILE: return parse_text(t, text, out, why, why_len);
    case MLXD_TK_HEX: return parse_hex(t, text, out, why, why_len);
  }
  return reject(t, text, "has no known kind", why, why_len);
}

int mlxd_tunables_check(mlxd_status* st) {
  char msg[MLXD_MSG_MAX];
  mlxd_text o = {msg, sizeof msg, 0};
  msg[0] = '\0';
  int bad = 0;
  for (int i = 0; i < MLXD_T_COUNT; i++) {
    const char* v = mlxd_env_tunable(i);
    if (!v || !*v) continue; /* unset or empty: the default */
    char why[400];
    if (mlxd_tunable_parse((mlxd_tunable)i, v, NULL, why, sizeof why) != 0) {
      mlxd_text_add(&o, "%s%s", bad ? ". " : "", why);
      bad++;
    }
  }
  if (!bad) return 0;
  return mlxd_fail(st, MLXD_EINVAL, "%s (fix or unset the variable%s)", msg, bad > 1 ? "s" : "");
}

/* ---- the readers ---- */

static void warn_once(mlxd_tunable t, const char* why) {
  bool expected = false;
  if (atomic_compare_exchange_strong(&g_warned[t], &expected, true))
    fprintf(stderr, "mlxdist: warning: %s; using the default %s\n", why, k_tunables[t].def);
}

/* s (t's raw value, or the default) as a number: t's default when s is not valid. */
static double parsed(mlxd_tunable t, const char* s) {
  double v = 0.0;
  char why[400];
  if (mlxd_tunable_parse(t, s, &v, why, sizeof why) == 0) return v;
  warn_once(t, why);
  v = 0.0;
  mlxd_tunable_parse(t, k_tunables[t].def, &v, NULL, 0);
  return v;
}

double mlxd_tunable_double(mlxd_tunable t) {
  return valid(t) ? parsed(t, mlxd_tunable_str(t)) : 0.0;
}

double mlxd_tunable_kept_double(mlxd_tunable t) {
  if (!valid(t)) return 0.0;
  const char* v = mlxd_env_tunable_kept(t);
  return parsed(t, v && *v ? v : k_tunables[t].def);
}

long mlxd_tunable_long(mlxd_tunable t) {
  double v = mlxd_tunable_double(t);
  if (v >= (double)LONG_MAX) return LONG_MAX;
  if (v <= (double)LONG_MIN) return LONG_MIN;
  return (long)v;
}

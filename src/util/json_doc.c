/* One JSON document from a user's file, every fault named (json_doc.h). */
#include "util/json_doc.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>

#include "util/cjson_rt.h"
#include "util/json_bytes.h"

/* What a lexer sees over text: the values' bound, the brackets still open at
 * the end, whether the end is inside a string, and the first escaped NUL. */
typedef struct json_scan {
  size_t values;
  long open;
  bool in_string;
  size_t nul_at; /* offset of the first "\u0000" in a string; len if none */
} json_scan;

static json_scan scan(const char* t, size_t len) {
  json_scan s = {1, 0, false, len};
  for (size_t i = 0; i < len; i++) {
    char c = t[i];
    if (s.in_string) {
      if (c == '\\') {
        if (s.nul_at == len && i + 5 < len && t[i + 1] == 'u' && t[i + 2] == '0' &&
            t[i + 3] == '0' && t[i + 4] == '0' && t[i + 5] == '0')
          s.nul_at = i;
        i++; /* the escaped byte */
      } else if (c == '"') {
        s.in_string = false;
      }
    } else if (c == '"') {
      s.in_string = true;
    } else if (c == '[' || c == '{') {
      s.values++, s.open++;
    } else if (c == ']' || c == '}') {
      s.open--;
    } else if (c == ',') {
      s.values++;
    }
  }
  return s;
}

size_t mlxd_json_value_bound(const char* text, size_t len) { return scan(text, len).values; }

const char* mlxd_json_kind(const cJSON* v) {
  /* v came from some cJSON; the table may not be loaded yet if it was not
   * this file's parser (the launcher links cJSON itself) */
  mlxd_status st = {0};
  if (!v || mlxd_cjson_load("a JSON document", &st) != 0) return "a value";
  if (cJSON_IsArray(v)) return cJSON_GetArraySize(v) ? "a list" : "an empty list";
  if (cJSON_IsObject(v)) return "an object";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNull(v)) return "null";
  return "a value of unknown type";
}

/* "line L, column C (at 'text...')" for offset off of text. */
static void where(const char* text, size_t len, size_t off, char* buf, size_t n) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < off && i < len; i++) {
    if (text[i] == '\n')
      line++, col = 1;
    else
      col++;
  }
  char near[80];
  size_t o = 0;
  for (size_t i = off; i < len && i < off + 16 && o + 5 < sizeof near; i++) {
    unsigned char c = (unsigned char)text[i];
    o += (size_t)snprintf(near + o, sizeof near - o, c >= 0x20 && c < 0x7f ? "%c" : "\\x%02x", c);
  }
  near[o] = '\0';
  if (off >= len)
    snprintf(buf, n, "line %zu, column %zu (at the end of the file)", line, col);
  else
    snprintf(buf, n, "line %zu, column %zu (at '%s%s')", line, col, near,
             len - off > 16 ? "..." : "");
}

static bool json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

cJSON* mlxd_json_parse_doc(const char* text, size_t len, const char* what, const char* name,
                           const char* expected, mlxd_status* st) {
  char why[300];
  if (mlxd_json_bad_byte(text, len, NULL, why, sizeof why)) {
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP, "%s '%s': %s", what, name, why);
    return NULL;
  }
  json_scan sh = scan(text, len);
  char at[160];
  if (sh.nul_at < len) {
    where(text, len, sh.nul_at, at, sizeof at);
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                 "%s '%s': an escaped NUL (\\u0000) in a string at %s (no value here may hold "
                 "one; expected %s)",
                 what, name, at, expected);
    return NULL;
  }
  size_t i = 0;
  while (i < len && json_space(text[i])) i++;
  if (i == len) {
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP, "%s '%s' is empty (expected %s)", what,
                 name, expected);
    return NULL;
  }
  char subject[PATH_MAX + 64];
  snprintf(subject, sizeof subject, "%s '%s'", what, name);
  if (mlxd_cjson_load(subject, st) != 0) return NULL;
  const char* end = NULL;
  cJSON* root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  size_t off = end && end >= text && end <= text + len ? (size_t)(end - text) : len;
  if (!root) {
    where(text, len, off, at, sizeof at);
    char cut[80] = ""; /* a file cut short: cJSON names its last byte, so say so */
    if (sh.in_string)
      snprintf(cut, sizeof cut, "; the file ends inside a string");
    else if (sh.open > 0)
      snprintf(cut, sizeof cut, "; the file ends with %ld bracket%s still open", sh.open,
               sh.open == 1 ? "" : "s");
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                 "%s '%s' is not valid JSON: syntax error at %s%s (expected %s)", what, name, at,
                 cut, expected);
    return NULL;
  }
  while (off < len && json_space(text[off])) off++;
  if (off < len) {
    cJSON_Delete(root);
    where(text, len, off, at, sizeof at);
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                 "%s '%s' has more after its JSON value, at %s (expected exactly one JSON list "
                 "and nothing but whitespace after it: a stray ']' or a second document?)",
                 what, name, at);
    return NULL;
  }
  return root;
}

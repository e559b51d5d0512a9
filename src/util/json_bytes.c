/* The bytes JSON forbids, found before cJSON sees the text (json_bytes.h). */
#include "util/json_bytes.h"

#include <stdio.h>

static bool json_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* The escape a control byte needs in a string: "\\n", "\\u0001". */
static void escape_of(unsigned char c, char* buf, size_t n) {
  if (c == '\t')
    snprintf(buf, n, "\\t");
  else if (c == '\n')
    snprintf(buf, n, "\\n");
  else if (c == '\r')
    snprintf(buf, n, "\\r");
  else
    snprintf(buf, n, "\\u%04x", (unsigned)c);
}

bool mlxd_json_bad_byte(const char* text, size_t len, size_t* off, char* why, size_t why_len) {
  bool in_string = false;
  size_t line = 1, col = 1, i = 0;
  for (; i < len; i++, col++) {
    unsigned char c = (unsigned char)text[i];
    if (in_string) {
      if (c < 0x20) break;
      if (c == '\\' && i + 1 < len && (unsigned char)text[i + 1] >= 0x20) {
        i++, col++; /* the escaped byte (a control byte after '\\' is caught next round) */
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '\n') {
      line++, col = 0;
    } else if (c < 0x20 && !json_space(c)) {
      break;
    }
  }
  if (i == len) return false;
  unsigned char c = (unsigned char)text[i];
  if (off) *off = i;
  if (!why || !why_len) return true;
  if (!in_string) {
    snprintf(why, why_len,
             "byte 0x%02x at offset %zu (line %zu, column %zu) is not allowed in JSON (only "
             "space, tab, line feed and carriage return may separate values)",
             (unsigned)c, i, line, col);
  } else {
    char esc[8];
    escape_of(c, esc, sizeof esc);
    snprintf(why, why_len,
             "byte 0x%02x at offset %zu (line %zu, column %zu), inside a string, is not allowed "
             "in JSON (a control byte in a string must be written as an escape, %s%s)",
             (unsigned)c, i, line, col, esc,
             c == '\n' ? "; or does the string lack its closing quote?" : "");
  }
  return true;
}

/* Fuzz target: the MLXDIST_* value parser (util/tunables.c,
 * mlxd_tunable_parse). The first byte chooses the variable, the rest is the
 * value (up to its first NUL, as the environment would give it). It must never
 * crash; an accepted value lies within the variable's declared kind and range,
 * a refused one is named with the variable and what was expected. */
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/tunables.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  mlxd_tunable t = (mlxd_tunable)(data[0] % MLXD_T_COUNT);
  char* text = malloc(size);
  if (!text) return 0;
  memcpy(text, data + 1, size - 1);
  text[size - 1] = '\0';
  double v = NAN;
  char why[400], want[300];
  int rc = mlxd_tunable_parse(t, text, &v, why, sizeof why);
  const mlxd_tunable_spec* s = mlxd_tunable_spec_of(t);
  if (rc == 0) {
    switch (s->kind) {
      case MLXD_TK_NUMBER:
        if (!(v >= s->lo && v <= s->hi)) abort();
        break;
      case MLXD_TK_INTEGER:
        if (!(v >= s->lo && v <= s->hi) || v != floor(v)) abort();
        break;
      case MLXD_TK_FLAG:
        if (v != 0 && v != 1) abort();
        break;
      case MLXD_TK_CHOICE:
        if (!(v >= 0 && v < 16) || v != floor(v)) abort();
        break;
      case MLXD_TK_HOST:
      case MLXD_TK_PATHS:
      case MLXD_TK_FILE:
        if (v != 0 || (double)strlen(text) > s->hi) abort();
        break;
      case MLXD_TK_HEX:
        if (v != 0 || (strlen(text) != 0 && (double)strlen(text) != s->hi)) abort();
        for (const char* p = text; *p; p++)
          if (!isxdigit((unsigned char)*p)) abort();
        break;
    }
  } else {
    snprintf(want, sizeof want, "%s='", mlxd_tunable_env_name(t));
    if (strncmp(why, want, strlen(want)) != 0 || !strstr(why, "; expected ")) abort();
  }
  free(text);
  return 0;
}

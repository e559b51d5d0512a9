#include "util/text.h"

#include <stdarg.h>
#include <stdio.h>

void mlxd_text_add(mlxd_text* t, const char* fmt, ...) {
  if (t->used + 1 >= t->len) return;
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(t->buf + t->used, t->len - t->used, fmt, ap);
  va_end(ap);
  if (w < 0) return;
  t->used += (size_t)w;
  if (t->used >= t->len) t->used = t->len - 1;
}

/* mlxd_status helpers: fill a status with a code and a formatted message. */
#include <stdio.h>

#include "core/status.h"

int mlxd_vfail(mlxd_status* st, int code, const char* fmt, va_list ap) {
  if (code == 0) code = MLXD_EINVAL; /* a failure always carries a non-zero code */
  if (!st) return code;
  st->code = code;
  if (!fmt) {
    st->msg[0] = '\0';
    return code;
  }
  int n = vsnprintf(st->msg, sizeof st->msg, fmt, ap);
  if (n < 0) snprintf(st->msg, sizeof st->msg, "(unformattable message: %s)", fmt);
  return code;
}

int mlxd_fail(mlxd_status* st, int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = mlxd_vfail(st, code, fmt, ap);
  va_end(ap);
  return r;
}

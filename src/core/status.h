/* Private: the status of one operation, filled where it fails.
 * A plain struct so plugins (which do not link the core) can fill it too. */
#ifndef MLXD_STATUS_H
#define MLXD_STATUS_H

#include <stdarg.h>

typedef enum mlxd_code {
  MLXD_OK = 0,
  MLXD_EINVAL,      /* bad argument or configuration */
  MLXD_ETIMEDOUT,   /* a bounded wait ran out */
  MLXD_EREMOTE,     /* a peer closed, reset or died */
  MLXD_ESYS,        /* a system call failed (message has strerror) */
  MLXD_ENOMEM,      /* allocation failed */
  MLXD_EUNAVAIL,    /* backend / device / plugin not available */
  MLXD_EABORTED,    /* the group failed earlier; this op was not attempted */
  MLXD_ECALLBACK,   /* the caller's callback returned non-zero */
} mlxd_code;

#define MLXD_MSG_MAX 512

typedef struct mlxd_status {
  int code;               /* mlxd_code; 0 = success */
  char msg[MLXD_MSG_MAX]; /* "[tag] what went wrong", NUL-terminated */
} mlxd_status;

/* Set code and a printf-style message; returns code (so: return mlxd_fail(...)). */
int mlxd_fail(mlxd_status* st, int code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
int mlxd_vfail(mlxd_status* st, int code, const char* fmt, va_list ap);
static inline void mlxd_status_clear(mlxd_status* st) {
  st->code = 0;
  st->msg[0] = '\0';
}

#endif

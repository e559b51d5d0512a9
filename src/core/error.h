/* Private: reporting through the public error handler. */
#ifndef MLXD_ERROR_H
#define MLXD_ERROR_H

#include "util/status.h"

/* Report one message through the current handler (mlx_set_error_handler). */
void mlxd_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
/* Report st->msg and return st->code (or 1 if code is 0). */
int mlxd_error_status(const mlxd_status* st);

#endif

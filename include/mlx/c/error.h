/* mlxdist: error reporting (mlx-c's error.h).
 *
 * Every function that fails reports exactly one message through the error
 * handler, then returns a non-zero status (or an empty handle / NULL).
 * The default handler prints "MLX error: <message>" to stderr and exits the
 * process with status 255, as mlx-c does. */
#ifndef MLX_ERROR_H
#define MLX_ERROR_H

#include "mlx/c/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/** An error handler: msg is the message, data what was given to mlx_set_error_handler. */
typedef void (*mlx_error_handler_func)(const char* msg, void* data);

/**
 * Replace the error handler. handler == NULL restores the default one.
 * dtor (may be NULL) is called on data when this handler is replaced.
 * The handler is process-wide and may be called from any thread that calls
 * into mlxdist (errors of queued work are reported by the thread that
 * evaluates the array).
 */
MLXDIST_API void mlx_set_error_handler(
    mlx_error_handler_func handler,
    void* data,
    void (*dtor)(void*));

/** Report an error through the current handler (used by mlx-c's generated code). */
MLXDIST_API void _mlx_error(
    const char* file,
    const int line,
    const char* fmt,
    ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif /* MLX_ERROR_H */

/* mlxdist: symbol visibility of the public API.
 *
 * libmlxdist is built with hidden visibility: only the functions declared in
 * these headers, each marked MLXDIST_API, are exported from libmlxdist.so.
 * A program never needs to define anything here; define MLXDIST_API yourself
 * (before the first include) only to override the attribute. */
#ifndef MLX_EXPORT_H
#define MLX_EXPORT_H

#ifndef MLXDIST_API
#if defined(__GNUC__) && __GNUC__ >= 4
#define MLXDIST_API __attribute__((visibility("default")))
#else
#define MLXDIST_API
#endif
#endif

#endif /* MLX_EXPORT_H */

/* Private: a fixed-size text buffer filled piece by piece (error messages
 * that list several causes). It never overflows: it truncates. */
#ifndef MLXD_TEXT_H
#define MLXD_TEXT_H

#include <stddef.h>

typedef struct mlxd_text {
  char* buf;   /* caller's storage, NUL-terminated after every add */
  size_t len;  /* its size */
  size_t used; /* characters written so far */
} mlxd_text;

void mlxd_text_add(mlxd_text* t, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

#endif

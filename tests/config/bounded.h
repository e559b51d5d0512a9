/* tests/config: run something in a child process with a time bound, so that a
 * hang (a FIFO that blocks, an unbounded read) fails the test instead of
 * stalling it. The bound is a guard against hangs, not a measurement. */
#ifndef MLXD_TEST_BOUNDED_H
#define MLXD_TEST_BOUNDED_H

#include <stddef.h>

#define BOUND_S 5.0

typedef struct bounded_result {
  int status;      /* the child's exit status; -1: killed after BOUND_S */
  double seconds;  /* how long it ran */
  char out[65536]; /* what it wrote (stdout and stderr together), NUL-terminated */
} bounded_result;

/* fn(arg) in a forked child, its stdout+stderr captured; the child exits with
 * fn's return value. */
void bounded_call(int (*fn)(void* arg), void* arg, bounded_result* r);
/* argv[0] executed with extra "K=V" environment strings (NULL-terminated, may be NULL). */
void bounded_exec(char* const argv[], const char* const env[], bounded_result* r);

/* Write len bytes to path (created or truncated). */
void write_file(const char* path, const char* text, size_t len);

#endif

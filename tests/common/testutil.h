/* Test helpers shared by every test program: assertions that name the
 * failing expression, and an error handler that records messages instead of
 * exiting, so error paths can be asserted on. */
#ifndef MLXDIST_TESTUTIL_H
#define MLXDIST_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T_FAIL(...)                                                     \
  do {                                                                  \
    fprintf(stderr, "%s:%d: FAILED: ", __FILE__, __LINE__);             \
    fprintf(stderr, __VA_ARGS__);                                       \
    fprintf(stderr, "\n");                                              \
    exit(1);                                                            \
  } while (0)

#define T_ASSERT(cond)                                                  \
  do {                                                                  \
    if (!(cond)) T_FAIL("%s", #cond);                                   \
  } while (0)

#define T_EQ_INT(a, b)                                                  \
  do {                                                                  \
    long long t_a_ = (long long)(a), t_b_ = (long long)(b);             \
    if (t_a_ != t_b_) T_FAIL("%s == %s (%lld != %lld)", #a, #b, t_a_, t_b_); \
  } while (0)

/* Install the recording error handler (call once at start). */
void t_capture_errors(void);
/* Number of errors reported since the last t_clear_errors(). */
int t_error_count(void);
/* The last error message ("" if none). */
const char* t_last_error(void);
void t_clear_errors(void);

/* Assert that exactly one error was reported since the last clear and that
 * its message contains every one of the given substrings (NULL-terminated). */
#define T_EXPECT_ERROR(...) t_expect_error(__FILE__, __LINE__, __VA_ARGS__, (const char*)NULL)
void t_expect_error(const char* file, int line, ...);
/* Assert no error was reported since the last clear. */
#define T_EXPECT_NO_ERROR() t_expect_no_error(__FILE__, __LINE__)
void t_expect_no_error(const char* file, int line);

/* Rank/size of a launched test from MLX_RANK / MLX_WORLD_SIZE (or -1). */
int t_env_int(const char* name, int dflt);

#endif

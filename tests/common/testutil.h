/* Test helpers shared by every test program: assertions that name the
 * failing expression, and an error handler that records messages instead of
 * exiting, so error paths can be asserted on. */
#ifndef MLXDIST_TESTUTIL_H
#define MLXDIST_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Two kinds of assertion:
 *  - fatal (T_FAIL, T_ASSERT, T_EQ_INT, T_REQUIRE*): report and exit(1), for
 *    preconditions whose failure makes going on meaningless (a buffer that
 *    could not be allocated, a collective whose failure leaves the ranks
 *    out of step);
 *  - checks (T_CHECK*): report the failure (file:line, the expression, the
 *    values) and go on, so one run shows every wrong result, not only the
 *    first. t_check_failures() counts them; a test's main returns
 *    t_exit_status(), and the rank harness (ranks.h) fails a rank that
 *    recorded any.
 * Every report is prefixed with the label set by t_set_label() (the rank
 * harness sets "rank R" in each child). */
void t_fatal(const char* file, int line, const char* expr, const char* fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
void t_check_failed(const char* file, int line, const char* expr, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Number of failed checks in this process (forked ranks start from 0). */
int t_check_failures(void);
void t_checks_reset(void);
/* 0 when no check failed; else prints how many did and returns 1. */
int t_exit_status(void);
/* Prefix for every report ("rank 2"); "" for none. */
void t_set_label(const char* label);
const char* t_label(void);

#define T_FAIL(...) t_fatal(__FILE__, __LINE__, NULL, __VA_ARGS__)

#define T_ASSERT(cond)                \
  do {                                \
    if (!(cond)) T_FAIL("%s", #cond); \
  } while (0)
#define T_REQUIRE(cond) T_ASSERT(cond)
/* T_REQUIREF(cond, fmt, ...): fatal, with a printf-style explanation. */
#define T_REQUIREF(cond, ...)                                     \
  do {                                                            \
    if (!(cond)) t_fatal(__FILE__, __LINE__, #cond, __VA_ARGS__); \
  } while (0)

#define T_EQ_INT(a, b)                                                       \
  do {                                                                       \
    long long t_a_ = (long long)(a), t_b_ = (long long)(b);                  \
    if (t_a_ != t_b_) T_FAIL("%s == %s (%lld != %lld)", #a, #b, t_a_, t_b_); \
  } while (0)

#define T_CHECK(cond)                                                 \
  do {                                                                \
    if (!(cond)) t_check_failed(__FILE__, __LINE__, #cond, "%s", ""); \
  } while (0)
/* T_CHECKF(cond, fmt, ...): a check with a printf-style explanation
 * (the case being run, the values that differ). */
#define T_CHECKF(cond, ...)                                              \
  do {                                                                   \
    if (!(cond)) t_check_failed(__FILE__, __LINE__, #cond, __VA_ARGS__); \
  } while (0)
#define T_CHECK_EQ(a, b)                                                            \
  do {                                                                              \
    long long t_a_ = (long long)(a), t_b_ = (long long)(b);                         \
    if (t_a_ != t_b_)                                                               \
      t_check_failed(__FILE__, __LINE__, #a " == " #b, "%lld != %lld", t_a_, t_b_); \
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

/* A forked rank's stderr into DIR/rank<R>.log (t_rank_log_to, in the rank),
 * read back by the parent afterwards (t_rank_log: at most 16 KiB, "" when
 * there is none; a static buffer, valid until the next call). */
void t_rank_log_to(const char* dir, int rank);
const char* t_rank_log(const char* dir, int rank);

/* T_SANITIZED: 1 in an ASan or TSan build (gcc or clang), where tests shrink their largest cases. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define T_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define T_SANITIZED 1
#endif
#endif
#ifndef T_SANITIZED
#define T_SANITIZED 0
#endif

#endif

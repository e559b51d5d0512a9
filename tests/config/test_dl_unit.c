/* util/dl.h, the run-time loader of libcjson (util/cjson_rt.c) and OpenSSL
 * (security/ossl.c), on real libraries of this system:
 *   - the first of a list that loads is used, its functions resolved (and
 *     called here);
 *   - no name loads: each name and dlerror's text for it;
 *   - a library that lacks a function: its name, the function's, dlerror's
 *     text, and the library is closed again (dlopen RTLD_NOLOAD no longer
 *     finds it: libresolv.so.2, which nothing here maps otherwise);
 *   - a short error buffer still ends in NUL. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"
#include "util/dl.h"

#define NO_LIB_A "libmlxdist-no-such-a.so.0"
#define NO_LIB_B "libmlxdist-no-such-b.so.0"
#define NO_FN "mlxd_dl_unit_no_such_function"

static void expect_has(const char* what, const char* msg, const char* part) {
  T_CHECKF(strstr(msg, part) != NULL, "%s: '%s' lacks '%s'", what, msg, part);
}

static void first_that_loads(void) {
  static const char* const names[] = {NO_LIB_A, "libm.so.6"};
  double (*my_cos)(double) = NULL;
  double (*my_sqrt)(double) = NULL;
  const mlxd_dl_sym syms[] = {{"cos", &my_cos}, {"sqrt", &my_sqrt}};
  const char* used = NULL;
  char err[300];
  void* h = mlxd_dl_open(names, 2, syms, 2, &used, err, sizeof err);
  T_REQUIREF(h != NULL, "libm.so.6 after a missing name: %s", err);
  T_CHECKF(used && strcmp(used, "libm.so.6") == 0, "used '%s'", used ? used : "(null)");
  T_REQUIRE(my_cos != NULL && my_sqrt != NULL);
  T_CHECK(my_cos(0.0) == 1.0);
  T_CHECK(my_sqrt(16.0) == 4.0);
  dlclose(h);
}

static void none_loads(void) {
  static const char* const names[] = {NO_LIB_A, NO_LIB_B};
  void (*fn)(void) = NULL;
  const mlxd_dl_sym syms[] = {{"cos", &fn}};
  const char* used = "unchanged";
  char err[300];
  T_CHECK(mlxd_dl_open(names, 2, syms, 1, &used, err, sizeof err) == NULL);
  expect_has("no library", err, NO_LIB_A ": cannot open shared object file");
  expect_has("no library", err, "; " NO_LIB_B ": cannot open shared object file");
  T_CHECK(strcmp(used, "unchanged") == 0);
  T_CHECK(fn == NULL);
}

/* false: skipped (libresolv.so.2 was mapped already) */
static bool lacks_a_function(void) {
  static const char* const names[] = {"libresolv.so.2"};
  void* pre = dlopen("libresolv.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (pre) { /* a sanitizer runtime or NSS mapped it: the close cannot be seen */
    dlclose(pre);
    printf("lacks_a_function: libresolv.so.2 is already mapped in this process; skipped\n");
    return false;
  }
  void (*have)(void) = NULL;
  void (*lack)(void) = NULL;
  const mlxd_dl_sym syms[] = {{"__b64_ntop", &have}, {NO_FN, &lack}};
  char err[300];
  T_CHECK(mlxd_dl_open(names, 1, syms, 2, NULL, err, sizeof err) == NULL);
  expect_has("missing function", err, "libresolv.so.2 has no " NO_FN " (");
  /* dlerror's own text, kept */
  expect_has("missing function", err, "undefined symbol: " NO_FN);
  T_CHECK(lack == NULL);
  void* still = dlopen("libresolv.so.2", RTLD_NOW | RTLD_NOLOAD);
  T_CHECKF(still == NULL, "libresolv.so.2 is still mapped after the failed load (no dlclose)");
  if (still) dlclose(still);
  return true;
}

static void short_buffer(void) {
  static const char* const names[] = {NO_LIB_A};
  char err[16];
  memset(err, 'x', sizeof err);
  T_CHECK(mlxd_dl_open(names, 1, NULL, 0, NULL, err, sizeof err) == NULL);
  T_CHECK(memchr(err, '\0', sizeof err) != NULL);
  T_CHECKF(strncmp(err, NO_LIB_A, strlen(err)) == 0, "'%s'", err);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  first_that_loads();
  none_loads();
  bool ran = lacks_a_function();
  short_buffer();
  if (t_check_failures() == 0) printf("dl: ok%s\n", ran ? "" : " (one case skipped)");
  if (t_check_failures() == 0 && !ran) return 77;
  return t_exit_status();
}

/* The shared-secret file rules and the libcrypto wrappers (security/secret.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "security/secret.h"
#include "testutil.h"

static char dir[] = "/tmp/mlxdist-secret-XXXXXX";

static const char* write_file(const char* name, const char* content, mode_t mode) {
  static char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE* f = fopen(path, "w");
  T_REQUIRE(f);
  fputs(content, f);
  fclose(f);
  T_REQUIRE(chmod(path, mode) == 0);
  return path;
}

static void expect_refused(const char* path, const char* words) {
  mlxd_secret s;
  mlxd_status st = {0};
  int rc = mlxd_secret_load_path(path, &s, &st);
  T_CHECK(rc != 0);
  T_CHECK(!s.have);
  T_CHECKF(strstr(st.msg, path) && strstr(st.msg, words), "message: %s", st.msg);
}

int main(void) {
  T_REQUIRE(mkdtemp(dir));
  const char* good = "0123456789abcdef0123456789abcdef\n";

  /* A private file gives a key; the same content gives the same key, other content another. */
  mlxd_secret a, b, c;
  mlxd_status st = {0};
  T_REQUIRE(mlxd_secret_load_path(write_file("a", good, 0600), &a, &st) == 0 && a.have);
  T_REQUIRE(mlxd_secret_load_path(write_file("b", good, 0400), &b, &st) == 0 && b.have);
  T_REQUIRE(mlxd_secret_load_path(write_file("c", "0123456789abcdef0123456789abcdeF\n", 0600), &c,
                                  &st) == 0);
  T_CHECK(memcmp(a.key, b.key, MLXD_KEY_BYTES) == 0);
  T_CHECK(memcmp(a.key, c.key, MLXD_KEY_BYTES) != 0);

  /* Refused: readable by group or others, too short, too long, not a regular file, missing. */
  expect_refused(write_file("g", good, 0640), "chmod 600");
  expect_refused(write_file("o", good, 0604), "chmod 600");
  expect_refused(write_file("short", "0123456789", 0600), "16 to 4096");
  char* big = malloc(5000);
  T_REQUIRE(big);
  memset(big, 'x', 4999);
  big[4999] = '\0';
  expect_refused(write_file("long", big, 0600), "16 to 4096");
  free(big);
  char fifo[256];
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  T_REQUIRE(mkfifo(fifo, 0600) == 0);
  expect_refused(fifo, "not a regular file"); /* and does not block on the writer-less FIFO */
  expect_refused(dir, "not a regular file");
  char missing[256];
  snprintf(missing, sizeof missing, "%s/none", dir);
  expect_refused(missing, "No such file");

  /* MLXDIST_SECRET_FILE unset: no secret, no error. Set: the file is used. */
  unsetenv("MLXDIST_SECRET_FILE");
  T_CHECK(mlxd_secret_load(&b, &st) == 0 && !b.have);
  setenv("MLXDIST_SECRET_FILE", write_file("env", good, 0600), 1);
  T_CHECK(mlxd_secret_load(&b, &st) == 0 && b.have && memcmp(a.key, b.key, MLXD_KEY_BYTES) == 0);

  /* Derived keys differ by label and are deterministic. */
  unsigned char k1[MLXD_KEY_BYTES], k2[MLXD_KEY_BYTES], k3[MLXD_KEY_BYTES];
  T_REQUIRE(mlxd_secret_derive(&a, "handshake", k1) == 0);
  T_REQUIRE(mlxd_secret_derive(&a, "tls psk", k2) == 0);
  T_REQUIRE(mlxd_secret_derive(&b, "handshake", k3) == 0);
  T_CHECK(memcmp(k1, k2, sizeof k1) != 0);
  T_CHECK(mlxd_ct_equal(k1, k3, sizeof k1));

  /* HMAC-SHA256 against RFC 4231 test case 2, given in two parts. */
  static const unsigned char want[MLXD_KEY_BYTES] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75,
                                                     0x4e, 0x6a, 0x04, 0x24, 0x26, 0x08, 0x95,
                                                     0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d,
                                                     0x27, 0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9,
                                                     0x64, 0xec, 0x38, 0x43};
  const void* parts[2] = {"what do ya want ", "for nothing?"};
  const size_t lens[2] = {16, 12};
  unsigned char mac[MLXD_KEY_BYTES];
  T_REQUIRE(mlxd_hmac_sha256((const unsigned char*)"Jefe", 4, parts, lens, 2, mac) == 0);
  T_CHECK(memcmp(mac, want, sizeof mac) == 0);

  /* Random bytes are not all zero and differ between calls. */
  unsigned char r1[32] = {0}, r2[32] = {0};
  T_REQUIRE(mlxd_random_bytes(r1, sizeof r1, &st) == 0 &&
            mlxd_random_bytes(r2, sizeof r2, &st) == 0);
  T_CHECK(memcmp(r1, r2, sizeof r1) != 0);

  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return t_exit_status();
}

/* The ring hostfile (MLX_HOSTFILE) as a careless user or a hostile file
 * would write it: every malformed case is refused with a message naming the
 * file, the problem, where it is and what was expected.
 *
 *   test_hostfile parse   the pure parser: one document, shapes, types,
 *                         addresses, duplicates, limits (exact messages)
 *   test_hostfile read    the reader: FIFO without a writer, directory,
 *                         /dev/zero, a file over the size limit, a missing file
 *   test_hostfile init    strict ring init in a child process per malformed
 *                         file: init fails with the message, within BOUND_S
 *   test_hostfile scale   100,000 ranks refused; 65,536 ranks parsed (linear)
 * Set MLXDIST_TEST_VERBOSE=1 to print every message. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "bounded.h"
#include "mlx/c/distributed_group.h"
#include "net/net.h"
#include "testutil.h"

static char g_dir[256];
static bool g_verbose;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Every want (NULL-terminated) must appear in msg. */
static void expect_in(const char* what, const char* msg, va_list ap) {
  const char* w;
  while ((w = va_arg(ap, const char*)) != NULL)
    if (!strstr(msg, w)) T_FAIL("%s: the message lacks '%s':\n  %s", what, w, msg);
  if (g_verbose) printf("  %s\n    -> %s\n", what, msg);
}

/* ---- parse ---- */

static void expect_parse_fail_v(const char* text, size_t len, va_list ap) {
  mlxd_net_hosts h;
  mlxd_status st = {0};
  /* the parser gets exactly len bytes, no NUL after them */
  char* copy = malloc(len ? len : 1);
  T_ASSERT(copy != NULL);
  memcpy(copy, text, len);
  int rc = mlxd_net_hostfile_parse(copy, len, "hf.json", &h, &st);
  free(copy);
  if (rc == 0) T_FAIL("accepted a bad hostfile: %s", text);
  T_EQ_INT(rc, MLXD_EINVAL);
  T_ASSERT(h.addrs == NULL && h.size == 0);
  mlxd_status_render(&st, "ring");
  T_ASSERT(strncmp(st.msg, "[ring] hostfile 'hf.json'", 25) == 0);
  expect_in(text, st.msg, ap);
}

static void expect_parse_fail(const char* text, ...) {
  va_list ap;
  va_start(ap, text);
  expect_parse_fail_v(text, strlen(text), ap);
  va_end(ap);
}

/* The same for text with NUL bytes in it. */
static void expect_parse_fail_n(const char* text, size_t len, ...) {
  va_list ap;
  va_start(ap, len);
  expect_parse_fail_v(text, len, ap);
  va_end(ap);
}

static void expect_parse_ok(const char* text, int n, int k) {
  mlxd_net_hosts h;
  mlxd_status st = {0};
  int rc = mlxd_net_hostfile_parse(text, strlen(text), "hf.json", &h, &st);
  if (rc != 0) T_FAIL("refused a good hostfile %s: %s", text, st.msg);
  T_EQ_INT(h.size, n);
  T_EQ_INT(h.nconn, k);
  mlxd_net_hosts_free(&h);
}

/* Bytes JSON forbids (RFC 8259): outside a string only space, tab, LF and CR
 * are whitespace; inside one no control byte at all. cJSON alone takes every
 * byte <= 0x20 as whitespace and control bytes in strings. */
static void json_bytes_tests(void) {
  static const unsigned char between[] = {0x00, 0x01, 0x0b, 0x0c, 0x1f};
  for (size_t i = 0; i < sizeof between; i++) {
    /* [["127.0.0.1:5000"],?["127.0.0.1:5001"]]: the byte at offset 20 */
    char text[64], want[200];
    int n = snprintf(text, sizeof text, "[[\"127.0.0.1:5000\"],?[\"127.0.0.1:5001\"]]");
    text[20] = (char)between[i];
    snprintf(want, sizeof want,
             "hostfile 'hf.json': byte 0x%02x at offset 20 (line 1, column 21) is not allowed in "
             "JSON (only space, tab, line feed and carriage return may separate values)",
             between[i]);
    expect_parse_fail_n(text, (size_t)n, want, NULL);
    /* the same byte first, and last */
    memmove(text + 1, text, (size_t)n);
    text[0] = (char)between[i];
    snprintf(want, sizeof want, "byte 0x%02x at offset 0 (line 1, column 1) is not", between[i]);
    expect_parse_fail_n(text, (size_t)n + 1, want, NULL);
    n = snprintf(text, sizeof text, "[[\"127.0.0.1:5000\"]]\n?");
    text[n - 1] = (char)between[i];
    snprintf(want, sizeof want, "byte 0x%02x at offset 21 (line 2, column 1) is not", between[i]);
    expect_parse_fail_n(text, (size_t)n, want, NULL);
  }
  static const unsigned char inside[] = {0x00, 0x01, 0x0b, 0x0c, 0x1f, 0x09, 0x0d};
  static const char* const escape[] = {"\\u0000", "\\u0001", "\\u000b", "\\u000c",
                                       "\\u001f", "\\t",     "\\r"};
  for (size_t i = 0; i < sizeof inside; i++) {
    /* [["127.0.0.1:500?"]]: the byte at offset 16, in the string */
    char text[64], want[300];
    int n = snprintf(text, sizeof text, "[[\"127.0.0.1:500?\"]]");
    text[16] = (char)inside[i];
    snprintf(want, sizeof want,
             "hostfile 'hf.json': byte 0x%02x at offset 16 (line 1, column 17), inside a string, "
             "is not allowed in JSON (a control byte in a string must be written as an escape, "
             "%s)",
             inside[i], escape[i]);
    expect_parse_fail_n(text, (size_t)n, want, NULL);
  }
  /* a string that lacks its closing quote: told at the line feed */
  expect_parse_fail(
      "[[\"127.0.0.1:5000],\n [\"127.0.0.1:5001\"]]",
      "byte 0x0a at offset 19 (line 1, column 20), inside a string, is not allowed in "
      "JSON (a control byte in a string must be written as an escape, \\n; or does "
      "the string lack its closing quote?)",
      NULL);
  /* escapes are followed: \" stays in the string, \\ ends before the quote */
  expect_parse_fail("[[\"a\\\"\x01\"]]",
                    "byte 0x01 at offset 6 (line 1, column 7), inside a string", NULL);
  expect_parse_fail("[[\"a\\\\\"],\x0c[\"b\"]]",
                    "byte 0x0c at offset 9 (line 1, column 10) is not allowed", NULL);
  /* lines and columns */
  expect_parse_fail("[\n  [\"127.0.0.1:5000\"],\r\n\t\x1f[\"127.0.0.1:5001\"]\n]",
                    "byte 0x1f at offset 26 (line 3, column 2) is not allowed in JSON", NULL);
  /* what JSON allows stays allowed: tab, CR, LF, space around values, DEL and UTF-8 bytes */
  expect_parse_ok("\t[\t[\"127.0.0.1:5000\"],\r\n\t[ \"127.0.0.1:5001\" ]\r\n]\r\n\t", 2, 1);
  expect_parse_ok("\r\n[[\"127.0.0.1:5000\",\r\"127.0.0.1:5001\"]]", 1, 2);
  expect_parse_fail("[[\"h\x7f\xc3\xa9:5000\"]]", "has the byte 0x7f in its host", NULL);
}

static void parse_tests(void) {
  /* MLX's own format, as mlx.launch writes it (compact or indented), whitespace after */
  expect_parse_ok("[[\"127.0.0.1:5000\"], [\"127.0.0.1:5001\"]]", 2, 1);
  expect_parse_ok(
      "[\n  [\n    \"10.0.0.1:5000\",\n    \"10.0.0.1:5001\"\n  ],\n  [\n    "
      "\"10.0.0.2:5000\",\n    \"10.0.0.2:5001\"\n  ]\n]\n\n \t\r\n",
      2, 2);
  expect_parse_ok("[[\"[::1]:5000\"], [\"[::1]:5001\"], [\"node-3.example:5000\"]]", 3, 1);
  /* one document, nothing after it */
  expect_parse_fail(
      "[[\"127.0.0.1:5000\"]], [\"127.0.0.1:5001\"]]",
      "has more after its JSON value, at line 1, column 21 (at ', [\"127.0.0.1:50...')",
      "expected exactly one JSON list and nothing but whitespace after it",
      "a stray ']' or a second document?", NULL);
  expect_parse_fail("[[\"127.0.0.1:5000\"]]\n[[\"127.0.0.1:5001\"]]\n",
                    "has more after its JSON value, at line 2, column 1", NULL);
  expect_parse_fail("[[\"127.0.0.1:5000\"], [\"127.0.0.1:5001\"]] # two ranks",
                    "at line 1, column 42 (at '# two ranks')", NULL);
  static const char nul[] = "[[\"127.0.0.1:5000\"]]\0garbage";
  expect_parse_fail_n(nul, sizeof nul - 1,
                      "byte 0x00 at offset 20 (line 1, column 21) is not allowed in JSON", NULL);
  expect_parse_fail("",
                    "hostfile 'hf.json' is empty (expected a JSON list with one list of "
                    "\"ip:port\" strings per rank)",
                    NULL);
  expect_parse_fail(" \n\t ", "is empty", NULL);
  expect_parse_fail("[[\"127.0.0.1:5000\"", /* cJSON names the last byte of a cut-off file */
                    "is not valid JSON: syntax error at line 1, column 18 (at '\"'); the file ends "
                    "with 2 brackets still open",
                    NULL);
  expect_parse_fail("[[\"127.0.0.1:5000", "; the file ends inside a string", NULL);
  expect_parse_fail("[[\"127.0.0.1:5000\"],\n [\"127.0.0.1:5001\",]]",
                    "syntax error at line 2, column 20 (at ']]')", NULL);
  /* cJSON ends a string at an escaped NUL: the address would be cut short unseen */
  expect_parse_fail("[[\"127.0.0.1:5000\\u0000junk\"]]",
                    "an escaped NUL (\\u0000) in a string at line 1, column 18", NULL);
  expect_parse_fail("[[\"127.0.0.1:5000\\\\u0000\"]]", "bad address", NULL); /* "\\u0000": text */
  json_bytes_tests();
  /* shapes and types */
  expect_parse_fail("{\"hosts\": [\"127.0.0.1:5000\"]}",
                    "is not a non-empty JSON list: it is an object", NULL);
  expect_parse_fail("[]", "is not a non-empty JSON list: it is an empty list", NULL);
  expect_parse_fail("\"127.0.0.1:5000\"", "it is a string", NULL);
  expect_parse_fail("[[\"127.0.0.1:5000\"], \"127.0.0.1:5001\"]",
                    "the entry of rank 1 is not a non-empty list of \"ip:port\" strings: it is a "
                    "string",
                    NULL);
  expect_parse_fail("[[]]", "rank 0 is not a non-empty list", "it is an empty list", NULL);
  expect_parse_fail("[[\"127.0.0.1:5000\"], [5001]]",
                    "the entry of rank 1 is not a list of strings: item 0 is a number (expected "
                    "\"ip:port\")",
                    NULL);
  expect_parse_fail("[[\"127.0.0.1:5000\", null]]", "item 1 is null", NULL);
  expect_parse_fail("[[\"127.0.0.1:5000\", \"127.0.0.1:5001\"], [\"127.0.0.1:5002\"]]",
                    "rank 1 lists 1 addresses but rank 0 lists 2", NULL);
  /* addresses */
  expect_parse_fail("[[\"127.0.0.1\"]]",
                    "rank 0 connection 0: bad address '127.0.0.1' has no "
                    "':port' (expected \"ip:port\")",
                    NULL);
  expect_parse_fail("[[\"127.0.0.1:0\"]]", "invalid port '0' (expected an integer in [1, 65535])",
                    NULL);
  expect_parse_fail("[[\"127.0.0.1:+80\"]]", "invalid port '+80'", NULL);
  expect_parse_fail("[[\"127.0.0.1:5000\"], [\"127.0.0.1:99999\"]]",
                    "rank 1 connection 0: bad address", "invalid port '99999'", NULL);
  expect_parse_fail("[[\":5000\"]]", "empty or too long host", NULL);
  expect_parse_fail("[[\"[::1:5000\"]]", "unbalanced '['", NULL);
  expect_parse_fail("[[\"host name:5000\"]]", "has the byte 0x20 in its host", NULL);
  char longaddr[128] = "[[\"";
  memset(longaddr + 3, 'a', 75); /* 75 + ":5000" = 80 characters */
  strcpy(longaddr + 78, ":5000\"]]");
  expect_parse_fail(longaddr, "is 80 characters long (expected \"ip:port\" of at most 79)", NULL);
  /* duplicates: both places and the address */
  expect_parse_fail("[[\"127.0.0.1:5000\"], [\"127.0.0.1:5001\"], [\"127.0.0.1:5000\"]]",
                    "hostfile 'hf.json': duplicate address: rank 0 connection 0 and rank 2 "
                    "connection 0 both list '127.0.0.1:5000' (expected a different address for "
                    "every rank and connection)",
                    NULL);
  expect_parse_fail(
      "[[\"10.0.0.1:5000\", \"10.0.0.1:5000\"], [\"10.0.0.2:5000\", \"10.0.0.2:5001\"]]",
      "rank 0 connection 0 and rank 0 connection 1 both list '10.0.0.1:5000'", NULL);
  expect_parse_fail("[[\"[::1]:5000\"], [\"[0:0::1]:5000\"]]",
                    "rank 0 connection 0 ('[::1]:5000') and rank 1 connection 0 ('[0:0::1]:5000') "
                    "are the same address [::1]:5000",
                    NULL);
  expect_parse_fail("[[\"Node1:5000\"], [\"node1:5000\"]]",
                    "rank 0 connection 0 ('Node1:5000') and rank 1 connection 0 ('node1:5000') "
                    "name the same host and port (expected",
                    NULL);
  /* limits */
  char many[64 * 24 + 16];
  size_t o = (size_t)snprintf(many, sizeof many, "[[");
  for (int c = 0; c < 65; c++)
    o += (size_t)snprintf(many + o, sizeof many - o, "%s\"10.0.0.1:%d\"", c ? "," : "", 5000 + c);
  snprintf(many + o, sizeof many - o, "]]");
  expect_parse_fail(many, "rank 0 lists more than 64 addresses", NULL);
  /* the byte limit is checked before anything is parsed */
  mlxd_net_hosts h;
  mlxd_status st = {0};
  static const char big_marker[] = "[";
  T_EQ_INT(mlxd_net_hostfile_parse(big_marker, (size_t)MLXD_NET_HOSTFILE_MAX_BYTES + 1, "hf.json",
                                   &h, &st),
           MLXD_EINVAL); /* len is checked first: the bytes after the marker are never read */
  T_ASSERT(strstr(st.msg, "is 16777217 bytes (expected at most 16777216)"));

  /* the values are counted before cJSON builds them: 16 MiB of "[0,0,..." is refused at once */
  size_t zlen = (size_t)MLXD_NET_HOSTFILE_MAX_BYTES;
  char* zeros = malloc(zlen);
  T_ASSERT(zeros != NULL);
  for (size_t i = 0; i < zlen; i += 2) zeros[i] = '0', zeros[i + 1] = ',';
  zeros[0] = '[';
  zeros[zlen - 1] = ']';
  st = (mlxd_status){0};
  T_EQ_INT(mlxd_net_hostfile_parse(zeros, zlen, "hf.json", &h, &st), MLXD_EINVAL);
  T_ASSERT(strstr(st.msg,
                  "hostfile 'hf.json' holds up to 8388609 JSON values (expected at most "
                  "65536 ranks and 262144 addresses in all)"));
  free(zeros);

  /* names are resolved after parsing, then checked for duplicates again */
  const char* t = "[[\"127.1:5000\"], [\"127.0.0.1:5000\"]]";
  st = (mlxd_status){0};
  T_EQ_INT(mlxd_net_hostfile_parse(t, strlen(t), "hf.json", &h, &st), 0);
  T_EQ_INT(h.addrs[0].sa.ss_family, AF_UNSPEC); /* parse looks nothing up */
  T_EQ_INT(mlxd_net_hostfile_resolve("hf.json", &h, &st), MLXD_EINVAL);
  T_ASSERT(strstr(st.msg,
                  "rank 0 connection 0 ('127.1:5000') and rank 1 connection 0 "
                  "('127.0.0.1:5000') are the same address 127.0.0.1:5000"));
  mlxd_net_hosts_free(&h);
  printf("parse: OK\n");
}

/* ---- read ---- */

static void expect_read_fail(const char* path, const char* want) {
  char* text = NULL;
  size_t len = 0;
  mlxd_status st = {0};
  double t0 = now_s();
  T_ASSERT(mlxd_net_hostfile_read(path, &text, &len, &st) != 0);
  T_ASSERT(now_s() - t0 < BOUND_S);
  T_ASSERT(text == NULL);
  mlxd_status_render(&st, "ring");
  if (!strstr(st.msg, path) || !strstr(st.msg, want))
    T_FAIL("reading '%s': expected '%s', got: %s", path, want, st.msg);
  if (g_verbose) printf("  %s\n    -> %s\n", path, st.msg);
}

static void read_tests(void) {
  char fifo[300], dir[300], big[300], missing[300], ok[300], sock[300];
  snprintf(fifo, sizeof fifo, "%s/fifo", g_dir);
  T_ASSERT(mkfifo(fifo, 0600) == 0);
  expect_read_fail(fifo, "is a FIFO (named pipe) (expected a regular file)");
  snprintf(dir, sizeof dir, "%s/dir", g_dir);
  T_ASSERT(mkdir(dir, 0700) == 0);
  expect_read_fail(dir, "is a directory (expected a regular file)");
  expect_read_fail("/dev/zero", "is a character device (expected a regular file)");
  snprintf(sock, sizeof sock, "%s/sock", g_dir);
  int sfd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un un = {.sun_family = AF_UNIX};
  T_ASSERT(strlen(sock) < sizeof un.sun_path);
  memcpy(un.sun_path, sock, strlen(sock) + 1);
  T_ASSERT(bind(sfd, (struct sockaddr*)&un, sizeof un) == 0);
  expect_read_fail(sock, "is a socket (expected a regular file)");
  close(sfd);
  snprintf(big, sizeof big, "%s/big.json", g_dir);
  int fd = open(big, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  T_ASSERT(fd >= 0 && ftruncate(fd, (off_t)17 << 20) == 0); /* sparse: nothing is written */
  close(fd);
  expect_read_fail(big, "is 17825792 bytes (expected at most 16777216)");
  snprintf(missing, sizeof missing, "%s/missing.json", g_dir);
  expect_read_fail(missing, "No such file or directory");
  /* a regular file is read whole */
  snprintf(ok, sizeof ok, "%s/ok.json", g_dir);
  write_file(ok, "[[\"127.0.0.1:5000\"]]\n", 21);
  char* text = NULL;
  size_t len = 0;
  mlxd_status st = {0};
  T_EQ_INT(mlxd_net_hostfile_read(ok, &text, &len, &st), 0);
  T_EQ_INT((int)len, 21);
  T_ASSERT(strcmp(text, "[[\"127.0.0.1:5000\"]]\n") == 0);
  free(text);
  unlink(fifo);
  rmdir(dir);
  unlink(big);
  unlink(sock);
  unlink(ok);
  printf("read: OK\n");
}

/* n ranks, "10.a.b.1:5000" each; dup_last: the last one repeats rank 0's address. */
static char* ranks_text(int n, bool dup_last, size_t* len) {
  size_t cap = (size_t)n * 24 + 16, o = 0;
  char* text = malloc(cap);
  T_ASSERT(text != NULL);
  text[o++] = '[';
  for (int r = 0; r < n; r++) {
    int x = dup_last && r == n - 1 ? 0 : r;
    o += (size_t)snprintf(text + o, cap - o, "%s[\"10.%d.%d.1:5000\"]", r ? "," : "", x >> 8,
                          x & 255);
  }
  text[o++] = ']';
  *len = o;
  return text;
}

/* ---- init in a child process ---- */

static int child_init(void* arg) {
  setenv("MLX_HOSTFILE", (const char*)arg, 1);
  setenv("MLX_RANK", "0", 1);
  unsetenv("MLX_WORLD_SIZE");
  t_capture_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  int rc = mlx_distributed_init(&g, true, "ring");
  if (rc == 0) {
    printf("INIT OK size=%d\n", mlx_distributed_group_size(g));
    return 0;
  }
  printf("INIT FAILED: %s\n", t_last_error());
  return 3;
}

static double g_slowest;

/* Strict init with MLX_HOSTFILE=path fails with every want in its message. */
static void expect_init_fail(const char* what, const char* path, ...) {
  static bounded_result r;
  bounded_call(child_init, (void*)path, &r);
  if (r.status == -1) T_FAIL("%s: init did not return within %.0f s", what, BOUND_S);
  if (r.status != 3) T_FAIL("%s: init did not fail (exit %d): %s", what, r.status, r.out);
  if (r.seconds > g_slowest) g_slowest = r.seconds;
  if (!strstr(r.out, "INIT FAILED: [distributed] init: could not start the ring backend: [ring] "))
    T_FAIL("%s: unexpected output: %s", what, r.out);
  T_ASSERT(strstr(r.out, path) != NULL);
  va_list ap;
  va_start(ap, path);
  expect_in(what, r.out, ap);
  va_end(ap);
}

static void write_case(char* path, size_t plen, const char* name, const char* text) {
  snprintf(path, plen, "%s/%s", g_dir, name);
  write_file(path, text, strlen(text));
}

static void init_tests(void) {
  char p[300];
  write_case(p, sizeof p, "stray.json", "[[\"127.0.0.1:45001\"]], [\"127.0.0.1:45002\"]]\n");
  expect_init_fail("stray ]]", p, "has more after its JSON value, at line 1, column 22", NULL);
  write_case(p, sizeof p, "two.json", "[[\"127.0.0.1:45001\"]]\n[[\"127.0.0.1:45002\"]]\n");
  expect_init_fail("two documents", p, "at line 2, column 1", "a second document?", NULL);
  write_case(p, sizeof p, "trailing.json", "[[\"127.0.0.1:45001\"], [\"127.0.0.1:45002\"]] x\n");
  expect_init_fail("trailing text", p, "at line 1, column 44 (at 'x\\x0a')", NULL);
  write_case(p, sizeof p, "dup.json",
             "[[\"127.0.0.1:45001\"], [\"127.0.0.1:45002\"], [\"127.0.0.1:45001\"]]");
  expect_init_fail("duplicate", p,
                   "duplicate address: rank 0 connection 0 and rank 2 connection 0 both list "
                   "'127.0.0.1:45001'",
                   NULL);
  write_case(p, sizeof p, "dupname.json", "[[\"127.0.0.1:45001\"], [\"127.1:45001\"]]");
  expect_init_fail("duplicate after resolution", p, "are the same address 127.0.0.1:45001", NULL);
  static const char nul_between[] = "[[\"127.0.0.1:45001\"],\0[\"127.0.0.1:45002\"]]";
  snprintf(p, sizeof p, "%s/nul.json", g_dir);
  write_file(p, nul_between, sizeof nul_between - 1);
  expect_init_fail("a NUL byte between elements", p,
                   "byte 0x00 at offset 21 (line 1, column 22) is not allowed in JSON (only space, "
                   "tab, line feed and carriage return may separate values)",
                   NULL);
  write_case(p, sizeof p, "vt.json", "[[\"127.0.0.1:45001\"],\v[\"127.0.0.1:45002\"]]");
  expect_init_fail("a vertical tab between elements", p, "byte 0x0b at offset 21", NULL);
  write_case(p, sizeof p, "empty.json", "");
  expect_init_fail("empty file", p, "is empty (expected a JSON list", NULL);
  write_case(p, sizeof p, "object.json", "{\"hosts\": [[\"127.0.0.1:45001\"]]}");
  expect_init_fail("an object", p, "is not a non-empty JSON list: it is an object", NULL);
  write_case(p, sizeof p, "number.json", "[[\"127.0.0.1:45001\"], [45002]]");
  expect_init_fail("a number", p, "item 0 is a number (expected \"ip:port\")", NULL);
  write_case(p, sizeof p, "flat.json", "[\"127.0.0.1:45001\", \"127.0.0.1:45002\"]");
  expect_init_fail("a flat list", p, "the entry of rank 0 is not a non-empty list", NULL);
  expect_init_fail("/dev/zero", "/dev/zero", "is a character device (expected a regular file)",
                   NULL);
  snprintf(p, sizeof p, "%s/fifo", g_dir);
  T_ASSERT(mkfifo(p, 0600) == 0);
  expect_init_fail("FIFO without a writer", p, "is a FIFO (named pipe)", NULL);
  unlink(p);
  snprintf(p, sizeof p, "%s/adir", g_dir);
  T_ASSERT(mkdir(p, 0700) == 0);
  expect_init_fail("directory", p, "is a directory", NULL);
  rmdir(p);
  /* 100,000 ranks: refused by count, quickly */
  size_t len;
  char* text = ranks_text(100000, false, &len);
  snprintf(p, sizeof p, "%s/huge.json", g_dir);
  write_file(p, text, len);
  free(text);
  expect_init_fail("100,000 ranks", p, "lists 100000 ranks (expected at most 65536)", NULL);
  /* a control: MLX's format with whitespace after it is a group (of one here) */
  write_case(p, sizeof p, "one.json", "[\n  [\n    \"127.0.0.1:45001\"\n  ]\n]\n\n");
  static bounded_result r;
  bounded_call(child_init, p, &r);
  if (r.status != 0 || !strstr(r.out, "INIT OK size=1")) T_FAIL("one-rank file: %s", r.out);
  printf("init: OK (the slowest refusal took %.3f s)\n", g_slowest);
}

/* ---- scale ---- */

static void scale_tests(void) {
  int n = MLXD_NET_HOSTFILE_MAX_RANKS;
  size_t len;
  char* text = ranks_text(n, false, &len);
  mlxd_net_hosts h;
  mlxd_status st = {0};
  double t0 = now_s();
  T_EQ_INT(mlxd_net_hostfile_parse(text, len, "big.json", &h, &st), 0);
  double t1 = now_s() - t0;
  T_EQ_INT(h.size, n);
  /* the file is plain (what mlxdist-launch writes): the scanner read it; cJSON must agree */
  mlxd_net_hosts g;
  t0 = now_s();
  T_EQ_INT(mlxd_net_hostfile_parse_json(text, len, "big.json", &g, &st), 0);
  double tj = now_s() - t0;
  T_EQ_INT(g.size, h.size);
  T_EQ_INT(g.nconn, h.nconn);
  T_ASSERT(memcmp(g.addrs, h.addrs, (size_t)n * (size_t)h.nconn * sizeof *h.addrs) == 0);
  mlxd_net_hosts_free(&g);
  mlxd_net_hosts_free(&h);
  free(text);
  text = ranks_text(n, true, &len);
  st = (mlxd_status){0};
  t0 = now_s();
  T_EQ_INT(mlxd_net_hostfile_parse(text, len, "big.json", &h, &st), MLXD_EINVAL);
  double t2 = now_s() - t0;
  if (!strstr(st.msg, "rank 0 connection 0 and rank 65535 connection 0 both list '10.0.0.1:5000'"))
    T_FAIL("%s", st.msg);
  free(text);
  T_ASSERT(t1 < BOUND_S && t2 < BOUND_S); /* a bound against a quadratic walk, not a benchmark */
  printf("scale: OK (%d ranks parsed in %.3f s, by cJSON in %.3f s; a duplicate found in %.3f s)\n",
         n, t1, tj, t2);
}

int main(int argc, char** argv) {
  T_ASSERT(argc == 2);
  g_verbose = t_env_int("MLXDIST_TEST_VERBOSE", 0) != 0;
  snprintf(g_dir, sizeof g_dir, "/tmp/mlxdist_hostfile_XXXXXX");
  T_ASSERT(mkdtemp(g_dir) != NULL);
  if (strcmp(argv[1], "parse") == 0)
    parse_tests();
  else if (strcmp(argv[1], "read") == 0)
    read_tests();
  else if (strcmp(argv[1], "init") == 0)
    init_tests();
  else if (strcmp(argv[1], "scale") == 0)
    scale_tests();
  else
    T_FAIL("unknown mode '%s'", argv[1]);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  T_ASSERT(system(cmd) == 0);
  return t_exit_status();
}

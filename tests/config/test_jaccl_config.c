/* jaccl's configuration (MLX_RANK, MLX_IBV_DEVICES, MLX_JACCL_COORDINATOR,
 * MLX_JACCL_RING and their JACCL_ forms) and the verbs probe, on a machine
 * with no active RDMA port (with or without libibverbs installed):
 *
 *   test_jaccl_config parse   the pure matrix parser and the topology: every
 *                             malformed matrix refused naming the file, row
 *                             and column (exact wording checked by parts)
 *   test_jaccl_config env     the environment, with real files: precedence,
 *                             empty and bad values, rank range, coordinator,
 *                             a FIFO / directory / missing / too large file
 *   test_jaccl_config init    the public API in child processes: is_available
 *                             false, strict init naming the configuration's
 *                             error first, then a device that does not exist,
 *                             then the probe's reason (no library / no device);
 *                             non-strict falls back to a group of one
 *   test_jaccl_config probe   the probe's pure helpers (GID, MTU, state names)
 * Set MLXDIST_TEST_VERBOSE=1 to print every message. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/jaccl/jaccl_config.h"
#include "bounded.h"
#include "mlx/c/distributed_group.h"
#include "rdma/probe.h"
#include "testutil.h"

static char g_dir[256];
static bool g_verbose;

static void expect_in(const char* what, const char* msg, va_list ap) {
  const char* w;
  while ((w = va_arg(ap, const char*)) != NULL)
    if (!strstr(msg, w)) T_FAIL("%s: the message lacks '%s':\n  %s", what, w, msg);
  if (g_verbose) printf("  %s\n    -> %s\n", what, msg);
}

/* ---- parse ---- */

static void parse_fail_n(const char* text, size_t len, ...) {
  mlxd_jaccl_matrix m;
  mlxd_status st = {0};
  char* copy = malloc(len ? len : 1); /* exactly len bytes, no NUL after them */
  T_ASSERT(copy != NULL);
  memcpy(copy, text, len);
  int rc = mlxd_jaccl_matrix_parse(copy, len, "m.json", &m, &st);
  free(copy);
  if (rc == 0) T_FAIL("accepted a bad matrix: %s", text);
  T_EQ_INT(rc, MLXD_EINVAL);
  T_ASSERT(m.off == NULL && m.names == NULL && m.size == 0);
  mlxd_status_render(&st, "jaccl");
  T_ASSERT(strncmp(st.msg, "[jaccl] device matrix 'm.json'", 30) == 0);
  va_list ap;
  va_start(ap, len);
  expect_in(text, st.msg, ap);
  va_end(ap);
}
#define parse_fail(text, ...) parse_fail_n(text, strlen(text), __VA_ARGS__, (const char*)NULL)

static void parse_ok(const char* text, mlxd_jaccl_matrix* m) {
  mlxd_status st = {0};
  if (mlxd_jaccl_matrix_parse(text, strlen(text), "m.json", m, &st) != 0)
    T_FAIL("refused a good matrix %s: %s", text, st.msg);
}

static void topo_expect(const char* text, bool ring, int want, const char* want_msg) {
  mlxd_jaccl_matrix m;
  parse_ok(text, &m);
  mlxd_status st = {0};
  int topo = -1;
  int rc = mlxd_jaccl_topology(&m, ring, "m.json", &topo, &st);
  if (want_msg) {
    if (rc == 0) T_FAIL("%s: topology accepted (%s)", text, mlxd_jaccl_topo_name(topo));
    if (!strstr(st.msg, want_msg) || !strstr(st.msg, "m.json"))
      T_FAIL("%s: message lacks '%s': %s", text, want_msg, st.msg);
    if (g_verbose) printf("  %s\n    -> %s\n", text, st.msg);
  } else {
    if (rc != 0) T_FAIL("%s: %s", text, st.msg);
    T_EQ_INT(topo, want);
  }
  mlxd_jaccl_matrix_free(&m);
}

static void parse_tests(void) {
  /* what MLX's launcher writes: rdma lists with null for the host itself */
  mlxd_jaccl_matrix m;
  parse_ok(
      "[[null, \"rdma_en2\", \"rdma_en3\"], [\"rdma_en2\", null, \"rdma_en3\"], "
      "[\"rdma_en2\", \"rdma_en3\", null]]",
      &m);
  T_EQ_INT(m.size, 3);
  T_EQ_INT(mlxd_jaccl_cell_count(&m, 0, 0), 0);
  T_EQ_INT(mlxd_jaccl_cell_count(&m, 2, 1), 1);
  T_ASSERT(strcmp(mlxd_jaccl_cell_name(&m, 2, 1, 0), "rdma_en3") == 0);
  mlxd_jaccl_matrix_free(&m);
  /* multi-rail, [] on the diagonal, whitespace around */
  parse_ok(" \n[[[], [\"mlx5_0\", \"mlx5_1\"]],\r\n [[\"mlx5_0\",\"mlx5_1\"], null]]\t\n", &m);
  T_EQ_INT(m.size, 2);
  T_EQ_INT(mlxd_jaccl_cell_count(&m, 0, 1), 2);
  T_ASSERT(strcmp(mlxd_jaccl_cell_name(&m, 1, 0, 1), "mlx5_1") == 0);
  T_EQ_INT(m.nnames, 4);
  mlxd_jaccl_matrix_free(&m);
  parse_ok("[[null]]", &m); /* a group of one */
  T_EQ_INT(m.size, 1);
  mlxd_jaccl_matrix_free(&m);

  parse_fail("", "is empty", "expected a JSON list of N rows");
  parse_fail(" \n ", "is empty");
  parse_fail("{\"devices\": []}", "not a non-empty JSON list: it is an object");
  parse_fail("[]", "not a non-empty JSON list: it is an empty list");
  parse_fail("\"rxe0\"", "it is a string");
  parse_fail("[[null, \"a\"], [\"a\", null]", "not valid JSON", "line 1");
  parse_fail("[[null, \"a\"],\n [\"a\", null]] ]", "more after its JSON value",
             "line 2, column 15");
  parse_fail("[[null, \"a\"]] [[null]]", "more after its JSON value");
  parse_fail("[[null, \"a\"], 7]", "row 1 is a number", "expected a list of 2 cells");
  parse_fail("[[null, \"a\"], {\"x\": 1}]", "row 1 is an object");
  parse_fail("[[null, \"a\"], [\"a\"]]", "row 1 has 1 cells but the matrix has 2 rows", "square");
  parse_fail("[[null, \"a\", \"b\"], [\"a\", null, \"b\"]]", "row 0 has 3 cells",
             "the matrix has 2 rows");
  parse_fail("[[null, 5], [\"a\", null]]", "row 0, column 1 is a number",
             "expected null, a device name string or a list of them");
  parse_fail("[[null, true], [\"a\", null]]", "row 0, column 1 is a boolean");
  parse_fail("[[null, {}], [\"a\", null]]", "row 0, column 1 is an object");
  parse_fail("[[null, [\"a\", 1]], [\"a\", null]]", "row 0, column 1: item 1 is a number");
  parse_fail("[[null, [\"a\", null]], [\"a\", null]]", "row 0, column 1: item 1 is null");
  parse_fail("[[null, [[\"a\"]]], [\"a\", null]]", "row 0, column 1: item 0 is a list");
  parse_fail("[[null, \"\"], [\"a\", null]]", "row 0, column 1 is an empty string");
  parse_fail("[[null, [\"a\", \"\"]], [\"a\", null]]", "row 0, column 1 item 1 is an empty string");
  parse_fail("[[null, [\"a\", \"a\"]], [\"a\", null]]", "row 0, column 1 names 'a' twice");
  parse_fail("[[\"a\", \"b\"], [\"a\", null]]", "row 0, column 0 is on the diagonal",
             "expected null");
  parse_fail("[[null, \"a\"], [\"a\", [\"b\"]]]", "row 1, column 1 is on the diagonal");
  parse_fail("[[null, \"a b\"], [\"a\", null]]", "the device name 'a' has the byte 0x20");
  parse_fail("[[null, \"a/../b\"], [\"a\", null]]", "has the character '/'");
  parse_fail("[[null, \"..\"], [\"a\", null]]", "the device name '..' starts with '.'");
  parse_fail("[[null, \"mlx\\u00e9\"], [\"a\", null]]", "has the byte 0xc3");
  parse_fail("[[null, \"a\\u0000b\"], [\"a\", null]]", "an escaped NUL", "line 1, column 11");
  char longname[200];
  snprintf(longname, sizeof longname, "[[null, \"%064d\"], [\"a\", null]]", 0);
  parse_fail(longname, "is 64 characters long (expected at most 63)");
  /* bytes JSON forbids (util/json_bytes.h): a NUL between values, a tab inside a string */
  parse_fail_n("[[null, \"a\"],\0 [\"a\", null]]", 27, "byte 0x00 at offset 13", (const char*)NULL);
  parse_fail("[[null, \"a\tb\"], [\"a\", null]]", "byte 0x09", "not allowed in JSON");
  parse_fail("[[null, \"a\x01\"], [\"a\", null]]", "byte 0x01");
  /* limits: rails, ranks, values, bytes */
  char rails[1024];
  size_t o = (size_t)snprintf(rails, sizeof rails, "[[null, [");
  for (int i = 0; i <= MLXD_JACCL_MAX_RAILS; i++)
    o += (size_t)snprintf(rails + o, sizeof rails - o, "%s\"d%d\"", i ? "," : "", i);
  snprintf(rails + o, sizeof rails - o, "]], [\"a\", null]]");
  parse_fail(rails, "row 0, column 1 lists more than 16 devices");
  size_t big = (size_t)MLXD_JACCL_MAX_RANKS + 1;
  char* rows = malloc(big * 3 + 8);
  o = 0;
  rows[o++] = '[';
  for (size_t i = 0; i < big; i++) o += (size_t)sprintf(rows + o, "%s[]", i ? "," : "");
  rows[o++] = ']';
  rows[o] = '\0';
  parse_fail(rows, "has 1025 rows (expected at most 1024 ranks)");
  free(rows);
  size_t nv = (size_t)(1 << 21) + 8;
  char* commas = malloc(nv * 2 + 8);
  o = 0;
  commas[o++] = '[';
  for (size_t i = 0; i < nv; i++) o += (size_t)sprintf(commas + o, "%s0", i ? "," : "");
  commas[o++] = ']';
  commas[o] = '\0';
  parse_fail(commas, "holds up to", "JSON values");
  free(commas);
  size_t huge = (size_t)MLXD_JACCL_MATRIX_MAX_BYTES + 1;
  char* spaces = malloc(huge);
  memset(spaces, ' ', huge);
  parse_fail_n(spaces, huge, "is 16777217 bytes (expected at most 16777216)", (const char*)NULL);
  free(spaces);

  /* topology: MLX's rules */
  const char* mesh3 = "[[null,\"a\",\"b\"],[\"a\",null,\"b\"],[\"a\",\"b\",null]]";
  topo_expect(mesh3, false, MLXD_JACCL_MESH, NULL);
  topo_expect(mesh3, true, MLXD_JACCL_RING, NULL); /* MLX_JACCL_RING prefers the ring */
  /* 4 ranks, only the ring's neighbours: a ring */
  const char* ring4 =
      "[[null,\"r\",null,\"l\"],[\"l\",null,\"r\",null],"
      "[null,\"l\",null,\"r\"],[\"r\",null,\"l\",null]]";
  topo_expect(ring4, false, MLXD_JACCL_RING, NULL);
  topo_expect(ring4, true, MLXD_JACCL_RING, NULL);
  topo_expect("[[null]]", false, 0, NULL);
  /* neither: a neighbour cell empty */
  topo_expect(
      "[[null,\"r\",null,\"l\"],[\"l\",null,null,null],[null,\"l\",null,\"r\"],"
      "[\"r\",null,\"l\",null]]",
      false, 0, "row 1, column 2 is empty");
  topo_expect(
      "[[null,\"r\",null,\"l\"],[\"l\",null,null,null],[null,\"l\",null,\"r\"],"
      "[\"r\",null,\"l\",null]]",
      true, 0, "MLX_JACCL_RING asks for a ring, but row 1, column 2 is empty");
  /* ring links with different numbers of wires */
  topo_expect(
      "[[null,\"r\",null,\"l\"],[\"l\",null,[\"r\",\"s\"],null],[null,\"l\",null,\"r\"],"
      "[\"r\",null,\"l\",null]]",
      false, 0, "row 1, column 2 lists 2 device(s) and row 0, column 1 lists 1");
  topo_expect("[[null,null],[null,null]]", false, 0, "neither a mesh nor a ring");
  printf("parse: OK\n");
}

/* ---- env ---- */

static void clear_env(void) {
  const char* names[] = {"MLX_RANK",
                         "JACCL_RANK",
                         "MLX_IBV_DEVICES",
                         "JACCL_IBV_DEVICES",
                         "MLX_JACCL_COORDINATOR",
                         "JACCL_COORDINATOR",
                         "MLX_JACCL_RING",
                         "JACCL_RING"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unsetenv(names[i]);
}

static const char* file_with(const char* name, const char* text) {
  static char path[8][512];
  static int next;
  char* p = path[next++ % 8];
  snprintf(p, 512, "%s/%s", g_dir, name);
  write_file(p, text, strlen(text));
  return p;
}

static void load_fail(bool with_bs, int code, ...) {
  mlxd_jaccl_config c;
  mlxd_status st = {0};
  int rc = mlxd_jaccl_config_load(with_bs, &c, &st);
  if (rc == 0) T_FAIL("a bad configuration was accepted");
  T_EQ_INT(rc, code);
  mlxd_status_render(&st, "jaccl");
  va_list ap;
  va_start(ap, code);
  expect_in("config", st.msg, ap);
  va_end(ap);
}
#define load_fail(bs, code, ...) load_fail(bs, code, __VA_ARGS__, (const char*)NULL)

static int child_load_fifo(void* arg) {
  clear_env();
  setenv("MLX_RANK", "0", 1);
  setenv("MLX_IBV_DEVICES", (const char*)arg, 1);
  mlxd_jaccl_config c;
  mlxd_status st = {0};
  int rc = mlxd_jaccl_config_load(true, &c, &st);
  printf("rc=%d %s\n", rc, st.msg);
  return rc == 0 ? 0 : 3;
}

static void env_tests(void) {
  const char* mesh2 = file_with("mesh2.json", "[[null, \"rxe0\"], [\"rxe0\", null]]");
  clear_env();
  load_fail(false, MLXD_EUNAVAIL, "MLX_RANK, MLX_IBV_DEVICES, MLX_JACCL_COORDINATOR not set");
  load_fail(true, MLXD_EUNAVAIL, "MLX_RANK, MLX_IBV_DEVICES not set");
  T_ASSERT(!mlxd_jaccl_env_present(true));
  setenv("MLX_RANK", "1", 1);
  setenv("MLX_IBV_DEVICES", mesh2, 1);
  T_ASSERT(mlxd_jaccl_env_present(true) && !mlxd_jaccl_env_present(false));
  load_fail(false, MLXD_EUNAVAIL, "MLX_JACCL_COORDINATOR not set");
  setenv("MLX_JACCL_COORDINATOR", "10.1.2.3:32323", 1);
  T_ASSERT(mlxd_jaccl_env_present(false));
  mlxd_jaccl_config c;
  mlxd_status st = {0};
  T_EQ_INT(mlxd_jaccl_config_load(false, &c, &st), 0);
  T_EQ_INT(c.rank, 1);
  T_EQ_INT(c.size, 2);
  T_EQ_INT(c.topo, MLXD_JACCL_MESH);
  T_ASSERT(c.have_coord && strcmp(c.rank_var, "MLX_RANK") == 0 && !c.prefer_ring);
  T_ASSERT(strcmp(c.coord.text, "10.1.2.3:32323") == 0);
  mlxd_jaccl_config_free(&c);
  /* JACCL_ names win (MLX's order), and a set ring variable counts whatever its value */
  setenv("JACCL_RANK", "0", 1);
  setenv("MLX_JACCL_RING", "0", 1);
  T_EQ_INT(mlxd_jaccl_config_load(true, &c, &st), 0);
  T_EQ_INT(c.rank, 0);
  T_ASSERT(strcmp(c.rank_var, "JACCL_RANK") == 0 && c.prefer_ring && c.topo == MLXD_JACCL_RING);
  T_ASSERT(!c.have_coord); /* not read with a caller's all-gather */
  mlxd_jaccl_config_free(&c);
  setenv("JACCL_RANK", "", 1); /* set but empty: MLX would read rank 0 */
  load_fail(true, MLXD_EINVAL, "JACCL_RANK='' is not a rank");
  setenv("JACCL_RANK", "x1", 1);
  load_fail(true, MLXD_EINVAL, "JACCL_RANK='x1' is not a rank", "decimal integer");
  setenv("JACCL_RANK", "-1", 1);
  load_fail(true, MLXD_EINVAL, "JACCL_RANK='-1' is not a rank");
  setenv("JACCL_RANK", "1 ", 1);
  load_fail(true, MLXD_EINVAL, "JACCL_RANK='1 ' is not a rank");
  setenv("JACCL_RANK", "99999999999", 1);
  load_fail(true, MLXD_EINVAL, "is not a rank");
  setenv("JACCL_RANK", "2", 1);
  load_fail(true, MLXD_EINVAL, "JACCL_RANK=2 is out of range", mesh2, "MLX_IBV_DEVICES",
            "has 2 rows, so the ranks are 0..1");
  unsetenv("JACCL_RANK");
  /* the coordinator */
  const char* bad_coord[][2] = {
      {"10.1.2.3", "has no ':port'"},           {"", "has no ':port'"},
      {"10.1.2.3:0", "invalid port '0'"},       {"10.1.2.3:70000", "invalid port '70000'"},
      {"10.1.2.3:http", "invalid port 'http'"}, {":32323", "empty or too long host part"},
      {"[::1:32323", "unbalanced '['"},
  };
  for (size_t i = 0; i < sizeof bad_coord / sizeof bad_coord[0]; i++) {
    setenv("MLX_JACCL_COORDINATOR", bad_coord[i][0], 1);
    load_fail(false, MLXD_EINVAL, "MLX_JACCL_COORDINATOR: bad coordinator address",
              bad_coord[i][1]);
  }
  setenv("JACCL_COORDINATOR", "[::1]:4000", 1); /* wins over the bad MLX_ one */
  T_EQ_INT(mlxd_jaccl_config_load(false, &c, &st), 0);
  T_ASSERT(c.have_coord && strcmp(c.coord_var, "JACCL_COORDINATOR") == 0);
  mlxd_jaccl_config_free(&c);
  unsetenv("JACCL_COORDINATOR");
  unsetenv("MLX_JACCL_COORDINATOR");
  /* the file */
  setenv("MLX_IBV_DEVICES", "", 1);
  load_fail(true, MLXD_EINVAL, "MLX_IBV_DEVICES is set but empty");
  char p[600];
  snprintf(p, sizeof p, "%s/missing.json", g_dir);
  setenv("MLX_IBV_DEVICES", p, 1);
  load_fail(true, MLXD_EINVAL, "cannot open the device matrix", p, "(MLX_IBV_DEVICES)",
            "No such file");
  setenv("MLX_IBV_DEVICES", g_dir, 1);
  load_fail(true, MLXD_EINVAL, "is a directory (expected a regular file)");
  setenv("MLX_IBV_DEVICES", "/dev/zero", 1);
  load_fail(true, MLXD_EINVAL, "is a character device");
  snprintf(p, sizeof p, "%s/huge.json", g_dir);
  int fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0644);
  T_ASSERT(fd >= 0 && ftruncate(fd, (off_t)MLXD_JACCL_MATRIX_MAX_BYTES + 1) == 0);
  close(fd);
  setenv("MLX_IBV_DEVICES", p, 1);
  load_fail(true, MLXD_EINVAL, "is 16777217 bytes (expected at most 16777216)");
  /* a matrix error names the variable, the file, the row and column */
  setenv("MLX_IBV_DEVICES", file_with("diag.json", "[[\"rxe0\", \"rxe0\"], [\"rxe0\", null]]"), 1);
  load_fail(true, MLXD_EINVAL, "[jaccl] MLX_IBV_DEVICES: device matrix '", "diag.json",
            "row 0, column 0 is on the diagonal");
  setenv("JACCL_IBV_DEVICES", file_with("gap.json", "[[null, null], [\"a\", null]]"), 1);
  load_fail(true, MLXD_EINVAL, "[jaccl] JACCL_IBV_DEVICES: device matrix '", "gap.json",
            "row 0, column 1 is empty");
  unsetenv("JACCL_IBV_DEVICES");
  /* a FIFO with no writer: refused by its kind, never opened for a blocking read */
  snprintf(p, sizeof p, "%s/fifo.json", g_dir);
  T_ASSERT(mkfifo(p, 0600) == 0);
  static bounded_result r;
  bounded_call(child_load_fifo, p, &r);
  if (r.status == -1) T_FAIL("a FIFO hung the configuration for %.0f s", BOUND_S);
  if (r.status != 3 || !strstr(r.out, "is a FIFO (named pipe) (expected a regular file)"))
    T_FAIL("FIFO: %s", r.out);
  clear_env();
  printf("env: OK\n");
}

/* ---- init, through the public API, in child processes ---- */

typedef struct init_case {
  bool strict;
  const char* bk;
  bool gather;
} init_case;

static int gather_one(void* dst, const void* src, size_t n, int rank, int size, void* payload) {
  (void)dst, (void)src, (void)n, (void)rank, (void)size, (void)payload;
  return 1; /* never called: jaccl fails before it gathers */
}

static int child_init(void* arg) {
  const init_case* c = arg;
  t_capture_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  int rc = c->gather
               ? mlx_distributed_init_with_all_gather(&g, c->strict, c->bk, gather_one, NULL, NULL)
               : mlx_distributed_init(&g, c->strict, c->bk);
  if (rc == 0) {
    const char* e = t_last_error();
    printf("INIT OK size=%d error=%s\n", mlx_distributed_group_size(g), e && *e ? e : "none");
    mlx_distributed_group_free(g);
    return 0;
  }
  printf("INIT FAILED: %s\n", t_last_error());
  return 3;
}

static void init_expect(const char* what, init_case c, const char* const env[], ...) {
  static bounded_result r;
  /* every case starts from nothing set: the child inherits this process's environment */
  clear_env();
  for (int i = 0; env && env[i]; i++) putenv((char*)env[i]);
  bounded_call(child_init, &c, &r);
  clear_env();
  unsetenv("MLXDIST_IBVERBS_LIB");
  if (r.status == -1) T_FAIL("%s: init did not return within %.0f s", what, BOUND_S);
  va_list ap;
  va_start(ap, env);
  expect_in(what, r.out, ap);
  va_end(ap);
}
#define init_expect(what, c, env, ...) init_expect(what, c, env, __VA_ARGS__, (const char*)NULL)

static int child_available(void* arg) {
  (void)arg;
  t_capture_errors();
  bool a = mlx_distributed_is_available("jaccl");
  const char* e = t_last_error();
  printf("available=%d error=%s\n", a, e && *e ? e : "none");
  return 0;
}

static void init_tests(void) {
  /* Does this machine have a usable port? Then most of this does not apply. */
  mlxd_verbs_probe* p = malloc(sizeof *p);
  T_ASSERT(p != NULL);
  mlxd_verbs_probe_run(p);
  char why[512];
  if (mlxd_verbs_usable(p, why, sizeof why)) {
    printf("init: SKIPPED: this machine has an active RDMA port (%s)\n", p->devs[0].name);
    free(p);
    exit(77);
  }
  bool have_lib = p->lib != MLXD_VERBS_NO_LIBRARY;
  printf("init: libibverbs %s here: %s\n", have_lib ? "loads" : "does not load", why);
  free(p);
  static bounded_result r;
  bounded_call(child_available, NULL, &r);
  if (!strstr(r.out, "available=0 error=none")) T_FAIL("is_available: %s", r.out);

  char e_rank[64], e_dev[700], e_coord[] = "MLX_JACCL_COORDINATOR=127.0.0.1:32323";
  char e_nolib[] = "MLXDIST_IBVERBS_LIB=/nonexistent/libibverbs.so.1";
  char e_notverbs[] = "MLXDIST_IBVERBS_LIB=libm.so.6";
  snprintf(e_rank, sizeof e_rank, "MLX_RANK=0");
  const init_case strict = {true, "jaccl", false}, loose = {false, "jaccl", false};
  const init_case strict_g = {true, "jaccl", true}, any_strict = {true, "any", false};
  const init_case any_loose = {false, "any", false}, any_loose_g = {false, "any", true};

  /* 1. the configuration's error comes first, with the probe's reason in short */
  init_expect("nothing set", strict, NULL,
              "INIT FAILED: [distributed] init: could not start the jaccl backend: [jaccl] its "
              "configuration is missing",
              "MLX_RANK, MLX_IBV_DEVICES, MLX_JACCL_COORDINATOR not set",
              have_lib ? "could not run jaccl anyway: no RDMA device)"
                       : "could not run jaccl anyway: no libibverbs)");
  const char* e1[] = {e_nolib, NULL};
  init_expect("nothing set, no library", strict, e1, "its configuration is missing",
              "could not run jaccl anyway: no libibverbs)");
  snprintf(e_dev, sizeof e_dev, "MLX_IBV_DEVICES=%s",
           file_with("bad.json", "[[null, \"rxe0\"], [\"rxe0\", 3]]"));
  const char* e2[] = {e_rank, e_dev, e_coord, NULL};
  init_expect("bad matrix", strict, e2, "[jaccl] MLX_IBV_DEVICES: device matrix '", "bad.json",
              "row 1, column 1 is a number");
  const char* e3[] = {"MLX_RANK=one", e_dev, e_coord, NULL};
  init_expect("bad rank", strict, e3, "[jaccl] MLX_RANK='one' is not a rank");
  const char* e4[] = {e_rank, e_dev, "MLX_JACCL_COORDINATOR=10.0.0.1", NULL};
  init_expect("bad coordinator first? no: the rank and matrix are read first", strict, e4,
              "row 1, column 1 is a number");
  /* 2. a device this machine does not have */
  char e_good[700];
  snprintf(e_good, sizeof e_good, "MLX_IBV_DEVICES=%s",
           file_with("good.json", "[[null, \"rxe_nowhere\"], [\"rxe_nowhere\", null]]"));
  const char* e5[] = {e_rank, e_good, e_coord, NULL};
  init_expect("missing device", strict, e5, "[jaccl] MLX_IBV_DEVICES: the device matrix '",
              "good.json", "names 'rxe_nowhere' at row 0, column 1", "no such RDMA device",
              "devices here: none");
  const char* e6[] = {e_rank, e_good, e_nolib, NULL};
  init_expect("missing device, caller's all-gather, no library", strict_g, e6,
              "names 'rxe_nowhere' at row 0, column 1", "no such RDMA device");
  /* 3. the probe's reason: a group of one names no device */
  char e_one[700];
  snprintf(e_one, sizeof e_one, "MLX_IBV_DEVICES=%s", file_with("one.json", "[[null]]"));
  const char* e7[] = {e_rank, e_one, e_coord, NULL};
  init_expect("probe", strict, e7,
              have_lib ? "[jaccl] no RDMA device: libibverbs (libibverbs.so.1) lists none"
                       : "[jaccl] no libibverbs: cannot load libibverbs.so.1");
  const char* e8[] = {e_rank, e_one, e_coord, e_nolib, NULL};
  init_expect("probe, no library", strict, e8,
              "[jaccl] no libibverbs: cannot load /nonexistent/libibverbs.so.1",
              "install libibverbs1");
  const char* e9[] = {e_rank, e_one, e_coord, e_notverbs, NULL};
  init_expect("probe, not libibverbs", strict, e9,
              "[jaccl] libm.so.6 is not a usable libibverbs: it has no ibv_get_device_list");
  /* non-strict: a group of one, silently (the contract for an unavailable backend) */
  init_expect("non-strict, configured", loose, e5, "INIT OK size=1 error=none");
  init_expect("non-strict, bad matrix", loose, e2, "INIT OK size=1 error=none");
  init_expect("non-strict, nothing set", loose, NULL, "INIT OK size=1 error=none");
  init_expect("any, non-strict", any_loose, e5, "INIT OK size=1 error=none");
  init_expect("any, non-strict, with all-gather", any_loose_g, e5, "INIT OK size=1 error=none");
  /* any, strict: jaccl's line names its configuration's error, like every other backend's */
  init_expect("any, strict", any_strict, e2, "no backend could be started",
              "jaccl: [jaccl] MLX_IBV_DEVICES: device matrix", "row 1, column 1 is a number");
  printf("init: OK\n");
}

/* ---- probe helpers ---- */

static void probe_tests(void) {
  uint8_t v4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15};
  uint8_t ll[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55};
  uint8_t zero_ff[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 10, 0, 2, 15};
  T_ASSERT(mlxd_verbs_gid_is_ipv4(v4));
  T_ASSERT(!mlxd_verbs_gid_is_ipv4(ll));
  T_ASSERT(!mlxd_verbs_gid_is_ipv4(zero_ff));
  char t[64];
  mlxd_verbs_gid_text(v4, t, sizeof t);
  T_ASSERT(strcmp(t, "::ffff:10.0.2.15") == 0);
  T_EQ_INT(mlxd_verbs_mtu_bytes(1), 256);
  T_EQ_INT(mlxd_verbs_mtu_bytes(5), 4096);
  T_EQ_INT(mlxd_verbs_mtu_bytes(0), 0);
  T_EQ_INT(mlxd_verbs_mtu_bytes(6), 0);
  T_ASSERT(strcmp(mlxd_verbs_state_name(4), "ACTIVE") == 0);
  T_ASSERT(strcmp(mlxd_verbs_state_name(1), "DOWN") == 0);
  T_ASSERT(strcmp(mlxd_verbs_state_name(99), "UNKNOWN") == 0);
  T_ASSERT(strcmp(mlxd_verbs_link_name(2), "Ethernet") == 0);
  /* the line mlxdist-info prints, and the reason for a port that is down */
  mlxd_verbs_probe* p = calloc(1, sizeof *p);
  T_ASSERT(p != NULL);
  p->ndev = 1;
  snprintf(p->devs[0].name, sizeof p->devs[0].name, "rxe0");
  p->devs[0].nports = 1;
  mlxd_verbs_port* pt = &p->devs[0].ports[0];
  *pt = (mlxd_verbs_port){
      .num = 1, .queried = true, .state = 1, .active_mtu = 1024, .link_layer = 2, .gid_index = 1};
  memcpy(pt->gid, v4, 16);
  snprintf(pt->gid_type, sizeof pt->gid_type, "RoCE v2");
  char line[256];
  mlxd_verbs_port_line(&p->devs[0], pt, line, sizeof line);
  T_ASSERT(
      strcmp(line, "rxe0 port 1: DOWN, mtu 1024, Ethernet, GID 1 ::ffff:10.0.2.15 (RoCE v2)") == 0);
  char why[256];
  T_ASSERT(!mlxd_verbs_usable(p, why, sizeof why));
  T_ASSERT(strcmp(why, "no active port: rxe0 port 1 DOWN") == 0);
  pt->state = 4;
  T_ASSERT(mlxd_verbs_usable(p, why, sizeof why));
  T_ASSERT(mlxd_verbs_active_port(&p->devs[0]) == pt);
  pt->link_layer = 1;
  pt->lid = 7;
  mlxd_verbs_port_line(&p->devs[0], pt, line, sizeof line);
  T_ASSERT(strcmp(line, "rxe0 port 1: ACTIVE, mtu 1024, InfiniBand, LID 7") == 0);
  free(p);
  printf("probe: OK\n");
}

int main(int argc, char** argv) {
  T_ASSERT(argc == 2);
  g_verbose = t_env_int("MLXDIST_TEST_VERBOSE", 0) != 0;
  snprintf(g_dir, sizeof g_dir, "/tmp/mlxdist_jaccl_XXXXXX");
  T_ASSERT(mkdtemp(g_dir) != NULL);
  if (strcmp(argv[1], "parse") == 0)
    parse_tests();
  else if (strcmp(argv[1], "env") == 0)
    env_tests();
  else if (strcmp(argv[1], "init") == 0)
    init_tests();
  else if (strcmp(argv[1], "probe") == 0)
    probe_tests();
  else
    T_FAIL("unknown mode %s", argv[1]);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) return 1;
  return 0;
}

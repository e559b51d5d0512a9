/* Inside the soft-RoCE VM (tests/vm/rxe_vm.sh): the verbs probe and jaccl's
 * init on a real RDMA device (rxe0 on eth0), never run on one before.
 *   test_vm_probe up ADDR    rxe0 port 1 is ACTIVE, mtu from active_mtu, the
 *                            GID chosen by content is ::ffff:ADDR (RoCE v2),
 *                            MLXDIST_IB_GID_INDEX overrides it;
 *                            is_available("jaccl") true; a strict init of
 *                            rank 0 of 2 with a valid matrix naming rxe0
 *                            gets as far as its peers: the coordinator names
 *                            the rank that never connected, the caller's
 *                            all-gather is called and its failure named
 *                            (both topologies);
 *                            a matrix naming a device that is not here is
 *                            named as such; non-strict falls back to size 1
 *   test_vm_probe down       (eth0 down) rxe0's port is not ACTIVE: jaccl is
 *                            unavailable and says why, strict init names the
 *                            port */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mlx/c/distributed.h"
#include "mlx/c/distributed_group.h"
#include "rdma/probe.h"
#include "testutil.h"

static const char* g_dir = "/tmp";

static void clear_env(void) {
  const char* names[] = {"MLX_RANK",
                         "JACCL_RANK",
                         "MLX_IBV_DEVICES",
                         "JACCL_IBV_DEVICES",
                         "MLX_JACCL_COORDINATOR",
                         "JACCL_COORDINATOR",
                         "MLX_JACCL_RING",
                         "JACCL_RING",
                         "MLXDIST_IB_GID_INDEX",
                         "MLXDIST_IB_PORT",
                         "MLXDIST_CONNECT_TIMEOUT"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unsetenv(names[i]);
}

static const char* matrix(const char* name, const char* text) {
  static char path[4][256];
  static int next;
  char* p = path[next++ % 4];
  snprintf(p, sizeof path[0], "%s/%s", g_dir, name);
  FILE* f = fopen(p, "w");
  T_REQUIREF(f != NULL, "cannot write %s", p);
  fputs(text, f);
  fclose(f);
  return p;
}

static int gather_never(void* dst, const void* src, size_t n, int rank, int size, void* payload) {
  (void)dst, (void)src, (void)n, (void)rank, (void)size, (void)payload;
  return 1; /* no peer runs: the init fails at the first exchange */
}

/* A strict (or not) init under the current environment; the error it reported ("" none). */
static const char* init_msg(bool strict, bool gather, int* size) {
  static char msg[2048];
  t_clear_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  int rc = gather
               ? mlx_distributed_init_with_all_gather(&g, strict, "jaccl", gather_never, NULL, NULL)
               : mlx_distributed_init(&g, strict, "jaccl");
  snprintf(msg, sizeof msg, "%s", t_error_count() ? t_last_error() : "");
  *size = rc == 0 ? mlx_distributed_group_size(g) : 0;
  if (rc == 0) mlx_distributed_group_free(g);
  printf("  init(strict=%d, %s): rc %d, size %d, error: %s\n", strict,
         gather ? "caller's all-gather" : "coordinator", rc, *size, msg[0] ? msg : "none");
  return msg;
}

static void expect_has(const char* what, const char* msg, const char* part) {
  T_CHECKF(strstr(msg, part) != NULL, "%s: '%s' lacks '%s'", what, msg, part);
}

static mlxd_verbs_probe* probe(void) {
  mlxd_verbs_probe* p = malloc(sizeof *p);
  T_ASSERT(p != NULL);
  mlxd_verbs_probe_run(p);
  return p;
}

static void up(const char* addr) {
  uint8_t want[16] = {0};
  unsigned a, b, c, d;
  T_REQUIREF(sscanf(addr, "%u.%u.%u.%u", &a, &b, &c, &d) == 4, "bad address %s", addr);
  want[10] = want[11] = 0xff, want[12] = (uint8_t)a, want[13] = (uint8_t)b;
  want[14] = (uint8_t)c, want[15] = (uint8_t)d;

  /* the probe */
  mlxd_verbs_probe* p = probe();
  T_REQUIREF(p->lib == MLXD_VERBS_OK, "libibverbs: %s %s", p->lib_name, p->lib_err);
  const mlxd_verbs_dev* dev = mlxd_verbs_find(p, "rxe0");
  T_REQUIREF(dev != NULL, "no rxe0 among %d device(s)", p->ndev);
  T_CHECKF(dev->err[0] == '\0', "rxe0: %s", dev->err);
  T_REQUIRE(dev->nports == 1);
  const mlxd_verbs_port* pt = &dev->ports[0];
  char line[512];
  mlxd_verbs_port_line(dev, pt, line, sizeof line);
  printf("probe: %s\n", line);
  T_CHECK(pt->queried);
  T_CHECK_EQ(pt->num, 1);
  T_CHECKF(pt->state == 4, "state %s", mlxd_verbs_state_name(pt->state));
  T_CHECK(mlxd_verbs_active_port(dev) == pt);
  /* eth0's MTU is 1500: the largest IB MTU below it is 1024 */
  T_CHECK_EQ(pt->active_mtu, 1024);
  T_CHECK_EQ(pt->link_layer, 2);
  T_CHECKF(pt->gid_tbl_len > 1, "gid_tbl_len %d", pt->gid_tbl_len);
  T_CHECKF(pt->gid_index >= 0 && memcmp(pt->gid, want, 16) == 0, "GID %d is not ::ffff:%s",
           pt->gid_index, addr);
  T_CHECKF(strcmp(pt->gid_type, "RoCE v2") == 0, "GID type '%s'", pt->gid_type);
  T_CHECKF(pt->err[0] == '\0', "port error: %s", pt->err);
  char why[1024];
  T_CHECKF(mlxd_verbs_usable(p, why, sizeof why), "not usable: %s", why);
  int chosen = pt->gid_index;
  free(p);

  /* MLXDIST_IB_GID_INDEX forces an entry: index 0 is the link-local fe80:: GID (not IPv4) */
  setenv("MLXDIST_IB_GID_INDEX", chosen == 0 ? "1" : "0", 1);
  p = probe();
  dev = mlxd_verbs_find(p, "rxe0");
  T_REQUIRE(dev != NULL && dev->nports == 1);
  mlxd_verbs_port_line(dev, &dev->ports[0], line, sizeof line);
  printf("probe, MLXDIST_IB_GID_INDEX=%s: %s\n", getenv("MLXDIST_IB_GID_INDEX"), line);
  T_CHECK_EQ(dev->ports[0].gid_index, chosen == 0 ? 1 : 0);
  T_CHECK(memcmp(dev->ports[0].gid, want, 16) != 0);
  free(p);
  setenv("MLXDIST_IB_GID_INDEX", "1000", 1); /* an empty entry: named, never used */
  p = probe();
  dev = mlxd_verbs_find(p, "rxe0");
  T_REQUIRE(dev != NULL && dev->nports == 1);
  printf("probe, MLXDIST_IB_GID_INDEX=1000: %s\n", dev->ports[0].err);
  expect_has("empty GID entry", dev->ports[0].err,
             "MLXDIST_IB_GID_INDEX=1000 is an empty entry of the port's GID table");
  T_CHECK_EQ(dev->ports[0].gid_index, -1);
  T_CHECK(mlxd_verbs_active_port(dev) == NULL); /* active, but no address: not usable */
  T_CHECK(!mlxd_verbs_usable(p, why, sizeof why));
  expect_has("no usable port", why, "rxe0 port 1 ACTIVE but without a GID");
  free(p);
  setenv("MLXDIST_IB_PORT", "2", 1); /* rxe has one port */
  p = probe();
  dev = mlxd_verbs_find(p, "rxe0");
  T_REQUIRE(dev != NULL);
  printf("probe, MLXDIST_IB_PORT=2: %s\n", dev->err);
  T_CHECK_EQ(dev->nports, 0);
  expect_has("MLXDIST_IB_PORT=2", dev->err, "MLXDIST_IB_PORT=2 but the device has 1 port(s)");
  free(p);
  clear_env();

  /* the public API */
  t_clear_errors();
  T_CHECK(mlx_distributed_is_available("jaccl"));
  T_CHECKF(t_error_count() == 0, "is_available reported: %s", t_last_error());

  int size;
  const char* m2 = matrix("mesh2.json", "[[null, \"rxe0\"], [\"rxe0\", null]]");
  setenv("MLX_RANK", "0", 1);
  setenv("MLX_IBV_DEVICES", m2, 1);
  setenv("MLX_JACCL_COORDINATOR", "10.0.2.15:32323", 1);
  setenv("MLXDIST_CONNECT_TIMEOUT", "1", 1);
  const char* msg = init_msg(true, false, &size);
  expect_has("valid mesh", msg,
             "rank 1 did not connect to this rank (0, listening on 10.0.2.15:32323) within 1 s");
  unsetenv("MLX_JACCL_COORDINATOR");
  msg = init_msg(true, true, &size);
  expect_has("valid mesh, all-gather", msg, "the all_gather callback returned 1");
  setenv("MLX_JACCL_RING", "1", 1);
  setenv("MLX_RANK", "2", 1);
  setenv("MLX_IBV_DEVICES",
         matrix("ring4.json",
                "[[null,\"rxe0\",null,\"rxe0\"],[\"rxe0\",null,\"rxe0\",null],"
                "[null,\"rxe0\",null,\"rxe0\"],[\"rxe0\",null,\"rxe0\",null]]"),
         1);
  msg = init_msg(true, true, &size);
  expect_has("valid ring", msg, "the all_gather callback returned 1");
  unsetenv("MLXDIST_CONNECT_TIMEOUT");
  unsetenv("MLX_JACCL_RING");
  setenv("MLX_RANK", "0", 1);
  setenv("MLX_IBV_DEVICES", m2, 1);
  msg = init_msg(false, true, &size);
  T_CHECKF(size == 1 && msg[0] == '\0', "non-strict: size %d, error '%s'", size, msg);

  const char* bad = matrix("bad.json", "[[null, [\"rxe0\", \"mlx5_9\"]], [\"rxe0\", null]]");
  setenv("MLX_IBV_DEVICES", bad, 1);
  msg = init_msg(true, true, &size);
  expect_has("missing device", msg,
             "names 'mlx5_9' at row 0, column 1 (rank 0's device to rank 1)");
  expect_has("missing device", msg, "this machine has no such RDMA device (devices here: rxe0;");
  clear_env();
}

static void down(void) {
  mlxd_verbs_probe* p = probe();
  const mlxd_verbs_dev* dev = mlxd_verbs_find(p, "rxe0");
  T_REQUIRE(dev != NULL && dev->nports == 1);
  char line[512], why[1024];
  mlxd_verbs_port_line(dev, &dev->ports[0], line, sizeof line);
  printf("probe: %s\n", line);
  T_CHECKF(dev->ports[0].queried && dev->ports[0].state != 4, "state %s",
           mlxd_verbs_state_name(dev->ports[0].state));
  T_CHECK(!mlxd_verbs_usable(p, why, sizeof why));
  printf("usable: no: %s\n", why);
  expect_has("port down", why, "no active port: rxe0 port 1 DOWN");
  free(p);
  t_clear_errors();
  T_CHECK(!mlx_distributed_is_available("jaccl"));
  setenv("MLX_RANK", "1", 1);
  setenv("MLX_IBV_DEVICES", matrix("mesh2.json", "[[null, \"rxe0\"], [\"rxe0\", null]]"), 1);
  int size;
  const char* msg = init_msg(true, true, &size);
  expect_has("port down", msg, "device 'rxe0' (row 1, column 0 of '");
  expect_has("port down", msg, "has no active port (port 1 DOWN)");
  clear_env();
}

int main(int argc, char** argv) {
  t_capture_errors();
  clear_env();
  const char* t = getenv("TMPDIR");
  if (t && *t) g_dir = t;
  if (argc == 3 && strcmp(argv[1], "up") == 0) {
    up(argv[2]);
  } else if (argc == 2 && strcmp(argv[1], "down") == 0) {
    down();
  } else {
    fprintf(stderr, "usage: test_vm_probe up ADDR | down\n");
    return 2;
  }
  return t_exit_status();
}

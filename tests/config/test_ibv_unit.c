/* The verbs device layer's parts that need no RDMA device (rdma/ibv.h):
 *   qpinfo   a queue pair address encoded and decoded back (InfiniBand and
 *            RoCE, the limits of every field), and every malformed record
 *            refused with a message naming `what` and the bad field
 *   memlock  mlxd_ibv_memlock_check under a small RLIMIT_MEMLOCK (a child
 *            process sets it): with CAP_IPC_LOCK (root) it passes; without
 *            it (dropped) the numbers and the fix are named; unlimited and
 *            large enough pass
 *   nodev    opening a device without a library, with a library that is
 *            not libibverbs, and (here, where no device is) a device that is
 *            not there: each named (MLXD_LAYER_VERBS) */
#include <errno.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rdma/ibv.h"
#include "rdma/probe.h"
#include "testutil.h"

static void expect_has(const char* what, const char* msg, const char* part) {
  T_CHECKF(strstr(msg, part) != NULL, "%s: '%s' lacks '%s'", what, msg, part);
}

static void round_trip(const mlxd_ibv_qp_info* q) {
  unsigned char rec[MLXD_IBV_QP_INFO_BYTES];
  memset(rec, 0xaa, sizeof rec);
  mlxd_ibv_qp_info_encode(rec, q);
  mlxd_ibv_qp_info back;
  memset(&back, 0x55, sizeof back);
  mlxd_status st = {0};
  T_REQUIREF(mlxd_ibv_qp_info_decode(rec, "round trip", &back, &st) == 0, "%s", st.msg);
  T_CHECK_EQ(back.qpn, q->qpn);
  T_CHECK_EQ(back.psn, q->psn);
  T_CHECK_EQ(back.lid, q->lid);
  T_CHECK_EQ(back.global, q->global);
  T_CHECK_EQ(back.mtu, q->mtu);
  if (q->global) {
    T_CHECK(memcmp(back.gid, q->gid, 16) == 0);
  } else {
    static const uint8_t zero[16];
    T_CHECK(memcmp(back.gid, zero, 16) == 0);
  }
  /* a fixed big-endian layout: the qpn's bytes at 4..7 */
  T_CHECK_EQ(rec[4], 0);
  T_CHECK_EQ(rec[5], (q->qpn >> 16) & 0xff);
  T_CHECK_EQ(rec[7], q->qpn & 0xff);
}

/* rec with one change refused, the message holding part */
static void refused(const unsigned char good[MLXD_IBV_QP_INFO_BYTES], int at, unsigned char v,
                    const char* part) {
  unsigned char rec[MLXD_IBV_QP_INFO_BYTES];
  memcpy(rec, good, sizeof rec);
  if (at >= 0) rec[at] = v;
  mlxd_ibv_qp_info q;
  mlxd_status st = {0};
  int rc = mlxd_ibv_qp_info_decode(rec, "rank 2's queue pair for rank 0, rail 1", &q, &st);
  printf("  byte %d = %#x: %s\n", at, v, rc ? st.msg : "accepted");
  T_CHECKF(rc == MLXD_EINVAL, "byte %d = %#x: rc %d", at, v, rc);
  T_CHECK_EQ(st.layer, MLXD_LAYER_VERBS);
  expect_has("refusal", st.msg, "rank 2's queue pair for rank 0, rail 1: ");
  expect_has("refusal", st.msg, part);
}

static void qpinfo(void) {
  mlxd_ibv_qp_info roce = {.qpn = 0x11, .psn = 0xabcdef, .global = 1, .mtu = 3};
  const uint8_t g[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15};
  memcpy(roce.gid, g, 16);
  round_trip(&roce);
  mlxd_ibv_qp_info ib = {.qpn = 0xffffff, .psn = 0, .lid = 0xffff, .global = 0, .mtu = 5};
  round_trip(&ib);
  ib.qpn = 2, ib.psn = 0xffffff, ib.lid = 1, ib.mtu = 1;
  round_trip(&ib);
  roce.lid = 7; /* a LID beside a GID is carried (RoCE ports report 0) */
  round_trip(&roce);

  unsigned char good[MLXD_IBV_QP_INFO_BYTES], good_ib[MLXD_IBV_QP_INFO_BYTES];
  roce.lid = 0;
  mlxd_ibv_qp_info_encode(good, &roce);
  mlxd_ibv_qp_info_encode(good_ib, &ib);
  printf("refusals:\n");
  refused(good, 0, 0, "version byte 0");
  refused(good, 0, 2, "version byte 2");
  refused(good, 3, 1, "reserved bytes are not zero");
  refused(good, 14, 1, "reserved bytes are not zero");
  refused(good, 15, 0x80, "reserved bytes are not zero");
  refused(good, 1, 2, "global flag 2 (want 0 or 1)");
  refused(good, 2, 0, "mtu 0 is not an IB MTU");
  refused(good, 2, 6, "mtu 6 is not an IB MTU");
  refused(good, 4, 1, "queue pair number 16777233 is not one of a connected queue pair");
  unsigned char r[MLXD_IBV_QP_INFO_BYTES];
  memcpy(r, good, sizeof r);
  r[7] = 1; /* qpn 1: the GSI */
  refused(r, 6, 0, "queue pair number 1 is not one of a connected queue pair");
  r[7] = 0;
  refused(r, 6, 0, "queue pair number 0 is not");
  refused(good, 8, 1, "packet sequence number 28036591 is past 24 bits");
  /* InfiniBand: LID 0 */
  memcpy(r, good_ib, sizeof r);
  r[12] = 0;
  refused(r, 13, 0, "LID 0 on a path that is not global");
  refused(good_ib, 20, 1, "a GID on a path that is not global");
  /* RoCE with an all-zero GID */
  memcpy(r, good, sizeof r);
  memset(r + 16, 0, 16);
  refused(r, -1, 0, "a global (RoCE) path with an all-zero GID");
  /* a NULL what still says what it is */
  mlxd_ibv_qp_info q;
  mlxd_status st = {0};
  memcpy(r, good, sizeof r);
  r[2] = 9;
  T_CHECK(mlxd_ibv_qp_info_decode(r, NULL, &q, &st) == MLXD_EINVAL);
  expect_has("no what", st.msg, "a queue pair address: mtu 9");
}

static bool has_ipc_lock(void) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct c[2];
  T_REQUIRE(syscall(SYS_capget, &h, c) == 0);
  return (c[0].effective >> CAP_IPC_LOCK) & 1u;
}

static void drop_ipc_lock(void) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct c[2];
  T_REQUIRE(syscall(SYS_capget, &h, c) == 0);
  c[0].effective &= ~(1u << CAP_IPC_LOCK);
  c[0].permitted &= ~(1u << CAP_IPC_LOCK);
  c[0].inheritable &= ~(1u << CAP_IPC_LOCK);
  T_REQUIREF(syscall(SYS_capset, &h, c) == 0, "capset: %s", strerror(errno));
  T_REQUIRE(!has_ipc_lock());
}

static void memlock(void) {
  fflush(stdout);
  pid_t p = fork();
  T_REQUIRE(p >= 0);
  if (p == 0) {
    struct rlimit rl = {8192, 8192};
    T_REQUIRE(setrlimit(RLIMIT_MEMLOCK, &rl) == 0);
    mlxd_status st = {0};
    /* with CAP_IPC_LOCK (root) the kernel pins past the limit: the check passes */
    if (has_ipc_lock()) {
      T_CHECKF(mlxd_ibv_memlock_check(1 << 20, &st) == 0, "with CAP_IPC_LOCK: %s", st.msg);
      printf("memlock 1 MiB under 8192 with CAP_IPC_LOCK: passes\n");
    }
    drop_ipc_lock(); /* then the limit counts */
    T_CHECK(mlxd_ibv_memlock_check(0, &st) == 0);
    T_CHECK(mlxd_ibv_memlock_check(8192, &st) == 0);
    T_CHECK(mlxd_ibv_memlock_check(8193, &st) == MLXD_EUNAVAIL);
    printf("memlock 8193 under 8192: %s\n", st.msg);
    T_CHECK_EQ(st.layer, MLXD_LAYER_VERBS);
    expect_has(
        "memlock", st.msg,
        "RDMA needs 8193 bytes locked in memory and RLIMIT_MEMLOCK (soft) allows 8192 bytes");
    expect_has("memlock", st.msg, "'ulimit -l unlimited'");
    expect_has("memlock", st.msg, "LimitMEMLOCK=infinity");
    expect_has("memlock", st.msg, "/etc/security/limits.conf");
    rl.rlim_cur = RLIM_INFINITY;
    rl.rlim_max = RLIM_INFINITY;
    if (setrlimit(RLIMIT_MEMLOCK, &rl) == 0) /* root may raise it back */
      T_CHECK(mlxd_ibv_memlock_check((size_t)1 << 40, &st) == 0);
    _exit(t_exit_status());
  }
  int ws = 0;
  T_REQUIRE(waitpid(p, &ws, 0) == p);
  T_CHECKF(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "memlock child: status %#x", ws);
}

static void nodev(void) {
  mlxd_ibv_dev* d = (mlxd_ibv_dev*)&d; /* must be set to NULL */
  mlxd_status st = {0};
  setenv("MLXDIST_IBVERBS_LIB", "/nonexistent/libibverbs.so.1", 1);
  T_CHECK(mlxd_ibv_dev_open("rxe0", 16, &d, &st) == MLXD_EUNAVAIL && d == NULL);
  printf("no library: %s\n", st.msg);
  expect_has("no library", st.msg, "no libibverbs: cannot load /nonexistent/libibverbs.so.1");
  T_CHECK_EQ(st.layer, MLXD_LAYER_VERBS);
  setenv("MLXDIST_IBVERBS_LIB", "libm.so.6", 1);
  mlxd_status_clear(&st);
  T_CHECK(mlxd_ibv_dev_open("rxe0", 16, &d, &st) == MLXD_EUNAVAIL);
  printf("not libibverbs: %s\n", st.msg);
  expect_has("libm", st.msg, "libm.so.6 is not a usable libibverbs: it has no ibv_get_device_list");
  unsetenv("MLXDIST_IBVERBS_LIB");
  /* the probe still answers the same after the device layer loaded the library */
  mlxd_verbs_probe* p = malloc(sizeof *p);
  T_REQUIRE(p != NULL);
  mlxd_verbs_probe_run(p);
  char why[512];
  bool usable = mlxd_verbs_usable(p, why, sizeof why);
  printf("probe: %s\n", usable ? "a usable device" : why);
  mlxd_status_clear(&st);
  int rc = mlxd_ibv_dev_open("mlxd_no_such_dev", 16, &d, &st);
  printf("a device that is not here: %s\n", st.msg);
  T_CHECK(rc == MLXD_EUNAVAIL && d == NULL);
  if (p->lib == MLXD_VERBS_NO_LIBRARY)
    expect_has("no such device", st.msg, "no libibverbs");
  else
    expect_has("no such device", st.msg, "no RDMA device 'mlxd_no_such_dev' on this machine");
  mlxd_status_clear(&st);
  T_CHECK(mlxd_ibv_dev_open("", 16, &d, &st) ==
          (p->lib == MLXD_VERBS_NO_LIBRARY ? MLXD_EUNAVAIL : MLXD_EINVAL));
  free(p);
  mlxd_ibv_dev_close(NULL); /* no-ops */
  mlxd_ibv_qp_destroy(NULL);
  mlxd_ibv_mr mr = {0};
  mlxd_ibv_dereg(&mr);
  T_CHECK_EQ(mlxd_ibv_fd(NULL), -1);
  T_CHECK(strcmp(mlxd_ibv_wc_status_str(0), "") != 0);
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc != 2) {
    fprintf(stderr, "usage: test_ibv_unit qpinfo|memlock|nodev\n");
    return 2;
  }
  if (strcmp(argv[1], "qpinfo") == 0)
    qpinfo();
  else if (strcmp(argv[1], "memlock") == 0)
    memlock();
  else if (strcmp(argv[1], "nodev") == 0)
    nodev();
  else
    return 2;
  return t_exit_status();
}

/* The device layer of the verbs transport (ibv.h): devices opened for data,
 * registered memory, RC queue pairs, posting and polling, over libibverbs
 * loaded at run time (rdma/lib.h) with the ABI of rdma/abi.h. The inline
 * entry points of <infiniband/verbs.h> (ibv_poll_cq, ibv_req_notify_cq,
 * ibv_post_send, ibv_post_recv) are the provider's ops table, called here
 * the way the header's inline functions call it. See docs/jaccl.md. */
#include "rdma/ibv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/capability.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "rdma/abi.h"
#include "rdma/lib.h"
#include "rdma/probe.h"
#include "util/tunables.h"

#define RD_ATOMIC 4 /* outstanding RDMA reads per queue pair, each way (clamped by the device) */
#define MIN_RNR_TIMER 12 /* 0.64 ms before a receiver-not-ready retry */
#define RNR_RETRY 7      /* 7: retry without limit (the transport keeps receives posted) */
#define HOP_LIMIT 64

/* The library of the devices opened (for the calls that have no device at
 * hand: dereg, wc_status_str); every device of a process uses it. */
static _Atomic(const mlxd_verbs_lib*) g_lib;

static const mlxd_verbs_lib* dev_lib(void) {
  const mlxd_verbs_lib* L = atomic_load(&g_lib);
  return L ? L : mlxd_verbs_lib_get(NULL);
}

struct mlxd_ibv_dev {
  const mlxd_verbs_lib* L;
  char name[64];
  struct mlxd_abi_context* ctx;
  struct mlxd_abi_pd* pd;
  struct mlxd_abi_comp_channel* ch;
  struct mlxd_abi_cq* cq;
  int port;        /* 1-based */
  int link_layer;  /* MLXD_ABI_LINK_LAYER_* */
  int mtu;         /* enum ibv_mtu of the port's active MTU (1..5) */
  uint16_t lid;    /* InfiniBand */
  int gid_index;   /* Ethernet: the GID chosen (-1 on InfiniBand) */
  uint8_t gid[16]; /* that GID */
  int rd_atomic;   /* RD_ATOMIC clamped by the device's limits */
  int max_qp_wr;
  int max_cqe;
};

struct mlxd_ibv_qp {
  mlxd_ibv_dev* d;
  struct mlxd_abi_qp* qp;
  uint32_t psn; /* our first packet sequence number */
  uint8_t mtu;  /* our port's enum ibv_mtu */
};

/* ---- errors ---- */

/* A failed ibv_* call on d: "<dev>: <call> failed<detail>" with errno. */
static int fail_call(mlxd_status* st, const char* dev, const char* call, int err,
                     const char* detail) {
  int code = err == ENOMEM ? MLXD_ENOMEM : MLXD_ESYS;
  mlxd_fail_at(st, code, MLXD_LAYER_VERBS, "%s: %s failed%s", dev, call, detail ? detail : "");
  mlxd_status_set_sys(st, call, err ? err : EIO);
  return code;
}

/* What a provider's ops call returned as an errno: a positive value is one;
 * -1 (some providers) leaves it in errno. */
static int op_errno(int rc) {
  if (rc > 0) return rc;
  return errno ? errno : EIO;
}

/* ---- devices ---- */

static int mtu_enum(int bytes) {
  for (int e = 1; e <= 5; e++)
    if ((128 << e) == bytes) return e;
  return 0;
}

/* The first usable port (or MLXDIST_IB_PORT's), as the probe chooses it;
 * else an error naming every port's state. */
static int choose_port(mlxd_ibv_dev* d, mlxd_status* st) {
  mlxd_abi_device_attr da;
  memset(&da, 0, sizeof da);
  errno = 0;
  int rc = d->L->query_device(d->ctx, &da);
  if (rc != 0) return fail_call(st, d->name, "ibv_query_device", op_errno(rc), NULL);
  d->max_qp_wr = da.max_qp_wr;
  d->max_cqe = da.max_cqe;
  int lim = da.max_qp_rd_atom < da.max_qp_init_rd_atom ? da.max_qp_rd_atom : da.max_qp_init_rd_atom;
  d->rd_atomic = lim < RD_ATOMIC ? lim : RD_ATOMIC;
  if (d->rd_atomic < 1) d->rd_atomic = 1;
  long only = mlxd_tunable_long(MLXD_T_IB_PORT);
  int np = da.phys_port_cnt;
  if (only > np)
    return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_VERBS,
                        "%s: MLXDIST_IB_PORT=%ld but the device has %d port(s)", d->name, only, np);
  char states[256] = "";
  size_t used = 0;
  for (int k = 1; k <= np; k++) {
    if (only > 0 && k != only) continue;
    mlxd_verbs_port pt;
    mlxd_verbs_query_port(d->L, d->ctx, d->name, k, &pt);
    bool usable = pt.queried && pt.state == MLXD_ABI_PORT_ACTIVE &&
                  (pt.link_layer == MLXD_ABI_LINK_LAYER_INFINIBAND || pt.gid_index >= 0) &&
                  mtu_enum(pt.active_mtu) != 0;
    if (usable) {
      d->port = k;
      d->link_layer = pt.link_layer;
      d->mtu = mtu_enum(pt.active_mtu);
      d->lid = pt.lid;
      d->gid_index = pt.link_layer == MLXD_ABI_LINK_LAYER_INFINIBAND ? -1 : pt.gid_index;
      memcpy(d->gid, pt.gid, 16);
      if (d->gid_index > 255) /* the address vector's sgid_index is 8 bits */
        return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_VERBS,
                            "%s: port %d's GID is at index %d, past the 255 a queue pair can use "
                            "(set MLXDIST_IB_GID_INDEX to a lower entry holding the address)",
                            d->name, k, d->gid_index);
      if (d->link_layer == MLXD_ABI_LINK_LAYER_INFINIBAND && d->lid == 0)
        return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_VERBS,
                            "%s: port %d is ACTIVE on InfiniBand but has no LID (is a subnet "
                            "manager running?)",
                            d->name, k);
      return 0;
    }
    if (used < sizeof states) {
      int w = snprintf(states + used, sizeof states - used, "%sport %d %s%s%s", used ? ", " : "", k,
                       mlxd_verbs_port_word(&pt), pt.err[0] ? ": " : "", pt.err);
      if (w > 0) used += (size_t)w;
    }
  }
  return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_VERBS, "%s has no active port (%s)", d->name,
                      used ? states : "no port");
}

int mlxd_ibv_dev_open(const char* name, int cq_depth, mlxd_ibv_dev** out, mlxd_status* st) {
  *out = NULL;
  mlxd_verbs_lib_err le;
  const mlxd_verbs_lib* L = mlxd_verbs_lib_get(&le);
  if (!L)
    return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_VERBS,
                        le.loaded ? "%s is not a usable libibverbs: %s"
                                  : "no libibverbs: cannot load %s (%s)",
                        le.name, le.err);
  if (!name || !name[0] || strlen(name) >= 64)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS, "'%s' is not an RDMA device name",
                        name ? name : "(null)");
  if (cq_depth < 1)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS, "%s: a completion queue of %d entries",
                        name, cq_depth);
  mlxd_ibv_dev* d = calloc(1, sizeof *d);
  if (!d) return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_VERBS, "%s: out of memory", name);
  d->L = L;
  atomic_store(&g_lib, L);
  snprintf(d->name, sizeof d->name, "%s", name);

  int n = 0;
  errno = 0;
  struct mlxd_abi_device** list = L->get_device_list(&n);
  if (!list) {
    int e = errno ? errno : ENODEV;
    free(d);
    mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_VERBS,
                 "no RDMA device '%s' on this machine: libibverbs (%s) lists none", name, L->name);
    mlxd_status_set_sys(st, "ibv_get_device_list", e);
    return MLXD_EUNAVAIL;
  }
  struct mlxd_abi_device* dev = NULL;
  char seen[200] = "";
  size_t used = 0;
  for (int i = 0; i < n && list[i]; i++) {
    const char* nm = L->get_device_name(list[i]);
    if (nm && strcmp(nm, name) == 0) dev = list[i];
    if (nm && used < sizeof seen) {
      int w = snprintf(seen + used, sizeof seen - used, "%s%s", used ? ", " : "", nm);
      if (w > 0) used += (size_t)w;
    }
  }
  if (!dev) {
    L->free_device_list(list);
    free(d);
    return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_VERBS,
                        "no RDMA device '%s' on this machine (devices here: %s)", name,
                        used ? seen : "none");
  }
  errno = 0;
  d->ctx = L->open_device(dev);
  int e = errno;
  L->free_device_list(list); /* an opened context keeps its device */
  if (!d->ctx) {
    free(d);
    return fail_call(st, name, "ibv_open_device", e ? e : ENODEV,
                     " (permissions on /dev/infiniband?)");
  }
  int rc = choose_port(d, st);
  if (rc != 0) {
    mlxd_ibv_dev_close(d);
    return rc;
  }
  if (d->max_cqe > 0 && cq_depth > d->max_cqe) cq_depth = d->max_cqe;

  errno = 0;
  d->pd = L->alloc_pd(d->ctx);
  if (!d->pd) rc = fail_call(st, name, "ibv_alloc_pd", errno, NULL);
  if (rc == 0) {
    errno = 0;
    d->ch = L->create_comp_channel(d->ctx);
    if (!d->ch) rc = fail_call(st, name, "ibv_create_comp_channel", errno, NULL);
  }
  if (rc == 0) {
    int fl = fcntl(d->ch->fd, F_GETFL);
    if (fl < 0 || fcntl(d->ch->fd, F_SETFL, fl | O_NONBLOCK) != 0)
      rc = fail_call(st, name, "fcntl", errno, " (making the completion channel non-blocking)");
  }
  if (rc == 0) {
    errno = 0;
    d->cq = L->create_cq(d->ctx, cq_depth, NULL, d->ch, 0);
    if (!d->cq) {
      char detail[64];
      snprintf(detail, sizeof detail, " (%d entries)", cq_depth);
      rc = fail_call(st, name, "ibv_create_cq", errno, detail);
    }
  }
  if (rc != 0) {
    mlxd_ibv_dev_close(d);
    return rc;
  }
  *out = d;
  return 0;
}

void mlxd_ibv_dev_close(mlxd_ibv_dev* d) {
  if (!d) return;
  if (d->cq) {
    mlxd_ibv_ack(d); /* events read but not acknowledged would make destroy wait */
    d->L->destroy_cq(d->cq);
  }
  if (d->ch) d->L->destroy_comp_channel(d->ch);
  if (d->pd) d->L->dealloc_pd(d->pd);
  if (d->ctx) d->L->close_device(d->ctx);
  free(d);
}

const char* mlxd_ibv_dev_name(const mlxd_ibv_dev* d) { return d->name; }

int mlxd_ibv_dev_mtu(const mlxd_ibv_dev* d) { return 128 << d->mtu; }

/* ---- registered memory ---- */

/* "RLIMIT_MEMLOCK allows N bytes" and the fix, for an error message. */
static void memlock_words(size_t need, char* buf, size_t len) {
  struct rlimit rl;
  char lim[64];
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
    snprintf(lim, sizeof lim, "an unknown number of");
  else if (rl.rlim_cur == RLIM_INFINITY)
    snprintf(lim, sizeof lim, "unlimited");
  else
    snprintf(lim, sizeof lim, "%llu", (unsigned long long)rl.rlim_cur);
  snprintf(
      buf, len,
      "RDMA needs %zu bytes locked in memory and RLIMIT_MEMLOCK (soft) allows %s bytes; "
      "raise it: 'ulimit -l unlimited' in the shell that starts the job, LimitMEMLOCK=infinity "
      "in a systemd unit, a '* - memlock unlimited' line in /etc/security/limits.conf, or "
      "docker run --ulimit memlock=-1",
      need, lim);
}

/* CAP_IPC_LOCK in the effective set: the kernel then pins registered memory
 * past RLIMIT_MEMLOCK (ib_umem_get checks the limit only without it). */
static bool may_lock_past_limit(void) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct c[2];
  memset(c, 0, sizeof c);
  if (syscall(SYS_capget, &h, c) != 0) return false;
  return (c[CAP_IPC_LOCK / 32].effective >> (CAP_IPC_LOCK % 32)) & 1u;
}

int mlxd_ibv_memlock_check(size_t need, mlxd_status* st) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
    mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_VERBS, "cannot read RLIMIT_MEMLOCK");
    mlxd_status_set_sys(st, "getrlimit", errno);
    return MLXD_ESYS;
  }
  if (rl.rlim_cur == RLIM_INFINITY || (unsigned long long)rl.rlim_cur >= (unsigned long long)need)
    return 0;
  if (may_lock_past_limit()) return 0;
  char w[400];
  memlock_words(need, w, sizeof w);
  return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_VERBS, "%s", w);
}

int mlxd_ibv_reg(mlxd_ibv_dev* d, void* addr, size_t len, int remote, mlxd_ibv_mr* out,
                 mlxd_status* st) {
  memset(out, 0, sizeof *out);
  if (!addr || len == 0 || (remote & ~(MLXD_IBV_REMOTE_WRITE | MLXD_IBV_REMOTE_READ)))
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS,
                        "%s: cannot register %zu bytes at %p (remote access bits %#x)", d->name,
                        len, addr, (unsigned)remote);
  int access = MLXD_ABI_ACCESS_LOCAL_WRITE;
  if (remote & MLXD_IBV_REMOTE_WRITE) access |= MLXD_ABI_ACCESS_REMOTE_WRITE;
  if (remote & MLXD_IBV_REMOTE_READ) access |= MLXD_ABI_ACCESS_REMOTE_READ;
  errno = 0;
  struct mlxd_abi_mr* mr = d->L->reg_mr(d->pd, addr, len, access);
  if (!mr) {
    int e = errno ? errno : EIO;
    char detail[480];
    if (e == ENOMEM || e == EPERM || e == EFAULT) {
      char w[400];
      memlock_words(len, w, sizeof w);
      snprintf(detail, sizeof detail, " (registering %zu bytes): %s", len, w);
    } else {
      snprintf(detail, sizeof detail, " (registering %zu bytes)", len);
    }
    return fail_call(st, d->name, "ibv_reg_mr", e, detail);
  }
  out->addr = addr;
  out->len = len;
  out->lkey = mr->lkey;
  out->rkey = mr->rkey;
  out->handle = mr;
  return 0;
}

void mlxd_ibv_dereg(mlxd_ibv_mr* mr) {
  if (!mr || !mr->handle) return;
  struct mlxd_abi_mr* m = mr->handle;
  const mlxd_verbs_lib* L = dev_lib();
  if (L) L->dereg_mr(m);
  memset(mr, 0, sizeof *mr);
}

/* ---- queue pair addresses ---- */

static void put32(unsigned char* p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}
static uint32_t get32(const unsigned char* p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Layout (32 bytes, big-endian): [0] version 1, [1] global, [2] mtu,
 * [3] zero, [4..7] qpn, [8..11] psn, [12..13] lid, [14..15] zero,
 * [16..31] gid (zero when not global). */
#define QP_INFO_VERSION 1

void mlxd_ibv_qp_info_encode(unsigned char out[MLXD_IBV_QP_INFO_BYTES], const mlxd_ibv_qp_info* q) {
  memset(out, 0, MLXD_IBV_QP_INFO_BYTES);
  out[0] = QP_INFO_VERSION;
  out[1] = q->global;
  out[2] = q->mtu;
  put32(out + 4, q->qpn);
  put32(out + 8, q->psn);
  out[12] = (unsigned char)(q->lid >> 8), out[13] = (unsigned char)q->lid;
  if (q->global) memcpy(out + 16, q->gid, 16);
}

int mlxd_ibv_qp_info_decode(const unsigned char in[MLXD_IBV_QP_INFO_BYTES], const char* what,
                            mlxd_ibv_qp_info* q, mlxd_status* st) {
  memset(q, 0, sizeof *q);
  if (!what) what = "a queue pair address";
  if (in[0] != QP_INFO_VERSION)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS,
                        "%s: not a queue pair address of this version (version byte %u, want %u)",
                        what, in[0], QP_INFO_VERSION);
  if (in[3] != 0 || in[14] != 0 || in[15] != 0)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS,
                        "%s: reserved bytes are not zero (a corrupt record)", what);
  uint32_t qpn = get32(in + 4), psn = get32(in + 8);
  uint16_t lid = (uint16_t)(in[12] << 8 | in[13]);
  if (in[1] > 1)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS, "%s: global flag %u (want 0 or 1)", what,
                        in[1]);
  if (in[2] < 1 || in[2] > 5)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS,
                        "%s: mtu %u is not an IB MTU (1..5: 256..4096 bytes)", what, in[2]);
  if (qpn > 0xffffff || qpn < 2)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS,
                        "%s: queue pair number %" PRIu32
                        " is not one of a connected queue pair (2..16777215)",
                        what, qpn);
  if (psn > 0xffffff)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS,
                        "%s: packet sequence number %" PRIu32 " is past 24 bits", what, psn);
  bool gid_zero = true;
  for (int i = 16; i < 32; i++)
    if (in[i]) gid_zero = false;
  if (in[1] == 0 && lid == 0)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS,
                        "%s: LID 0 on a path that is not global (an InfiniBand port has a LID)",
                        what);
  if (in[1] == 0 && !gid_zero)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS,
                        "%s: a GID on a path that is not global (a corrupt record)", what);
  if (in[1] == 1 && gid_zero)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS,
                        "%s: a global (RoCE) path with an all-zero GID", what);
  q->qpn = qpn;
  q->psn = psn;
  q->lid = lid;
  q->global = in[1];
  q->mtu = in[2];
  memcpy(q->gid, in + 16, 16);
  return 0;
}

/* ---- queue pairs ---- */

static uint32_t random_psn(void) {
  uint32_t v = 0;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    v = (uint32_t)ts.tv_nsec ^ (uint32_t)ts.tv_sec * 2654435761u ^ (uint32_t)getpid() << 8;
  }
  return v & 0xffffff;
}

static int modify(mlxd_ibv_qp* q, struct mlxd_abi_qp_attr* a, int mask, const char* step,
                  mlxd_status* st) {
  errno = 0;
  int rc = q->d->L->modify_qp(q->qp, a, mask);
  if (rc == 0) return 0;
  char detail[96];
  snprintf(detail, sizeof detail, " (queue pair %" PRIu32 " to %s)", q->qp->qp_num, step);
  return fail_call(st, q->d->name, "ibv_modify_qp", op_errno(rc), detail);
}

int mlxd_ibv_qp_create(mlxd_ibv_dev* d, int max_send, int max_recv, mlxd_ibv_qp** out,
                       mlxd_ibv_qp_info* self, mlxd_status* st) {
  *out = NULL;
  if (max_send < 1 || max_recv < 0 ||
      (d->max_qp_wr > 0 && (max_send > d->max_qp_wr || max_recv > d->max_qp_wr)))
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS,
                        "%s: a queue pair of %d sends and %d receives (the device allows %d each)",
                        d->name, max_send, max_recv, d->max_qp_wr);
  mlxd_ibv_qp* q = calloc(1, sizeof *q);
  if (!q) return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_VERBS, "%s: out of memory", d->name);
  q->d = d;
  struct mlxd_abi_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = d->cq;
  ia.recv_cq = d->cq;
  ia.cap.max_send_wr = (uint32_t)max_send;
  ia.cap.max_recv_wr = (uint32_t)(max_recv > 0 ? max_recv : 1);
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.qp_type = MLXD_ABI_QPT_RC;
  ia.sq_sig_all = 0;
  errno = 0;
  q->qp = d->L->create_qp(d->pd, &ia);
  if (!q->qp) {
    int e = errno;
    free(q);
    char detail[96];
    snprintf(detail, sizeof detail, " (RC, %d sends, %d receives)", max_send, max_recv);
    return fail_call(st, d->name, "ibv_create_qp", e, detail);
  }
  struct mlxd_abi_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = MLXD_ABI_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = (uint8_t)d->port;
  a.qp_access_flags =
      MLXD_ABI_ACCESS_LOCAL_WRITE | MLXD_ABI_ACCESS_REMOTE_WRITE | MLXD_ABI_ACCESS_REMOTE_READ;
  int rc = modify(q, &a,
                  MLXD_ABI_QP_STATE | MLXD_ABI_QP_PKEY_INDEX | MLXD_ABI_QP_PORT |
                      MLXD_ABI_QP_ACCESS_FLAGS,
                  "INIT", st);
  if (rc != 0) {
    mlxd_ibv_qp_destroy(q);
    return rc;
  }
  q->psn = random_psn();
  q->mtu = (uint8_t)d->mtu;
  memset(self, 0, sizeof *self);
  self->qpn = q->qp->qp_num & 0xffffff;
  self->psn = q->psn;
  self->mtu = q->mtu;
  if (d->link_layer == MLXD_ABI_LINK_LAYER_INFINIBAND) {
    self->lid = d->lid;
    self->global = 0;
  } else {
    self->global = 1;
    memcpy(self->gid, d->gid, 16);
  }
  *out = q;
  return 0;
}

int mlxd_ibv_qp_connect(mlxd_ibv_qp* q, const mlxd_ibv_qp_info* r, mlxd_status* st) {
  mlxd_ibv_dev* d = q->d;
  bool we_global = d->link_layer != MLXD_ABI_LINK_LAYER_INFINIBAND;
  if ((r->global != 0) != we_global)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS,
                        "%s: the peer's queue pair %" PRIu32
                        " is on %s but this port is on %s: they cannot be connected",
                        d->name, r->qpn, r->global ? "Ethernet (RoCE)" : "InfiniBand",
                        we_global ? "Ethernet (RoCE)" : "InfiniBand");
  if (r->mtu < 1 || r->mtu > 5 || r->qpn > 0xffffff || r->psn > 0xffffff)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS,
                        "%s: the peer's queue pair address is malformed (mtu %u, qpn %" PRIu32
                        ", psn %" PRIu32 ")",
                        d->name, r->mtu, r->qpn, r->psn);
  struct mlxd_abi_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = MLXD_ABI_QPS_RTR;
  a.path_mtu = r->mtu < q->mtu ? r->mtu : q->mtu;
  a.dest_qp_num = r->qpn;
  a.rq_psn = r->psn;
  a.max_dest_rd_atomic = (uint8_t)d->rd_atomic;
  a.min_rnr_timer = MIN_RNR_TIMER;
  a.ah_attr.port_num = (uint8_t)d->port;
  a.ah_attr.sl = 0;
  a.ah_attr.src_path_bits = 0;
  if (we_global) {
    a.ah_attr.is_global = 1;
    a.ah_attr.dlid = 0;
    memcpy(a.ah_attr.grh.dgid.raw, r->gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
    a.ah_attr.grh.hop_limit = HOP_LIMIT;
    a.ah_attr.grh.flow_label = 0;
    a.ah_attr.grh.traffic_class = 0;
  } else {
    a.ah_attr.is_global = 0;
    a.ah_attr.dlid = r->lid;
  }
  int rc =
      modify(q, &a,
             MLXD_ABI_QP_STATE | MLXD_ABI_QP_AV | MLXD_ABI_QP_PATH_MTU | MLXD_ABI_QP_DEST_QPN |
                 MLXD_ABI_QP_RQ_PSN | MLXD_ABI_QP_MAX_DEST_RD_ATOMIC | MLXD_ABI_QP_MIN_RNR_TIMER,
             "RTR", st);
  if (rc != 0) return rc;
  memset(&a, 0, sizeof a);
  a.qp_state = MLXD_ABI_QPS_RTS;
  a.timeout = MLXD_IBV_TIMEOUT_EXP;
  a.retry_cnt = MLXD_IBV_RETRY;
  a.rnr_retry = RNR_RETRY;
  a.sq_psn = q->psn;
  a.max_rd_atomic = (uint8_t)d->rd_atomic;
  return modify(q, &a,
                MLXD_ABI_QP_STATE | MLXD_ABI_QP_TIMEOUT | MLXD_ABI_QP_RETRY_CNT |
                    MLXD_ABI_QP_RNR_RETRY | MLXD_ABI_QP_SQ_PSN | MLXD_ABI_QP_MAX_QP_RD_ATOMIC,
                "RTS", st);
}

void mlxd_ibv_qp_kill(mlxd_ibv_qp* q) {
  if (!q || !q->qp) return;
  struct mlxd_abi_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = MLXD_ABI_QPS_ERR;
  q->d->L->modify_qp(q->qp, &a, MLXD_ABI_QP_STATE);
}

void mlxd_ibv_qp_destroy(mlxd_ibv_qp* q) {
  if (!q) return;
  if (q->qp) q->d->L->destroy_qp(q->qp);
  free(q);
}

uint32_t mlxd_ibv_qp_num(const mlxd_ibv_qp* q) { return q->qp->qp_num; }

/* ---- posting ---- */

static int post_send(mlxd_ibv_qp* q, struct mlxd_abi_send_wr* wr, const char* what,
                     mlxd_status* st) {
  struct mlxd_abi_send_wr* bad = NULL;
  errno = 0;
  int rc = q->qp->context->ops.post_send(q->qp, wr, &bad);
  if (rc == 0) return 0;
  char detail[128];
  snprintf(detail, sizeof detail, " (%s of %" PRIu32 " bytes on queue pair %" PRIu32 ")", what,
           wr->num_sge ? wr->sg_list[0].length : 0, q->qp->qp_num);
  return fail_call(st, q->d->name, "ibv_post_send", op_errno(rc), detail);
}

static int check_len(mlxd_ibv_qp* q, size_t n, const char* what, mlxd_status* st) {
  if (n <= UINT32_MAX) return 0;
  return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS,
                      "%s: an RDMA %s of %zu bytes (one work request carries at most 4 GiB - 1)",
                      q->d->name, what, n);
}

static int post_rdma(mlxd_ibv_qp* q, int opcode, uint64_t wr_id, const void* local, size_t n,
                     uint32_t lkey, uint64_t raddr, uint32_t rkey, uint32_t imm, bool signaled,
                     const char* what, mlxd_status* st) {
  int rc = check_len(q, n, what, st);
  if (rc != 0) return rc;
  struct mlxd_abi_sge sge = {.addr = (uint64_t)(uintptr_t)local,
                             .length = (uint32_t)n,
                             .lkey = lkey};
  struct mlxd_abi_send_wr wr;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = n ? 1 : 0;
  wr.opcode = opcode;
  wr.send_flags = signaled ? MLXD_ABI_SEND_SIGNALED : 0;
  wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  return post_send(q, &wr, what, st);
}

int mlxd_ibv_post_write(mlxd_ibv_qp* q, uint64_t wr_id, const void* local, size_t n, uint32_t lkey,
                        uint64_t raddr, uint32_t rkey, bool signaled, mlxd_status* st) {
  return post_rdma(q, MLXD_ABI_WR_RDMA_WRITE, wr_id, local, n, lkey, raddr, rkey, 0, signaled,
                   "write", st);
}

int mlxd_ibv_post_write_imm(mlxd_ibv_qp* q, uint64_t wr_id, const void* local, size_t n,
                            uint32_t lkey, uint64_t raddr, uint32_t rkey, uint32_t imm,
                            bool signaled, mlxd_status* st) {
  return post_rdma(q, MLXD_ABI_WR_RDMA_WRITE_WITH_IMM, wr_id, local, n, lkey, raddr, rkey, imm,
                   signaled, "write with immediate data", st);
}

int mlxd_ibv_post_read(mlxd_ibv_qp* q, uint64_t wr_id, void* local, size_t n, uint32_t lkey,
                       uint64_t raddr, uint32_t rkey, mlxd_status* st) {
  return post_rdma(q, MLXD_ABI_WR_RDMA_READ, wr_id, local, n, lkey, raddr, rkey, 0, true, "read",
                   st);
}

int mlxd_ibv_post_recv(mlxd_ibv_qp* q, uint64_t wr_id, mlxd_status* st) {
  struct mlxd_abi_recv_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id;
  wr.sg_list = NULL;
  wr.num_sge = 0;
  errno = 0;
  int rc = q->qp->context->ops.post_recv(q->qp, &wr, &bad);
  if (rc == 0) return 0;
  char detail[64];
  snprintf(detail, sizeof detail, " (a receive on queue pair %" PRIu32 ")", q->qp->qp_num);
  return fail_call(st, q->d->name, "ibv_post_recv", op_errno(rc), detail);
}

/* ---- completions ---- */

int mlxd_ibv_poll(mlxd_ibv_dev* d, mlxd_ibv_wc* out, int max, mlxd_status* st) {
  struct mlxd_abi_wc wc[16];
  int got = 0;
  while (got < max) {
    int want = max - got < 16 ? max - got : 16;
    int n = d->cq->context->ops.poll_cq(d->cq, want, wc);
    if (n < 0) {
      fail_call(st, d->name, "ibv_poll_cq", errno ? errno : EIO, NULL);
      return -1;
    }
    for (int i = 0; i < n; i++) {
      mlxd_ibv_wc* w = &out[got + i];
      w->wr_id = wc[i].wr_id;
      w->status = wc[i].status;
      w->kind = (wc[i].opcode & MLXD_ABI_WC_RECV) ? MLXD_IBV_WC_RECV_IMM : MLXD_IBV_WC_SEND_DONE;
      w->qpn = wc[i].qp_num;
      w->imm = (wc[i].wc_flags & MLXD_ABI_WC_WITH_IMM) ? ntohl(wc[i].imm_data) : 0;
      w->vendor_err = wc[i].vendor_err;
    }
    got += n;
    if (n < want) break;
  }
  return got;
}

const char* mlxd_ibv_wc_status_str(int status) {
  const mlxd_verbs_lib* L = dev_lib();
  const char* s = L ? L->wc_status_str(status) : NULL;
  return s ? s : "unknown completion status";
}

int mlxd_ibv_fd(const mlxd_ibv_dev* d) { return d && d->ch ? d->ch->fd : -1; }

int mlxd_ibv_arm(mlxd_ibv_dev* d, mlxd_status* st) {
  errno = 0;
  int rc = d->cq->context->ops.req_notify_cq(d->cq, 0);
  if (rc == 0) return 0;
  fail_call(st, d->name, "ibv_req_notify_cq", op_errno(rc), NULL);
  return -1;
}

void mlxd_ibv_ack(mlxd_ibv_dev* d) {
  if (!d || !d->ch) return;
  unsigned n = 0;
  struct mlxd_abi_cq* cq;
  void* ctx;
  /* the channel's fd is non-blocking: this reads what is there and stops */
  while (d->L->get_cq_event(d->ch, &cq, &ctx) == 0) n++;
  if (n) d->L->ack_cq_events(d->cq, n);
}

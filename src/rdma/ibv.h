/* Private: the device layer of the verbs transport (transport/verbs.c).
 * Devices opened for data, registered memory, reliable-connection queue
 * pairs, posting and polling, over libibverbs loaded at run time (the same
 * library handle as the probe, rdma/probe.h; the structs and the inline
 * entry points of <infiniband/verbs.h> that are used are declared by hand
 * in rdma/abi.h and checked against the real header by a test wherever it
 * is installed). Nothing here keeps a lock or a thread: the caller (the
 * transport) serialises use of one object; different devices may be used
 * from different threads. Nothing here blocks: posting and polling return
 * at once. Errors are structured (util/status.h, MLXD_LAYER_VERBS) and
 * name the device, the call and errno. */
#ifndef MLXD_RDMA_IBV_H
#define MLXD_RDMA_IBV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

/* One device opened for data: its context, a protection domain, one
 * completion queue (send and receive completions of every queue pair made
 * on it), and the port and GID chosen as the probe chooses them
 * (MLXDIST_IB_PORT, MLXDIST_IB_GID_INDEX; the LID path on InfiniBand). */
typedef struct mlxd_ibv_dev mlxd_ibv_dev;

/* Open device `name` with a completion queue of at least cq_depth entries.
 * Errors: no library, no such device, no active port (naming the ports'
 * states), a failed ibv_* call (naming it and errno). */
int mlxd_ibv_dev_open(const char* name, int cq_depth, mlxd_ibv_dev** out, mlxd_status* st);
/* Close (NULL: no-op). Every queue pair and memory region made on d must be
 * gone first. */
void mlxd_ibv_dev_close(mlxd_ibv_dev* d);
const char* mlxd_ibv_dev_name(const mlxd_ibv_dev* d);
/* The port's active MTU in bytes (256..4096). */
int mlxd_ibv_dev_mtu(const mlxd_ibv_dev* d);

/* Registered memory. */
typedef struct mlxd_ibv_mr {
  void* addr;
  size_t len;
  uint32_t lkey, rkey;
  void* handle; /* struct ibv_mr* */
} mlxd_ibv_mr;
enum { MLXD_IBV_REMOTE_WRITE = 1, MLXD_IBV_REMOTE_READ = 2 };
/* Register len bytes at addr for local use and `remote` (MLXD_IBV_REMOTE_*
 * bits). An ENOMEM/EPERM/EFAULT failure says how much was asked for and
 * what RLIMIT_MEMLOCK allows (mlxd_ibv_memlock_check's words). */
int mlxd_ibv_reg(mlxd_ibv_dev* d, void* addr, size_t len, int remote, mlxd_ibv_mr* out,
                 mlxd_status* st);
void mlxd_ibv_dereg(mlxd_ibv_mr* mr); /* handle NULL: no-op; clears *mr */
/* Whether this process may lock `need` more bytes: RLIMIT_MEMLOCK (soft) is
 * unlimited or at least need (or the process has CAP_IPC_LOCK, which the
 * kernel lets pin past the limit); else an error (MLXD_EUNAVAIL) naming both
 * numbers and the fix ("ulimit -l unlimited", LimitMEMLOCK=, limits.conf).
 * Memory already locked is not counted: need is the whole budget. */
int mlxd_ibv_memlock_check(size_t need, mlxd_status* st);

/* A queue pair's address, as exchanged between ranks (MLXD_IBV_QP_INFO_BYTES
 * on the wire, big-endian, fixed layout). */
#define MLXD_IBV_QP_INFO_BYTES 32
typedef struct mlxd_ibv_qp_info {
  uint32_t qpn;    /* 24 bits */
  uint32_t psn;    /* 24 bits */
  uint16_t lid;    /* InfiniBand; 0 on Ethernet */
  uint8_t global;  /* 1: route by gid (RoCE), 0: by lid (InfiniBand) */
  uint8_t mtu;     /* enum ibv_mtu of the sender's port (1..5) */
  uint8_t gid[16]; /* when global */
} mlxd_ibv_qp_info;
void mlxd_ibv_qp_info_encode(unsigned char out[MLXD_IBV_QP_INFO_BYTES], const mlxd_ibv_qp_info* q);
/* Decode a peer's record; every field checked (qpn/psn within 24 bits, mtu
 * 1..5, global 0/1, lid non-zero when not global): an error names `what`
 * ("rank 2's queue pair for rank 0, rail 1") and the bad field. */
int mlxd_ibv_qp_info_decode(const unsigned char in[MLXD_IBV_QP_INFO_BYTES], const char* what,
                            mlxd_ibv_qp_info* q, mlxd_status* st);

/* A reliable-connection queue pair on a device (its CQ for both queues),
 * made in state INIT with remote write and read allowed. max_send/max_recv:
 * outstanding work requests of each queue (one scatter/gather entry each). */
typedef struct mlxd_ibv_qp mlxd_ibv_qp;
int mlxd_ibv_qp_create(mlxd_ibv_dev* d, int max_send, int max_recv, mlxd_ibv_qp** out,
                       mlxd_ibv_qp_info* self, mlxd_status* st);
/* INIT -> RTR -> RTS towards remote: path MTU the smaller of the two ports',
 * retransmission timeout MLXD_IBV_TIMEOUT_EXP (4.096 us * 2^exp) and
 * MLXD_IBV_RETRY tries (a peer whose process died is reported by an error
 * completion within about (MLXD_IBV_RETRY + 1) * 4.096 us * 2^exp), RNR
 * retries unlimited only where the protocol never relies on them. */
#define MLXD_IBV_TIMEOUT_EXP 14 /* ~67 ms */
/* 6, not 7 (the field's largest value): soft-RoCE (rdma_rxe) takes a
 * retry_cnt of 7 as "retry without limit", and a dead peer would never be
 * reported. */
#define MLXD_IBV_RETRY 6
int mlxd_ibv_qp_connect(mlxd_ibv_qp* q, const mlxd_ibv_qp_info* remote, mlxd_status* st);
/* Move to the error state (outstanding requests complete with a flush
 * error); used before destroy and on abort. */
void mlxd_ibv_qp_kill(mlxd_ibv_qp* q);
void mlxd_ibv_qp_destroy(mlxd_ibv_qp* q); /* NULL: no-op */
uint32_t mlxd_ibv_qp_num(const mlxd_ibv_qp* q);

/* Posting: one work request, never blocks; an error (the queue is full,
 * the QP is in error) is returned with st naming the call and errno.
 * signaled: a completion is generated (else only on error). */
int mlxd_ibv_post_write(mlxd_ibv_qp* q, uint64_t wr_id, const void* local, size_t n, uint32_t lkey,
                        uint64_t raddr, uint32_t rkey, bool signaled, mlxd_status* st);
/* RDMA write with immediate data: consumes one posted receive at the peer,
 * whose completion carries imm. n may be 0. */
int mlxd_ibv_post_write_imm(mlxd_ibv_qp* q, uint64_t wr_id, const void* local, size_t n,
                            uint32_t lkey, uint64_t raddr, uint32_t rkey, uint32_t imm,
                            bool signaled, mlxd_status* st);
int mlxd_ibv_post_read(mlxd_ibv_qp* q, uint64_t wr_id, void* local, size_t n, uint32_t lkey,
                       uint64_t raddr, uint32_t rkey, mlxd_status* st); /* always signaled */
/* A receive with no buffer (for writes with immediate data). */
int mlxd_ibv_post_recv(mlxd_ibv_qp* q, uint64_t wr_id, mlxd_status* st);

/* Completions. */
typedef enum {
  MLXD_IBV_WC_SEND_DONE = 1, /* a write, write_imm or read of ours completed */
  MLXD_IBV_WC_RECV_IMM = 2,  /* a peer's write with immediate data arrived */
} mlxd_ibv_wc_kind;
typedef struct mlxd_ibv_wc {
  uint64_t wr_id;
  int status;   /* 0: success, else enum ibv_wc_status */
  int kind;     /* mlxd_ibv_wc_kind (unreliable when status != 0) */
  uint32_t qpn; /* the local queue pair */
  uint32_t imm; /* RECV_IMM: the immediate data (host order) */
  uint32_t vendor_err;
} mlxd_ibv_wc;
/* Take at most max completions off d's queue; returns how many (0: none),
 * or -1 with st set (ibv_poll_cq failed). */
int mlxd_ibv_poll(mlxd_ibv_dev* d, mlxd_ibv_wc* wc, int max, mlxd_status* st);
/* "transport retry counter exceeded" etc. (ibv_wc_status_str's words). */
const char* mlxd_ibv_wc_status_str(int status);

/* The library's descriptor of d's completion channel, readable when a
 * completion arrives after mlxd_ibv_arm(d): lets a waiter sleep in poll()
 * instead of spinning. arm returns 0 or -1 with st set; after a wakeup call
 * mlxd_ibv_ack(d) before polling the queue again. -1 when d has no channel. */
int mlxd_ibv_fd(const mlxd_ibv_dev* d);
int mlxd_ibv_arm(mlxd_ibv_dev* d, mlxd_status* st);
void mlxd_ibv_ack(mlxd_ibv_dev* d);

#endif

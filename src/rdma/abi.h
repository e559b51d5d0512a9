/* Private: the part of libibverbs' ABI that mlxdist uses (the probe, and the
 * device layer rdma/ibv.c), declared here so that the build needs no RDMA
 * headers and the library no link dependency.
 *
 * Every layout below is rdma-core's libibverbs/verbs.h (checked member by
 * member, with every enum value, against rdma-core 44's installed
 * <infiniband/verbs.h> by tests/config/test_verbs_abi.c wherever that header
 * exists). What is used has kept its place since libibverbs 1.1
 * (IBVERBS_1.1, 2007): the library keeps it for old binaries, and providers
 * still fill struct ibv_context's ops table for the static inline entry
 * points. Later additions (struct ibv_send_wr's last union, struct
 * ibv_qp_attr's rate_limit, struct ibv_port_attr's tail) come after the
 * members used and are read by a provider only when a flag or a mask bit
 * asks for them; the structs passed in are declared whole and zeroed.
 *
 * Symbols are taken at version IBVERBS_1.1 (dlvsym; the completion channel
 * calls exist only at IBVERBS_1.0): libibverbs.so.1 also exports IBVERBS_1.0
 * versions of the same names with older structs, so a plain dlsym would be
 * right only by the default-version rule (rdma/lib.c loads them).
 *
 * ibv_poll_cq, ibv_req_notify_cq, ibv_post_send and ibv_post_recv are static
 * inline in <infiniband/verbs.h>: they call through context->ops (struct
 * ibv_context_ops below), and so does rdma/ibv.c.
 *
 * ibv_query_port is special: <infiniband/verbs.h> makes it an inline
 * wrapper (___ibv_query_port) that calls the context's extended query_port
 * when the provider has one, else the exported ibv_query_port with the
 * caller's struct cast to struct _compat_ibv_port_attr after zeroing all of
 * it. The exported one fills at most the fields of struct ibv_port_attr the
 * provider knows, so it is given a zeroed buffer larger than any version of
 * that struct (mlxd_abi_port_attr_buf) and only the fields up to link_layer,
 * present since 1.1, are read.
 *
 * Enums are declared as int members: every enum of verbs.h used here fits
 * in an int, which is what the compiler gives them. */
#ifndef MLXD_RDMA_ABI_H
#define MLXD_RDMA_ABI_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct mlxd_abi_device; /* struct ibv_device: only passed back */
struct mlxd_abi_context;
struct mlxd_abi_cq;
struct mlxd_abi_qp;
struct mlxd_abi_send_wr;
struct mlxd_abi_recv_wr;
struct mlxd_abi_wc;

/* struct ibv_device_attr (verbs.h): only phys_port_cnt is read. */
typedef struct mlxd_abi_device_attr {
  char fw_ver[64];
  uint64_t node_guid;
  uint64_t sys_image_guid;
  uint64_t max_mr_size;
  uint64_t page_size_cap;
  uint32_t vendor_id;
  uint32_t vendor_part_id;
  uint32_t hw_ver;
  int max_qp;
  int max_qp_wr;
  unsigned int device_cap_flags;
  int max_sge;
  int max_sge_rd;
  int max_cq;
  int max_cqe;
  int max_mr;
  int max_pd;
  int max_qp_rd_atom;
  int max_ee_rd_atom;
  int max_res_rd_atom;
  int max_qp_init_rd_atom;
  int max_ee_init_rd_atom;
  int atomic_cap; /* enum ibv_atomic_cap */
  int max_ee;
  int max_rdd;
  int max_mw;
  int max_raw_ipv6_qp;
  int max_raw_ethy_qp;
  int max_mcast_grp;
  int max_mcast_qp_attach;
  int max_total_mcast_qp_attach;
  int max_ah;
  int max_fmr;
  int max_map_per_fmr;
  int max_srq;
  int max_srq_wr;
  int max_srq_sge;
  uint16_t max_pkeys;
  uint8_t local_ca_ack_delay;
  uint8_t phys_port_cnt;
} mlxd_abi_device_attr;

/* struct ibv_port_attr (verbs.h) up to port_cap_flags2 (rdma-core 44). */
typedef struct mlxd_abi_port_attr {
  int state;      /* enum ibv_port_state */
  int max_mtu;    /* enum ibv_mtu */
  int active_mtu; /* enum ibv_mtu */
  int gid_tbl_len;
  uint32_t port_cap_flags;
  uint32_t max_msg_sz;
  uint32_t bad_pkey_cntr;
  uint32_t qkey_viol_cntr;
  uint16_t pkey_tbl_len;
  uint16_t lid;
  uint16_t sm_lid;
  uint8_t lmc;
  uint8_t max_vl_num;
  uint8_t sm_sl;
  uint8_t subnet_timeout;
  uint8_t init_type_reply;
  uint8_t active_width;
  uint8_t active_speed;
  uint8_t phys_state;
  uint8_t link_layer; /* IBV_LINK_LAYER_*: 1 InfiniBand, 2 Ethernet */
  uint8_t flags;
  uint16_t port_cap_flags2;
} mlxd_abi_port_attr;

/* What ibv_query_port writes into: the struct and room for fields a newer
 * provider may add after it. */
typedef union mlxd_abi_port_attr_buf {
  mlxd_abi_port_attr a;
  unsigned char room[256];
} mlxd_abi_port_attr_buf;

/* enum values (verbs.h) */
enum { MLXD_ABI_PORT_ACTIVE = 4 };
enum { MLXD_ABI_LINK_LAYER_INFINIBAND = 1, MLXD_ABI_LINK_LAYER_ETHERNET = 2 };

/* A slot of a table whose function is never called here (its type does not matter,
 * only that it is one function pointer wide). */
typedef void (*mlxd_abi_unused_fn)(void);

/* struct ibv_context_ops (verbs.h): the provider's table. The static inline
 * ibv_poll_cq, ibv_req_notify_cq, ibv_post_send and ibv_post_recv call
 * poll_cq, req_notify_cq, post_send and post_recv; the other slots are kept
 * (unused) so that those four are where the provider put them. */
struct mlxd_abi_context_ops {
  mlxd_abi_unused_fn _compat_query_device;
  mlxd_abi_unused_fn _compat_query_port;
  mlxd_abi_unused_fn _compat_alloc_pd;
  mlxd_abi_unused_fn _compat_dealloc_pd;
  mlxd_abi_unused_fn _compat_reg_mr;
  mlxd_abi_unused_fn _compat_rereg_mr;
  mlxd_abi_unused_fn _compat_dereg_mr;
  mlxd_abi_unused_fn alloc_mw;
  mlxd_abi_unused_fn bind_mw;
  mlxd_abi_unused_fn dealloc_mw;
  mlxd_abi_unused_fn _compat_create_cq;
  int (*poll_cq)(struct mlxd_abi_cq* cq, int num_entries, struct mlxd_abi_wc* wc);
  int (*req_notify_cq)(struct mlxd_abi_cq* cq, int solicited_only);
  mlxd_abi_unused_fn _compat_cq_event;
  mlxd_abi_unused_fn _compat_resize_cq;
  mlxd_abi_unused_fn _compat_destroy_cq;
  mlxd_abi_unused_fn _compat_create_srq;
  mlxd_abi_unused_fn _compat_modify_srq;
  mlxd_abi_unused_fn _compat_query_srq;
  mlxd_abi_unused_fn _compat_destroy_srq;
  mlxd_abi_unused_fn post_srq_recv;
  mlxd_abi_unused_fn _compat_create_qp;
  mlxd_abi_unused_fn _compat_query_qp;
  mlxd_abi_unused_fn _compat_modify_qp;
  mlxd_abi_unused_fn _compat_destroy_qp;
  int (*post_send)(struct mlxd_abi_qp* qp, struct mlxd_abi_send_wr* wr,
                   struct mlxd_abi_send_wr** bad_wr);
  int (*post_recv)(struct mlxd_abi_qp* qp, struct mlxd_abi_recv_wr* wr,
                   struct mlxd_abi_recv_wr** bad_wr);
  mlxd_abi_unused_fn _compat_create_ah;
  mlxd_abi_unused_fn _compat_destroy_ah;
  mlxd_abi_unused_fn _compat_attach_mcast;
  mlxd_abi_unused_fn _compat_detach_mcast;
  mlxd_abi_unused_fn _compat_async_event;
};

/* struct ibv_context (verbs.h): made by ibv_open_device; only ops is read. */
struct mlxd_abi_context {
  struct mlxd_abi_device* device;
  struct mlxd_abi_context_ops ops;
  int cmd_fd;
  int async_fd;
  int num_comp_vectors;
  pthread_mutex_t mutex;
  void* abi_compat;
};

/* struct ibv_pd (verbs.h) */
struct mlxd_abi_pd {
  struct mlxd_abi_context* context;
  uint32_t handle;
};

/* struct ibv_comp_channel (verbs.h): fd is what a waiter polls. */
struct mlxd_abi_comp_channel {
  struct mlxd_abi_context* context;
  int fd;
  int refcnt;
};

/* struct ibv_cq (verbs.h): context is read (the inline calls go through it). */
struct mlxd_abi_cq {
  struct mlxd_abi_context* context;
  struct mlxd_abi_comp_channel* channel;
  void* cq_context;
  uint32_t handle;
  int cqe;
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  uint32_t comp_events_completed;
  uint32_t async_events_completed;
};

/* struct ibv_qp (verbs.h): context and qp_num are read. */
struct mlxd_abi_qp {
  struct mlxd_abi_context* context;
  void* qp_context;
  struct mlxd_abi_pd* pd;
  struct mlxd_abi_cq* send_cq;
  struct mlxd_abi_cq* recv_cq;
  void* srq; /* struct ibv_srq* */
  uint32_t handle;
  uint32_t qp_num;
  int state;   /* enum ibv_qp_state */
  int qp_type; /* enum ibv_qp_type */
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  uint32_t events_completed;
};

/* struct ibv_mr (verbs.h): lkey and rkey are read. */
struct mlxd_abi_mr {
  struct mlxd_abi_context* context;
  struct mlxd_abi_pd* pd;
  void* addr;
  size_t length;
  uint32_t handle;
  uint32_t lkey;
  uint32_t rkey;
};

/* struct ibv_sge (verbs.h) */
struct mlxd_abi_sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

/* struct ibv_mw_bind_info (verbs.h): only as part of struct ibv_send_wr. */
struct mlxd_abi_mw_bind_info {
  struct mlxd_abi_mr* mr;
  uint64_t addr;
  uint64_t length;
  unsigned int mw_access_flags;
};

/* struct ibv_send_wr (verbs.h): the rdma member of wr is used; the others
 * are declared so that the struct has its size and wr its place. imm_data
 * is in network byte order. */
struct mlxd_abi_send_wr {
  uint64_t wr_id;
  struct mlxd_abi_send_wr* next;
  struct mlxd_abi_sge* sg_list;
  int num_sge;
  int opcode; /* enum ibv_wr_opcode */
  unsigned int send_flags;
  union {
    uint32_t imm_data;
    uint32_t invalidate_rkey;
  };
  union {
    struct {
      uint64_t remote_addr;
      uint32_t rkey;
    } rdma;
    struct {
      uint64_t remote_addr;
      uint64_t compare_add;
      uint64_t swap;
      uint32_t rkey;
    } atomic;
    struct {
      void* ah; /* struct ibv_ah* */
      uint32_t remote_qpn;
      uint32_t remote_qkey;
    } ud;
  } wr;
  union {
    struct {
      uint32_t remote_srqn;
    } xrc;
  } qp_type;
  union {
    struct {
      void* mw; /* struct ibv_mw* */
      uint32_t rkey;
      struct mlxd_abi_mw_bind_info bind_info;
    } bind_mw;
    struct {
      void* hdr;
      uint16_t hdr_sz;
      uint16_t mss;
    } tso;
  };
};

/* struct ibv_recv_wr (verbs.h) */
struct mlxd_abi_recv_wr {
  uint64_t wr_id;
  struct mlxd_abi_recv_wr* next;
  struct mlxd_abi_sge* sg_list;
  int num_sge;
};

/* struct ibv_wc (verbs.h): what ibv_poll_cq fills, one per completion.
 * imm_data is in network byte order (when wc_flags has IBV_WC_WITH_IMM). */
struct mlxd_abi_wc {
  uint64_t wr_id;
  int status; /* enum ibv_wc_status */
  int opcode; /* enum ibv_wc_opcode */
  uint32_t vendor_err;
  uint32_t byte_len;
  union {
    uint32_t imm_data;
    uint32_t invalidated_rkey;
  };
  uint32_t qp_num;
  uint32_t src_qp;
  unsigned int wc_flags;
  uint16_t pkey_index;
  uint16_t slid;
  uint8_t sl;
  uint8_t dlid_path_bits;
};

/* struct ibv_qp_cap (verbs.h) */
struct mlxd_abi_qp_cap {
  uint32_t max_send_wr;
  uint32_t max_recv_wr;
  uint32_t max_send_sge;
  uint32_t max_recv_sge;
  uint32_t max_inline_data;
};

/* struct ibv_qp_init_attr (verbs.h): what ibv_create_qp reads (and writes cap into). */
struct mlxd_abi_qp_init_attr {
  void* qp_context;
  struct mlxd_abi_cq* send_cq;
  struct mlxd_abi_cq* recv_cq;
  void* srq; /* struct ibv_srq* */
  struct mlxd_abi_qp_cap cap;
  int qp_type; /* enum ibv_qp_type */
  int sq_sig_all;
};

/* union ibv_gid (verbs.h): 16 bytes, aligned as its two 64-bit halves. */
union mlxd_abi_gid {
  uint8_t raw[16];
  struct {
    uint64_t subnet_prefix; /* big-endian */
    uint64_t interface_id;  /* big-endian */
  } global;
};

/* struct ibv_global_route (verbs.h): the GRH of a RoCE path. */
struct mlxd_abi_global_route {
  union mlxd_abi_gid dgid;
  uint32_t flow_label;
  uint8_t sgid_index;
  uint8_t hop_limit;
  uint8_t traffic_class;
};

/* struct ibv_ah_attr (verbs.h): the path to the peer. */
struct mlxd_abi_ah_attr {
  struct mlxd_abi_global_route grh;
  uint16_t dlid;
  uint8_t sl;
  uint8_t src_path_bits;
  uint8_t static_rate;
  uint8_t is_global;
  uint8_t port_num;
};

/* struct ibv_qp_attr (verbs.h): what ibv_modify_qp reads (the fields the mask names). */
struct mlxd_abi_qp_attr {
  int qp_state;       /* enum ibv_qp_state */
  int cur_qp_state;   /* enum ibv_qp_state */
  int path_mtu;       /* enum ibv_mtu */
  int path_mig_state; /* enum ibv_mig_state */
  uint32_t qkey;
  uint32_t rq_psn;
  uint32_t sq_psn;
  uint32_t dest_qp_num;
  unsigned int qp_access_flags;
  struct mlxd_abi_qp_cap cap;
  struct mlxd_abi_ah_attr ah_attr;
  struct mlxd_abi_ah_attr alt_ah_attr;
  uint16_t pkey_index;
  uint16_t alt_pkey_index;
  uint8_t en_sqd_async_notify;
  uint8_t sq_draining;
  uint8_t max_rd_atomic;
  uint8_t max_dest_rd_atomic;
  uint8_t min_rnr_timer;
  uint8_t port_num;
  uint8_t timeout;
  uint8_t retry_cnt;
  uint8_t rnr_retry;
  uint8_t alt_port_num;
  uint8_t alt_timeout;
  uint32_t rate_limit;
};

/* enum ibv_access_flags (verbs.h) */
enum {
  MLXD_ABI_ACCESS_LOCAL_WRITE = 1,
  MLXD_ABI_ACCESS_REMOTE_WRITE = 1 << 1,
  MLXD_ABI_ACCESS_REMOTE_READ = 1 << 2,
};
/* enum ibv_qp_type (verbs.h) */
enum { MLXD_ABI_QPT_RC = 2 };
/* enum ibv_qp_state (verbs.h) */
enum {
  MLXD_ABI_QPS_RESET = 0,
  MLXD_ABI_QPS_INIT = 1,
  MLXD_ABI_QPS_RTR = 2,
  MLXD_ABI_QPS_RTS = 3,
  MLXD_ABI_QPS_ERR = 6,
};
/* enum ibv_qp_attr_mask (verbs.h) */
enum {
  MLXD_ABI_QP_STATE = 1 << 0,
  MLXD_ABI_QP_ACCESS_FLAGS = 1 << 3,
  MLXD_ABI_QP_PKEY_INDEX = 1 << 4,
  MLXD_ABI_QP_PORT = 1 << 5,
  MLXD_ABI_QP_AV = 1 << 7,
  MLXD_ABI_QP_PATH_MTU = 1 << 8,
  MLXD_ABI_QP_TIMEOUT = 1 << 9,
  MLXD_ABI_QP_RETRY_CNT = 1 << 10,
  MLXD_ABI_QP_RNR_RETRY = 1 << 11,
  MLXD_ABI_QP_RQ_PSN = 1 << 12,
  MLXD_ABI_QP_MAX_QP_RD_ATOMIC = 1 << 13,
  MLXD_ABI_QP_MIN_RNR_TIMER = 1 << 15,
  MLXD_ABI_QP_SQ_PSN = 1 << 16,
  MLXD_ABI_QP_MAX_DEST_RD_ATOMIC = 1 << 17,
  MLXD_ABI_QP_DEST_QPN = 1 << 20,
};
/* enum ibv_wr_opcode (verbs.h) */
enum {
  MLXD_ABI_WR_RDMA_WRITE = 0,
  MLXD_ABI_WR_RDMA_WRITE_WITH_IMM = 1,
  MLXD_ABI_WR_RDMA_READ = 4,
};
/* enum ibv_send_flags (verbs.h) */
enum { MLXD_ABI_SEND_SIGNALED = 1 << 1 };
/* enum ibv_wc_opcode (verbs.h): receive completions have bit 7 set. */
enum {
  MLXD_ABI_WC_RDMA_WRITE = 1,
  MLXD_ABI_WC_RDMA_READ = 2,
  MLXD_ABI_WC_RECV = 1 << 7,
  MLXD_ABI_WC_RECV_RDMA_WITH_IMM = (1 << 7) + 1,
};
/* enum ibv_wc_flags (verbs.h) */
enum { MLXD_ABI_WC_WITH_IMM = 1 << 1 };
/* enum ibv_wc_status (verbs.h): the ones named in code and tests. */
enum {
  MLXD_ABI_WC_SUCCESS = 0,
  MLXD_ABI_WC_WR_FLUSH_ERR = 5,
  MLXD_ABI_WC_RETRY_EXC_ERR = 12,
  MLXD_ABI_WC_RNR_RETRY_EXC_ERR = 13,
};
/* enum ibv_mtu (verbs.h): IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5 (bytes = 128 << value). */
enum { MLXD_ABI_MTU_256 = 1, MLXD_ABI_MTU_4096 = 5 };

/* The entry points (verbs.h), as dlvsym returns them. union ibv_gid is 16 raw bytes. */
typedef struct mlxd_abi_device** (*mlxd_abi_get_device_list_fn)(int* num_devices);
typedef void (*mlxd_abi_free_device_list_fn)(struct mlxd_abi_device** list);
typedef const char* (*mlxd_abi_get_device_name_fn)(struct mlxd_abi_device* device);
typedef struct mlxd_abi_context* (*mlxd_abi_open_device_fn)(struct mlxd_abi_device* device);
typedef int (*mlxd_abi_close_device_fn)(struct mlxd_abi_context* context);
typedef int (*mlxd_abi_query_device_fn)(struct mlxd_abi_context* context,
                                        mlxd_abi_device_attr* attr);
typedef int (*mlxd_abi_query_port_fn)(struct mlxd_abi_context* context, uint8_t port_num,
                                      mlxd_abi_port_attr_buf* attr);
typedef int (*mlxd_abi_query_gid_fn)(struct mlxd_abi_context* context, uint8_t port_num, int index,
                                     uint8_t gid[16]);

typedef struct mlxd_abi_pd* (*mlxd_abi_alloc_pd_fn)(struct mlxd_abi_context* context);
typedef int (*mlxd_abi_dealloc_pd_fn)(struct mlxd_abi_pd* pd);
typedef struct mlxd_abi_mr* (*mlxd_abi_reg_mr_fn)(struct mlxd_abi_pd* pd, void* addr, size_t length,
                                                  int access);
typedef int (*mlxd_abi_dereg_mr_fn)(struct mlxd_abi_mr* mr);
typedef struct mlxd_abi_comp_channel* (*mlxd_abi_create_comp_channel_fn)(
    struct mlxd_abi_context* context);
typedef int (*mlxd_abi_destroy_comp_channel_fn)(struct mlxd_abi_comp_channel* channel);
typedef struct mlxd_abi_cq* (*mlxd_abi_create_cq_fn)(struct mlxd_abi_context* context, int cqe,
                                                     void* cq_context,
                                                     struct mlxd_abi_comp_channel* channel,
                                                     int comp_vector);
typedef int (*mlxd_abi_destroy_cq_fn)(struct mlxd_abi_cq* cq);
typedef int (*mlxd_abi_get_cq_event_fn)(struct mlxd_abi_comp_channel* channel,
                                        struct mlxd_abi_cq** cq, void** cq_context);
typedef void (*mlxd_abi_ack_cq_events_fn)(struct mlxd_abi_cq* cq, unsigned int nevents);
typedef struct mlxd_abi_qp* (*mlxd_abi_create_qp_fn)(struct mlxd_abi_pd* pd,
                                                     struct mlxd_abi_qp_init_attr* attr);
typedef int (*mlxd_abi_modify_qp_fn)(struct mlxd_abi_qp* qp, struct mlxd_abi_qp_attr* attr,
                                     int attr_mask);
typedef int (*mlxd_abi_destroy_qp_fn)(struct mlxd_abi_qp* qp);
typedef const char* (*mlxd_abi_wc_status_str_fn)(int status); /* enum ibv_wc_status */

#endif

/* Private: the part of libibverbs' ABI the probe uses, declared here so that
 * the build needs no RDMA headers and the library no link dependency.
 *
 * Every layout below is rdma-core's libibverbs/verbs.h (checked against
 * rdma-core 44's installed <infiniband/verbs.h> by tests/config/test_verbs_abi.c
 * wherever that header exists). These parts have not changed since
 * libibverbs 1.1 (IBVERBS_1.1, 2007): the library keeps them for old binaries.
 *
 * Symbols are taken at version IBVERBS_1.1 (dlvsym): libibverbs.so.1 also
 * exports IBVERBS_1.0 versions of the same names with an older struct
 * ibv_device, so a plain dlsym would be right only by the default-version
 * rule. ibv_query_port is special: <infiniband/verbs.h> makes it an inline
 * wrapper (___ibv_query_port) that calls the context's extended query_port
 * when the provider has one, else the exported ibv_query_port with the
 * caller's struct cast to struct _compat_ibv_port_attr after zeroing all of
 * it. The exported one fills at most the fields of struct ibv_port_attr the
 * provider knows, so it is given a zeroed buffer larger than any version of
 * that struct (mlxd_ibv_port_attr_buf) and only the fields up to link_layer,
 * present since 1.1, are read. */
#ifndef MLXD_RDMA_ABI_H
#define MLXD_RDMA_ABI_H

#include <stdint.h>

struct mlxd_ibv_device;  /* struct ibv_device: only passed back */
struct mlxd_ibv_context; /* struct ibv_context: only passed back */

/* struct ibv_device_attr (verbs.h): only phys_port_cnt is read. */
typedef struct mlxd_ibv_device_attr {
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
  int max_qp_mcast;
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
} mlxd_ibv_device_attr;

/* struct ibv_port_attr (verbs.h) up to port_cap_flags2 (rdma-core 44). */
typedef struct mlxd_ibv_port_attr {
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
} mlxd_ibv_port_attr;

/* What ibv_query_port writes into: the struct and room for fields a newer
 * provider may add after it. */
typedef union mlxd_ibv_port_attr_buf {
  mlxd_ibv_port_attr a;
  unsigned char room[256];
} mlxd_ibv_port_attr_buf;

/* enum values (verbs.h) */
enum { MLXD_IBV_PORT_ACTIVE = 4 };
enum { MLXD_IBV_LINK_LAYER_INFINIBAND = 1, MLXD_IBV_LINK_LAYER_ETHERNET = 2 };

/* The entry points (verbs.h), as dlvsym returns them. union ibv_gid is 16 raw bytes. */
typedef struct mlxd_ibv_device** (*mlxd_ibv_get_device_list_fn)(int* num_devices);
typedef void (*mlxd_ibv_free_device_list_fn)(struct mlxd_ibv_device** list);
typedef const char* (*mlxd_ibv_get_device_name_fn)(struct mlxd_ibv_device* device);
typedef struct mlxd_ibv_context* (*mlxd_ibv_open_device_fn)(struct mlxd_ibv_device* device);
typedef int (*mlxd_ibv_close_device_fn)(struct mlxd_ibv_context* context);
typedef int (*mlxd_ibv_query_device_fn)(struct mlxd_ibv_context* context,
                                        mlxd_ibv_device_attr* attr);
typedef int (*mlxd_ibv_query_port_fn)(struct mlxd_ibv_context* context, uint8_t port_num,
                                      mlxd_ibv_port_attr_buf* attr);
typedef int (*mlxd_ibv_query_gid_fn)(struct mlxd_ibv_context* context, uint8_t port_num, int index,
                                     uint8_t gid[16]);

#endif

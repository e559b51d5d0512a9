/* Private: libibverbs loaded at run time, shared by the probe (rdma/probe.c)
 * and the device layer (rdma/ibv.c). dlopen of MLXDIST_IBVERBS_LIB, else
 * "libibverbs.so.1"; the entry points taken with dlvsym at the versions
 * rdma/abi.h names. Nothing links against libibverbs. */
#ifndef MLXD_RDMA_LIB_H
#define MLXD_RDMA_LIB_H

#include <stdbool.h>
#include <stddef.h>

#include "rdma/abi.h"

/* The entry points of one loaded library. */
typedef struct mlxd_verbs_lib {
  char name[256]; /* what was loaded: MLXDIST_IBVERBS_LIB or libibverbs.so.1 */
  void* handle;   /* dlopen's */
  /* the probe's */
  mlxd_abi_get_device_list_fn get_device_list;
  mlxd_abi_free_device_list_fn free_device_list;
  mlxd_abi_get_device_name_fn get_device_name;
  mlxd_abi_open_device_fn open_device;
  mlxd_abi_close_device_fn close_device;
  mlxd_abi_query_device_fn query_device;
  mlxd_abi_query_port_fn query_port;
  mlxd_abi_query_gid_fn query_gid;
  /* the device layer's */
  mlxd_abi_alloc_pd_fn alloc_pd;
  mlxd_abi_dealloc_pd_fn dealloc_pd;
  mlxd_abi_reg_mr_fn reg_mr;
  mlxd_abi_dereg_mr_fn dereg_mr;
  mlxd_abi_create_comp_channel_fn create_comp_channel;
  mlxd_abi_destroy_comp_channel_fn destroy_comp_channel;
  mlxd_abi_create_cq_fn create_cq;
  mlxd_abi_destroy_cq_fn destroy_cq;
  mlxd_abi_get_cq_event_fn get_cq_event;
  mlxd_abi_ack_cq_events_fn ack_cq_events;
  mlxd_abi_create_qp_fn create_qp;
  mlxd_abi_modify_qp_fn modify_qp;
  mlxd_abi_destroy_qp_fn destroy_qp;
  mlxd_abi_wc_status_str_fn wc_status_str;
} mlxd_verbs_lib;

/* Why the library is not there. */
typedef struct mlxd_verbs_lib_err {
  bool loaded;    /* dlopen worked but an entry point is missing (else dlopen failed) */
  char name[256]; /* what was tried */
  char err[256];  /* dlerror()'s words, or "it has no ibv_xxx" */
} mlxd_verbs_lib_err;

/* The library MLXDIST_IBVERBS_LIB names (read at each call; empty:
 * libibverbs.so.1), loaded on its first use and kept for the life of the
 * process (never unloaded: the providers that ibv_get_device_list loads, and
 * every object made, refer to it). The same name gives the same table; a
 * different name (a test changing the variable) loads that one too. A
 * failure is not remembered: the next call tries again. Thread-safe (a
 * mutex around the loading); never blocks beyond dlopen. NULL with *e filled
 * when it cannot be loaded or lacks an entry point (e may be NULL). */
const mlxd_verbs_lib* mlxd_verbs_lib_get(mlxd_verbs_lib_err* e);

#endif

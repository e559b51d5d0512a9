/* The libibverbs ABI that rdma/abi.h declares by hand, checked against the
 * real <infiniband/verbs.h> (built only where CMake finds that header; the
 * library itself never includes it): every declared member of every struct
 * at the same offset and of the same size, every struct of the same size and
 * alignment (struct ibv_port_attr: ours is a prefix of it, passed in a larger
 * buffer), every enum value the same. A mismatch fails the build of this
 * test. */
#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdio.h>

#include "rdma/abi.h"

/* member `field` of ours at the offset and of the size it has in theirs */
#define SAME(ours, theirs, field)                                                    \
  _Static_assert(offsetof(ours, field) == offsetof(theirs, field), #field " moved"); \
  _Static_assert(sizeof(((ours*)0)->field) == sizeof(((theirs*)0)->field), #field " resized")
/* the whole struct */
#define SAME_STRUCT(ours, theirs)                                  \
  _Static_assert(sizeof(ours) == sizeof(theirs), #theirs " size"); \
  _Static_assert(_Alignof(ours) == _Alignof(theirs), #theirs " alignment")
#define SAME_ENUM(ours, theirs) _Static_assert((long)(ours) == (long)(theirs), #theirs)

/* struct ibv_device_attr */
SAME(mlxd_abi_device_attr, struct ibv_device_attr, fw_ver);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, node_guid);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, sys_image_guid);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_mr_size);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, page_size_cap);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, vendor_id);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, vendor_part_id);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, hw_ver);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_qp);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_qp_wr);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, device_cap_flags);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_sge);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_sge_rd);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_cq);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_cqe);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_mr);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_pd);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_qp_rd_atom);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_ee_rd_atom);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_res_rd_atom);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_qp_init_rd_atom);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_ee_init_rd_atom);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, atomic_cap);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_ee);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_rdd);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_mw);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_raw_ipv6_qp);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_raw_ethy_qp);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_mcast_grp);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_mcast_qp_attach);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_total_mcast_qp_attach);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_ah);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_fmr);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_map_per_fmr);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_srq);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_srq_wr);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_srq_sge);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, max_pkeys);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, local_ca_ack_delay);
SAME(mlxd_abi_device_attr, struct ibv_device_attr, phys_port_cnt);
SAME_STRUCT(mlxd_abi_device_attr, struct ibv_device_attr);

/* struct ibv_port_attr */
SAME(mlxd_abi_port_attr, struct ibv_port_attr, state);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, max_mtu);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, active_mtu);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, gid_tbl_len);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, port_cap_flags);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, max_msg_sz);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, bad_pkey_cntr);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, qkey_viol_cntr);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, pkey_tbl_len);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, lid);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, sm_lid);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, lmc);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, max_vl_num);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, sm_sl);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, subnet_timeout);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, init_type_reply);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, active_width);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, active_speed);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, phys_state);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, link_layer);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, flags);
SAME(mlxd_abi_port_attr, struct ibv_port_attr, port_cap_flags2);

/* struct ibv_context_ops */
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_query_device);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_query_port);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_alloc_pd);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_dealloc_pd);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_reg_mr);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_rereg_mr);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_dereg_mr);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, alloc_mw);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, bind_mw);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, dealloc_mw);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_create_cq);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, poll_cq);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, req_notify_cq);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_cq_event);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_resize_cq);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_destroy_cq);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_create_srq);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_modify_srq);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_query_srq);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_destroy_srq);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, post_srq_recv);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_create_qp);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_query_qp);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_modify_qp);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_destroy_qp);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, post_send);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, post_recv);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_create_ah);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_destroy_ah);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_attach_mcast);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_detach_mcast);
SAME(struct mlxd_abi_context_ops, struct ibv_context_ops, _compat_async_event);
SAME_STRUCT(struct mlxd_abi_context_ops, struct ibv_context_ops);

/* struct ibv_context */
SAME(struct mlxd_abi_context, struct ibv_context, device);
SAME(struct mlxd_abi_context, struct ibv_context, ops);
SAME(struct mlxd_abi_context, struct ibv_context, cmd_fd);
SAME(struct mlxd_abi_context, struct ibv_context, async_fd);
SAME(struct mlxd_abi_context, struct ibv_context, num_comp_vectors);
SAME(struct mlxd_abi_context, struct ibv_context, mutex);
SAME(struct mlxd_abi_context, struct ibv_context, abi_compat);
SAME_STRUCT(struct mlxd_abi_context, struct ibv_context);

/* struct ibv_pd */
SAME(struct mlxd_abi_pd, struct ibv_pd, context);
SAME(struct mlxd_abi_pd, struct ibv_pd, handle);
SAME_STRUCT(struct mlxd_abi_pd, struct ibv_pd);

/* struct ibv_comp_channel */
SAME(struct mlxd_abi_comp_channel, struct ibv_comp_channel, context);
SAME(struct mlxd_abi_comp_channel, struct ibv_comp_channel, fd);
SAME(struct mlxd_abi_comp_channel, struct ibv_comp_channel, refcnt);
SAME_STRUCT(struct mlxd_abi_comp_channel, struct ibv_comp_channel);

/* struct ibv_cq */
SAME(struct mlxd_abi_cq, struct ibv_cq, context);
SAME(struct mlxd_abi_cq, struct ibv_cq, channel);
SAME(struct mlxd_abi_cq, struct ibv_cq, cq_context);
SAME(struct mlxd_abi_cq, struct ibv_cq, handle);
SAME(struct mlxd_abi_cq, struct ibv_cq, cqe);
SAME(struct mlxd_abi_cq, struct ibv_cq, mutex);
SAME(struct mlxd_abi_cq, struct ibv_cq, cond);
SAME(struct mlxd_abi_cq, struct ibv_cq, comp_events_completed);
SAME(struct mlxd_abi_cq, struct ibv_cq, async_events_completed);
SAME_STRUCT(struct mlxd_abi_cq, struct ibv_cq);

/* struct ibv_qp */
SAME(struct mlxd_abi_qp, struct ibv_qp, context);
SAME(struct mlxd_abi_qp, struct ibv_qp, qp_context);
SAME(struct mlxd_abi_qp, struct ibv_qp, pd);
SAME(struct mlxd_abi_qp, struct ibv_qp, send_cq);
SAME(struct mlxd_abi_qp, struct ibv_qp, recv_cq);
SAME(struct mlxd_abi_qp, struct ibv_qp, srq);
SAME(struct mlxd_abi_qp, struct ibv_qp, handle);
SAME(struct mlxd_abi_qp, struct ibv_qp, qp_num);
SAME(struct mlxd_abi_qp, struct ibv_qp, state);
SAME(struct mlxd_abi_qp, struct ibv_qp, qp_type);
SAME(struct mlxd_abi_qp, struct ibv_qp, mutex);
SAME(struct mlxd_abi_qp, struct ibv_qp, cond);
SAME(struct mlxd_abi_qp, struct ibv_qp, events_completed);
SAME_STRUCT(struct mlxd_abi_qp, struct ibv_qp);

/* struct ibv_mr */
SAME(struct mlxd_abi_mr, struct ibv_mr, context);
SAME(struct mlxd_abi_mr, struct ibv_mr, pd);
SAME(struct mlxd_abi_mr, struct ibv_mr, addr);
SAME(struct mlxd_abi_mr, struct ibv_mr, length);
SAME(struct mlxd_abi_mr, struct ibv_mr, handle);
SAME(struct mlxd_abi_mr, struct ibv_mr, lkey);
SAME(struct mlxd_abi_mr, struct ibv_mr, rkey);
SAME_STRUCT(struct mlxd_abi_mr, struct ibv_mr);

/* struct ibv_sge */
SAME(struct mlxd_abi_sge, struct ibv_sge, addr);
SAME(struct mlxd_abi_sge, struct ibv_sge, length);
SAME(struct mlxd_abi_sge, struct ibv_sge, lkey);
SAME_STRUCT(struct mlxd_abi_sge, struct ibv_sge);

/* struct ibv_mw_bind_info */
SAME(struct mlxd_abi_mw_bind_info, struct ibv_mw_bind_info, mr);
SAME(struct mlxd_abi_mw_bind_info, struct ibv_mw_bind_info, addr);
SAME(struct mlxd_abi_mw_bind_info, struct ibv_mw_bind_info, length);
SAME(struct mlxd_abi_mw_bind_info, struct ibv_mw_bind_info, mw_access_flags);
SAME_STRUCT(struct mlxd_abi_mw_bind_info, struct ibv_mw_bind_info);

/* struct ibv_send_wr */
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, wr_id);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, next);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, sg_list);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, num_sge);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, opcode);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, send_flags);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, imm_data);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, invalidate_rkey);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, wr);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, wr.rdma);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, wr.rdma.remote_addr);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, wr.rdma.rkey);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, wr.atomic);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, wr.atomic.remote_addr);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, wr.atomic.compare_add);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, wr.atomic.swap);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, wr.atomic.rkey);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, wr.ud);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, wr.ud.ah);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, wr.ud.remote_qpn);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, wr.ud.remote_qkey);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, qp_type);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, qp_type.xrc);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, qp_type.xrc.remote_srqn);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, bind_mw);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, bind_mw.mw);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, bind_mw.rkey);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, bind_mw.bind_info);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, bind_mw.bind_info.mr);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, bind_mw.bind_info.addr);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, bind_mw.bind_info.length);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, bind_mw.bind_info.mw_access_flags);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, tso);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, tso.hdr);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, tso.hdr_sz);
SAME(struct mlxd_abi_send_wr, struct ibv_send_wr, tso.mss);
SAME_STRUCT(struct mlxd_abi_send_wr, struct ibv_send_wr);

/* struct ibv_recv_wr */
SAME(struct mlxd_abi_recv_wr, struct ibv_recv_wr, wr_id);
SAME(struct mlxd_abi_recv_wr, struct ibv_recv_wr, next);
SAME(struct mlxd_abi_recv_wr, struct ibv_recv_wr, sg_list);
SAME(struct mlxd_abi_recv_wr, struct ibv_recv_wr, num_sge);
SAME_STRUCT(struct mlxd_abi_recv_wr, struct ibv_recv_wr);

/* struct ibv_wc */
SAME(struct mlxd_abi_wc, struct ibv_wc, wr_id);
SAME(struct mlxd_abi_wc, struct ibv_wc, status);
SAME(struct mlxd_abi_wc, struct ibv_wc, opcode);
SAME(struct mlxd_abi_wc, struct ibv_wc, vendor_err);
SAME(struct mlxd_abi_wc, struct ibv_wc, byte_len);
SAME(struct mlxd_abi_wc, struct ibv_wc, imm_data);
SAME(struct mlxd_abi_wc, struct ibv_wc, invalidated_rkey);
SAME(struct mlxd_abi_wc, struct ibv_wc, qp_num);
SAME(struct mlxd_abi_wc, struct ibv_wc, src_qp);
SAME(struct mlxd_abi_wc, struct ibv_wc, wc_flags);
SAME(struct mlxd_abi_wc, struct ibv_wc, pkey_index);
SAME(struct mlxd_abi_wc, struct ibv_wc, slid);
SAME(struct mlxd_abi_wc, struct ibv_wc, sl);
SAME(struct mlxd_abi_wc, struct ibv_wc, dlid_path_bits);
SAME_STRUCT(struct mlxd_abi_wc, struct ibv_wc);

/* struct ibv_qp_cap */
SAME(struct mlxd_abi_qp_cap, struct ibv_qp_cap, max_send_wr);
SAME(struct mlxd_abi_qp_cap, struct ibv_qp_cap, max_recv_wr);
SAME(struct mlxd_abi_qp_cap, struct ibv_qp_cap, max_send_sge);
SAME(struct mlxd_abi_qp_cap, struct ibv_qp_cap, max_recv_sge);
SAME(struct mlxd_abi_qp_cap, struct ibv_qp_cap, max_inline_data);
SAME_STRUCT(struct mlxd_abi_qp_cap, struct ibv_qp_cap);

/* struct ibv_qp_init_attr */
SAME(struct mlxd_abi_qp_init_attr, struct ibv_qp_init_attr, qp_context);
SAME(struct mlxd_abi_qp_init_attr, struct ibv_qp_init_attr, send_cq);
SAME(struct mlxd_abi_qp_init_attr, struct ibv_qp_init_attr, recv_cq);
SAME(struct mlxd_abi_qp_init_attr, struct ibv_qp_init_attr, srq);
SAME(struct mlxd_abi_qp_init_attr, struct ibv_qp_init_attr, cap);
SAME(struct mlxd_abi_qp_init_attr, struct ibv_qp_init_attr, qp_type);
SAME(struct mlxd_abi_qp_init_attr, struct ibv_qp_init_attr, sq_sig_all);
SAME_STRUCT(struct mlxd_abi_qp_init_attr, struct ibv_qp_init_attr);

/* union ibv_gid */
SAME(union mlxd_abi_gid, union ibv_gid, raw);
SAME(union mlxd_abi_gid, union ibv_gid, global);
SAME(union mlxd_abi_gid, union ibv_gid, global.subnet_prefix);
SAME(union mlxd_abi_gid, union ibv_gid, global.interface_id);
SAME_STRUCT(union mlxd_abi_gid, union ibv_gid);

/* struct ibv_global_route */
SAME(struct mlxd_abi_global_route, struct ibv_global_route, dgid);
SAME(struct mlxd_abi_global_route, struct ibv_global_route, flow_label);
SAME(struct mlxd_abi_global_route, struct ibv_global_route, sgid_index);
SAME(struct mlxd_abi_global_route, struct ibv_global_route, hop_limit);
SAME(struct mlxd_abi_global_route, struct ibv_global_route, traffic_class);
SAME_STRUCT(struct mlxd_abi_global_route, struct ibv_global_route);

/* struct ibv_ah_attr */
SAME(struct mlxd_abi_ah_attr, struct ibv_ah_attr, grh);
SAME(struct mlxd_abi_ah_attr, struct ibv_ah_attr, dlid);
SAME(struct mlxd_abi_ah_attr, struct ibv_ah_attr, sl);
SAME(struct mlxd_abi_ah_attr, struct ibv_ah_attr, src_path_bits);
SAME(struct mlxd_abi_ah_attr, struct ibv_ah_attr, static_rate);
SAME(struct mlxd_abi_ah_attr, struct ibv_ah_attr, is_global);
SAME(struct mlxd_abi_ah_attr, struct ibv_ah_attr, port_num);
SAME_STRUCT(struct mlxd_abi_ah_attr, struct ibv_ah_attr);

/* struct ibv_qp_attr */
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, qp_state);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, cur_qp_state);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, path_mtu);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, path_mig_state);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, qkey);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, rq_psn);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, sq_psn);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, dest_qp_num);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, qp_access_flags);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, cap);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, ah_attr);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, alt_ah_attr);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, pkey_index);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, alt_pkey_index);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, en_sqd_async_notify);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, sq_draining);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, max_rd_atomic);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, max_dest_rd_atomic);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, min_rnr_timer);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, port_num);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, timeout);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, retry_cnt);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, rnr_retry);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, alt_port_num);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, alt_timeout);
SAME(struct mlxd_abi_qp_attr, struct ibv_qp_attr, rate_limit);
SAME_STRUCT(struct mlxd_abi_qp_attr, struct ibv_qp_attr);

_Static_assert(sizeof(mlxd_abi_port_attr) <= sizeof(struct ibv_port_attr), "port attr prefix");
_Static_assert(sizeof(mlxd_abi_port_attr_buf) >= 2 * sizeof(struct ibv_port_attr),
               "room for a newer struct ibv_port_attr");
/* struct ibv_context_ops: nothing past the last slot */
_Static_assert(sizeof(struct mlxd_abi_context_ops) == 32 * sizeof(void (*)(void)), "32 slots");

/* enum values */
SAME_ENUM(MLXD_ABI_PORT_ACTIVE, IBV_PORT_ACTIVE);
SAME_ENUM(MLXD_ABI_LINK_LAYER_INFINIBAND, IBV_LINK_LAYER_INFINIBAND);
SAME_ENUM(MLXD_ABI_LINK_LAYER_ETHERNET, IBV_LINK_LAYER_ETHERNET);
SAME_ENUM(MLXD_ABI_ACCESS_LOCAL_WRITE, IBV_ACCESS_LOCAL_WRITE);
SAME_ENUM(MLXD_ABI_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_WRITE);
SAME_ENUM(MLXD_ABI_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_READ);
SAME_ENUM(MLXD_ABI_QPT_RC, IBV_QPT_RC);
SAME_ENUM(MLXD_ABI_QPS_RESET, IBV_QPS_RESET);
SAME_ENUM(MLXD_ABI_QPS_INIT, IBV_QPS_INIT);
SAME_ENUM(MLXD_ABI_QPS_RTR, IBV_QPS_RTR);
SAME_ENUM(MLXD_ABI_QPS_RTS, IBV_QPS_RTS);
SAME_ENUM(MLXD_ABI_QPS_ERR, IBV_QPS_ERR);
SAME_ENUM(MLXD_ABI_QP_STATE, IBV_QP_STATE);
SAME_ENUM(MLXD_ABI_QP_ACCESS_FLAGS, IBV_QP_ACCESS_FLAGS);
SAME_ENUM(MLXD_ABI_QP_PKEY_INDEX, IBV_QP_PKEY_INDEX);
SAME_ENUM(MLXD_ABI_QP_PORT, IBV_QP_PORT);
SAME_ENUM(MLXD_ABI_QP_AV, IBV_QP_AV);
SAME_ENUM(MLXD_ABI_QP_PATH_MTU, IBV_QP_PATH_MTU);
SAME_ENUM(MLXD_ABI_QP_TIMEOUT, IBV_QP_TIMEOUT);
SAME_ENUM(MLXD_ABI_QP_RETRY_CNT, IBV_QP_RETRY_CNT);
SAME_ENUM(MLXD_ABI_QP_RNR_RETRY, IBV_QP_RNR_RETRY);
SAME_ENUM(MLXD_ABI_QP_RQ_PSN, IBV_QP_RQ_PSN);
SAME_ENUM(MLXD_ABI_QP_MAX_QP_RD_ATOMIC, IBV_QP_MAX_QP_RD_ATOMIC);
SAME_ENUM(MLXD_ABI_QP_MIN_RNR_TIMER, IBV_QP_MIN_RNR_TIMER);
SAME_ENUM(MLXD_ABI_QP_SQ_PSN, IBV_QP_SQ_PSN);
SAME_ENUM(MLXD_ABI_QP_MAX_DEST_RD_ATOMIC, IBV_QP_MAX_DEST_RD_ATOMIC);
SAME_ENUM(MLXD_ABI_QP_DEST_QPN, IBV_QP_DEST_QPN);
SAME_ENUM(MLXD_ABI_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE);
SAME_ENUM(MLXD_ABI_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_WRITE_WITH_IMM);
SAME_ENUM(MLXD_ABI_WR_RDMA_READ, IBV_WR_RDMA_READ);
SAME_ENUM(MLXD_ABI_SEND_SIGNALED, IBV_SEND_SIGNALED);
SAME_ENUM(MLXD_ABI_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE);
SAME_ENUM(MLXD_ABI_WC_RDMA_READ, IBV_WC_RDMA_READ);
SAME_ENUM(MLXD_ABI_WC_RECV, IBV_WC_RECV);
SAME_ENUM(MLXD_ABI_WC_RECV_RDMA_WITH_IMM, IBV_WC_RECV_RDMA_WITH_IMM);
SAME_ENUM(MLXD_ABI_WC_WITH_IMM, IBV_WC_WITH_IMM);
SAME_ENUM(MLXD_ABI_WC_SUCCESS, IBV_WC_SUCCESS);
SAME_ENUM(MLXD_ABI_WC_WR_FLUSH_ERR, IBV_WC_WR_FLUSH_ERR);
SAME_ENUM(MLXD_ABI_WC_RETRY_EXC_ERR, IBV_WC_RETRY_EXC_ERR);
SAME_ENUM(MLXD_ABI_WC_RNR_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR);
SAME_ENUM(MLXD_ABI_MTU_256, IBV_MTU_256);
SAME_ENUM(MLXD_ABI_MTU_4096, IBV_MTU_4096);

int main(void) {
  printf(
      "verbs ABI: 250 members of 20 structs and 42 enum values as in "
      "<infiniband/verbs.h>; struct ibv_send_wr %zu bytes, struct ibv_wc %zu, struct "
      "ibv_qp_attr %zu, struct ibv_port_attr %zu (ours %zu, given %zu)\n",
      sizeof(struct ibv_send_wr), sizeof(struct ibv_wc), sizeof(struct ibv_qp_attr),
      sizeof(struct ibv_port_attr), sizeof(mlxd_abi_port_attr), sizeof(mlxd_abi_port_attr_buf));
  return 0;
}

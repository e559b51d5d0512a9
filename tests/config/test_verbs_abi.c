/* The libibverbs ABI that rdma/abi.h declares by hand, checked
 * against the real <infiniband/verbs.h> (built only where CMake finds that
 * header; the library itself never includes it): every field the probe reads
 * at the same offset, the structs no larger than what is passed, the enum
 * values the same. A mismatch fails the build of this test. */
#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdio.h>

#include "rdma/abi.h"

#define SAME_OFFSET(ours, theirs, field) \
  _Static_assert(offsetof(ours, field) == offsetof(theirs, field), #field " moved")

SAME_OFFSET(mlxd_abi_device_attr, struct ibv_device_attr, phys_port_cnt);
SAME_OFFSET(mlxd_abi_device_attr, struct ibv_device_attr, max_pkeys);
SAME_OFFSET(mlxd_abi_device_attr, struct ibv_device_attr, vendor_id);
_Static_assert(sizeof(mlxd_abi_device_attr) == sizeof(struct ibv_device_attr),
               "struct ibv_device_attr size");

SAME_OFFSET(mlxd_abi_port_attr, struct ibv_port_attr, state);
SAME_OFFSET(mlxd_abi_port_attr, struct ibv_port_attr, active_mtu);
SAME_OFFSET(mlxd_abi_port_attr, struct ibv_port_attr, gid_tbl_len);
SAME_OFFSET(mlxd_abi_port_attr, struct ibv_port_attr, lid);
SAME_OFFSET(mlxd_abi_port_attr, struct ibv_port_attr, link_layer);
SAME_OFFSET(mlxd_abi_port_attr, struct ibv_port_attr, port_cap_flags2);
_Static_assert(sizeof(mlxd_abi_port_attr) <= sizeof(struct ibv_port_attr), "port attr prefix");
_Static_assert(sizeof(mlxd_abi_port_attr_buf) >= 2 * sizeof(struct ibv_port_attr),
               "room for a newer struct ibv_port_attr");
_Static_assert(sizeof(union ibv_gid) == 16, "union ibv_gid is 16 bytes");
_Static_assert((int)MLXD_ABI_PORT_ACTIVE == (int)IBV_PORT_ACTIVE, "IBV_PORT_ACTIVE");
_Static_assert((int)MLXD_ABI_LINK_LAYER_INFINIBAND == (int)IBV_LINK_LAYER_INFINIBAND,
               "link layer IB");
_Static_assert((int)MLXD_ABI_LINK_LAYER_ETHERNET == (int)IBV_LINK_LAYER_ETHERNET,
               "link layer Ethernet");
_Static_assert(IBV_MTU_256 == 1 && IBV_MTU_4096 == 5, "enum ibv_mtu");

int main(void) {
  printf(
      "verbs ABI: struct ibv_device_attr %zu bytes, struct ibv_port_attr %zu bytes (ours %zu, "
      "given %zu): the same layout\n",
      sizeof(struct ibv_device_attr), sizeof(struct ibv_port_attr), sizeof(mlxd_abi_port_attr),
      sizeof(mlxd_abi_port_attr_buf));
  return 0;
}

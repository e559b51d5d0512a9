/* Private: the RDMA devices of this machine, seen through libibverbs loaded
 * at run time (dlopen "libibverbs.so.1", or MLXDIST_IBVERBS_LIB). Nothing
 * links against libibverbs and nothing includes its headers: the few entry
 * points and structures used are declared in abi.h, each with where its
 * layout comes from. See docs/jaccl.md.
 *
 * The probe only looks (lists devices, opens each, queries its ports and
 * GIDs); it never creates a protection domain, queue or memory region. */
#ifndef MLXD_RDMA_PROBE_H
#define MLXD_RDMA_PROBE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MLXD_VERBS_MAX_DEVS 64
#define MLXD_VERBS_MAX_PORTS 8

typedef enum {
  MLXD_VERBS_OK = 0,      /* the library loaded and listed its devices (maybe none) */
  MLXD_VERBS_NO_LIBRARY,  /* dlopen failed */
  MLXD_VERBS_BAD_LIBRARY, /* it loaded but lacks an entry point */
  MLXD_VERBS_LIST_FAILED, /* ibv_get_device_list returned NULL */
} mlxd_verbs_lib_state;

typedef struct mlxd_verbs_port {
  int num;        /* 1-based port number */
  bool queried;   /* ibv_query_port succeeded (else err says why) */
  int state;      /* IBV_PORT_* (4: ACTIVE) */
  int active_mtu; /* bytes (256..4096); 0 unknown */
  int link_layer; /* 1: InfiniBand, 2: Ethernet, 0: unspecified */
  uint16_t lid;   /* InfiniBand: the port's LID */
  int gid_tbl_len;
  int gid_index;     /* the GID it would use; -1: none */
  uint8_t gid[16];   /* that GID */
  char gid_type[16]; /* "RoCE v2", "RoCE v1", "IB/RoCE v1", "" unknown (sysfs) */
  char err[160];     /* why something could not be told ("" none) */
} mlxd_verbs_port;

typedef struct mlxd_verbs_dev {
  char name[64];
  int nports; /* phys_port_cnt (capped at MLXD_VERBS_MAX_PORTS) */
  mlxd_verbs_port ports[MLXD_VERBS_MAX_PORTS];
  char err[160]; /* the device could not be opened or queried ("" none) */
} mlxd_verbs_dev;

typedef struct mlxd_verbs_probe {
  int lib;            /* mlxd_verbs_lib_state */
  char lib_name[256]; /* what was loaded (or tried) */
  char lib_err[256];  /* dlerror() or the missing symbol */
  int ndev;           /* devices listed (those past MLXD_VERBS_MAX_DEVS are not kept) */
  mlxd_verbs_dev devs[MLXD_VERBS_MAX_DEVS];
} mlxd_verbs_probe;

/* Look at this machine's devices (never fails: p->lib says what happened).
 * Honours MLXDIST_IB_PORT (only that port) and MLXDIST_IB_GID_INDEX (that
 * GID instead of the one chosen by content). p is large: allocate it. */
void mlxd_verbs_probe_run(mlxd_verbs_probe* p);
/* Whether a device has a usable port (mlxd_verbs_active_port); else why (a sentence naming the
 * library, the devices and their ports' states). */
bool mlxd_verbs_usable(const mlxd_verbs_probe* p, char* why, size_t len);
/* The device named name, or NULL. */
const mlxd_verbs_dev* mlxd_verbs_find(const mlxd_verbs_probe* p, const char* name);
/* The first port of d that jaccl could use (active, with the LID on
 * InfiniBand or a GID on Ethernet), or NULL. */
const mlxd_verbs_port* mlxd_verbs_active_port(const mlxd_verbs_dev* d);

/* Look at port `num` of a device opened with L (ctx from its ibv_open_device)
 * as the probe does: its state, MTU, link layer, LID and the GID chosen
 * (MLXDIST_IB_GID_INDEX honoured). pt is overwritten; pt->err says what could
 * not be told. Used by the device layer (rdma/ibv.c) to choose the same. */
struct mlxd_verbs_lib;
struct mlxd_abi_context;
void mlxd_verbs_query_port(const struct mlxd_verbs_lib* L, struct mlxd_abi_context* ctx,
                           const char* dev, int num, mlxd_verbs_port* pt);

/* A port's state in words for messages: "ACTIVE", "DOWN", ..., "ACTIVE but
 * without a GID" (active, yet no address to use: see mlxd_verbs_active_port),
 * "unknown" (not queried). */
const char* mlxd_verbs_port_word(const mlxd_verbs_port* pt);

/* Pure helpers (tested directly). */
const char* mlxd_verbs_state_name(int state); /* "ACTIVE", "DOWN", ... */
int mlxd_verbs_mtu_bytes(int ibv_mtu);        /* IBV_MTU_1024 (3) -> 1024; 0 if unknown */
const char* mlxd_verbs_link_name(int link_layer);
/* gid is an IPv4-mapped IPv6 address (::ffff:a.b.c.d): what RoCE v2 over IPv4 uses. */
bool mlxd_verbs_gid_is_ipv4(const uint8_t gid[16]);
/* "fe80::1" / "::ffff:10.0.0.1" style text of gid. */
void mlxd_verbs_gid_text(const uint8_t gid[16], char* buf, size_t len);
/* One line for port pt of d: "mlx5_0 port 1: ACTIVE, mtu 4096, Ethernet, GID 3 ::ffff:..." */
void mlxd_verbs_port_line(const mlxd_verbs_dev* d, const mlxd_verbs_port* pt, char* buf,
                          size_t len);

#endif

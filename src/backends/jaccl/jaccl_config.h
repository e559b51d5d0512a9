/* Private to the jaccl backend: MLX's configuration, read exactly as MLX's
 * JACCL reads it (mlx/distributed/jaccl/lib/jaccl/jaccl.cpp, Config::from_env)
 * and checked completely. See docs/jaccl.md.
 *
 *   JACCL_RANK, else MLX_RANK                    this rank, a decimal integer in [0, size)
 *   JACCL_IBV_DEVICES, else MLX_IBV_DEVICES      the path of a JSON file: the device matrix
 *   JACCL_COORDINATOR, else MLX_JACCL_COORDINATOR "ip:port" of rank 0's side channel
 *                                               (not needed with a caller's all-gather)
 *   JACCL_RING, else MLX_JACCL_RING              present (any value): prefer the ring topology
 *
 * As in MLX, the JACCL_ name wins when both are set, and a variable that is
 * set counts even when empty (MLX reads an empty rank as 0; here it is an
 * error naming the variable). The matrix: a JSON list of N rows of N cells;
 * cell [i][j] is the device(s) through which rank i reaches rank j: null, a
 * string, or a list of strings (several wires: multi-rail); the diagonal is
 * null or empty; N is the group size.
 *
 * Errors are structured (util/status.h, MLXD_LAYER_BOOTSTRAP) and name the
 * variable, the file, the problem and where (row, column); nothing here
 * writes "[jaccl]" into a message: the backend renders once. */
#ifndef MLXD_JACCL_CONFIG_H
#define MLXD_JACCL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "net/net.h" /* mlxd_net_addr, mlxd_net_parse_addr */
#include "util/status.h"

#define MLXD_JACCL_MATRIX_MAX_BYTES (16 << 20) /* the file */
#define MLXD_JACCL_MAX_RANKS 1024              /* rows; the matrix holds ranks^2 cells */
#define MLXD_JACCL_MAX_RAILS 16                /* device names in one cell */
#define MLXD_JACCL_DEV_MAX 63 /* a device name's characters (IBV_SYSFS_NAME_MAX - 1) */

/* The device matrix. Cell (i, j) holds names[off[i * size + j]] up to (not
 * including) names[off[i * size + j + 1]]. */
typedef struct mlxd_jaccl_matrix {
  int size;
  int* off;                              /* size * size + 1 entries */
  char (*names)[MLXD_JACCL_DEV_MAX + 1]; /* every name, row by row */
  int nnames;
} mlxd_jaccl_matrix;

void mlxd_jaccl_matrix_free(mlxd_jaccl_matrix* m);
/* The number of devices in cell (i, j) (0: empty). */
int mlxd_jaccl_cell_count(const mlxd_jaccl_matrix* m, int i, int j);
/* Device k of cell (i, j), k < mlxd_jaccl_cell_count(m, i, j). */
const char* mlxd_jaccl_cell_name(const mlxd_jaccl_matrix* m, int i, int j, int k);

/* The name rule of a device in the matrix (1..MLXD_JACCL_DEV_MAX characters of
 * [A-Za-z0-9_.-]): false when s follows it; else true with why ("is an empty
 * string (...)", or "the device name '...' has the character '/' (...)").
 * Shared with mlxdist-launch, which checks a hostfile's "rdma" lists by it. */
bool mlxd_jaccl_dev_name_problem(const char* s, char* why, size_t why_len);

/* Parse len bytes of text (no NUL needed) named name in messages. Pure: no
 * files, no environment. The rules: at most MLXD_JACCL_MATRIX_MAX_BYTES;
 * only the bytes JSON allows (util/json_bytes.h); exactly one document; a
 * non-empty list of at most MLXD_JACCL_MAX_RANKS rows, each a list as long
 * as the matrix; every cell null, a string or a list of at most
 * MLXD_JACCL_MAX_RAILS strings; every name 1..MLXD_JACCL_DEV_MAX characters
 * of [A-Za-z0-9_.-], not twice in one cell; the diagonal null or []. */
int mlxd_jaccl_matrix_parse(const char* text, size_t len, const char* name, mlxd_jaccl_matrix* out,
                            mlxd_status* st);

typedef enum { MLXD_JACCL_MESH = 1, MLXD_JACCL_RING = 2 } mlxd_jaccl_topo;
const char* mlxd_jaccl_topo_name(int topo);
/* MLX's choice: prefer_ring -> ring (every rank's two neighbour cells
 * filled, each with as many devices as cell (0, 1)); else mesh if every
 * off-diagonal cell is filled, else ring if the neighbour cells are. A group
 * of one has no topology (*topo = 0). Otherwise an error naming an empty (or
 * unevenly filled) cell, by row and column, and the file name. */
int mlxd_jaccl_topology(const mlxd_jaccl_matrix* m, bool prefer_ring, const char* name, int* topo,
                        mlxd_status* st);

/* The whole configuration, from the environment. */
typedef struct mlxd_jaccl_config {
  int rank;
  int size;
  const char* rank_var;    /* the variable the rank came from ("JACCL_RANK" or "MLX_RANK") */
  const char* devices_var; /* ... the matrix's path */
  const char* coord_var;   /* ... the coordinator; NULL when not read (caller's all-gather) */
  char path[4096];         /* the matrix file */
  mlxd_jaccl_matrix m;
  bool prefer_ring;
  int topo; /* mlxd_jaccl_topo, 0 for a group of one */
  bool have_coord;
  mlxd_net_addr coord; /* rank 0's side channel (when have_coord) */
} mlxd_jaccl_config;

/* Whether the variables that a start needs are set (is_configured):
 * rank and devices, and without a caller's all-gather the coordinator. */
bool mlxd_jaccl_env_present(bool with_bootstrap);
/* Read and check everything (with_bootstrap: the coordinator is not read).
 * On error nothing is left to free. */
int mlxd_jaccl_config_load(bool with_bootstrap, mlxd_jaccl_config* cfg, mlxd_status* st);
void mlxd_jaccl_config_free(mlxd_jaccl_config* cfg);
/* Read path (a regular file of at most MLXD_JACCL_MATRIX_MAX_BYTES) without
 * blocking: a FIFO or device is refused by its kind. var names the variable
 * in messages. *text is NUL-terminated; free() it. */
int mlxd_jaccl_read_file(const char* var, const char* path, char** text, size_t* len,
                         mlxd_status* st);

#endif

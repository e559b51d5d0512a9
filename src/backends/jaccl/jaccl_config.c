/* MLX's jaccl configuration: the environment and the device matrix
 * (jaccl_config.h). Three steps so that the parser can be fuzzed: read (a
 * regular file, bounded, never blocking), parse (pure), check against the
 * rank and the topology. Arrays are walked with cJSON_ArrayForEach. */
#include "backends/jaccl/jaccl_config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/cjson_rt.h"
#include "util/env.h"
#include "util/json_doc.h"
#include "util/user_file.h"

#define EXPECTED_FORMAT                                                                         \
  "a JSON list of N rows of N cells, cell [i][j] the device(s) rank i reaches rank j through: " \
  "null, \"name\" or [\"name\", ...]"
/* An upper bound of the JSON values cJSON may build (its memory): every cell and name of a
 * full matrix of MLXD_JACCL_MAX_RANKS ranks, with room for a few rails. */
#define MAX_VALUES (1L << 21)
#define DEV_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"

void mlxd_jaccl_matrix_free(mlxd_jaccl_matrix* m) {
  free(m->off);
  free(m->names);
  memset(m, 0, sizeof *m);
}

int mlxd_jaccl_cell_count(const mlxd_jaccl_matrix* m, int i, int j) {
  size_t c = (size_t)i * (size_t)m->size + (size_t)j;
  return m->off[c + 1] - m->off[c];
}

const char* mlxd_jaccl_cell_name(const mlxd_jaccl_matrix* m, int i, int j, int k) {
  return m->names[m->off[(size_t)i * (size_t)m->size + (size_t)j] + k];
}

bool mlxd_jaccl_dev_name_problem(const char* s, char* why, size_t why_len) {
  size_t n = strlen(s);
  if (n == 0) {
    snprintf(why, why_len,
             "is an empty string (expected a device name such as \"mlx5_0\" or \"rxe0\", or "
             "null for no device)");
    return true;
  }
  if (n > MLXD_JACCL_DEV_MAX) {
    snprintf(why, why_len,
             "the device name '%.24s...' is %zu characters long (expected at most %d)", s, n,
             MLXD_JACCL_DEV_MAX);
    return true;
  }
  if (s[0] == '.') { /* "." and ".." are directories, never devices (sysfs is looked in by name) */
    snprintf(why, why_len,
             "the device name '%.24s' starts with '.' (expected a letter or digit first)", s);
    return true;
  }
  size_t ok = strspn(s, DEV_CHARS);
  if (s[ok] == '\0') return false;
  unsigned char b = (unsigned char)s[ok];
  char what[32];
  if (b > 0x20 && b < 0x7f)
    snprintf(what, sizeof what, "the character '%c'", b);
  else
    snprintf(what, sizeof what, "the byte 0x%02x", b);
  snprintf(why, why_len,
           "the device name '%.*s' has %s (expected letters, digits, '_', '.' and '-')",
           (int)(ok < 64 ? ok : 64), s, what);
  return true;
}

/* One device name of cell (r, c), item k (-1: the cell is the string itself). */
static int check_name(const char* s, const char* name, int r, int c, int k, mlxd_status* st) {
  char item[32] = "", why[200];
  if (k >= 0) snprintf(item, sizeof item, " item %d", k);
  if (!mlxd_jaccl_dev_name_problem(s, why, sizeof why)) return 0;
  return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                      "device matrix '%s': row %d, column %d%s%s%s", name, r, c, item,
                      s[0] ? ": " : " ", why);
}

/* The shape and every cell; counts the names into *nnames. */
static int check_matrix(const cJSON* root, const char* name, int* n_out, long* nnames,
                        mlxd_status* st) {
  if (!cJSON_IsArray(root) || !root->child)
    return mlxd_fail_at(
        st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
        "device matrix '%s' is not a non-empty JSON list: it is %s (expected " EXPECTED_FORMAT ")",
        name, mlxd_json_kind(root));
  long n = 0;
  const cJSON* row;
  cJSON_ArrayForEach(row, root) n++;
  if (n > MLXD_JACCL_MAX_RANKS)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "device matrix '%s' has %ld rows (expected at most %d ranks)", name, n,
                        MLXD_JACCL_MAX_RANKS);
  int r = 0;
  *nnames = 0;
  cJSON_ArrayForEach(row, root) {
    if (!cJSON_IsArray(row))
      return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "device matrix '%s': row %d is %s (expected a list of %ld cells, one "
                          "per rank)",
                          name, r, mlxd_json_kind(row), n);
    int c = 0;
    const cJSON* cell;
    cJSON_ArrayForEach(cell, row) {
      if (c >= n) break;
      if (cJSON_IsString(cell)) {
        if (check_name(cell->valuestring, name, r, c, -1, st)) return st->code;
        ++*nnames;
      } else if (cJSON_IsArray(cell)) {
        int k = 0;
        const cJSON* s;
        cJSON_ArrayForEach(s, cell) {
          if (!cJSON_IsString(s))
            return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                                "device matrix '%s': row %d, column %d: item %d is %s (expected "
                                "a device name string)",
                                name, r, c, k, mlxd_json_kind(s));
          if (check_name(s->valuestring, name, r, c, k, st)) return st->code;
          const cJSON* p = cell->child;
          for (int q = 0; q < k; q++, p = p->next)
            if (strcmp(p->valuestring, s->valuestring) == 0)
              return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                                  "device matrix '%s': row %d, column %d names '%s' twice (items "
                                  "%d and %d; expected each wire once)",
                                  name, r, c, s->valuestring, q, k);
          if (++k > MLXD_JACCL_MAX_RAILS)
            return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                                "device matrix '%s': row %d, column %d lists more than %d devices",
                                name, r, c, MLXD_JACCL_MAX_RAILS);
        }
        *nnames += k;
      } else if (!cJSON_IsNull(cell)) {
        return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                            "device matrix '%s': row %d, column %d is %s (expected null, a "
                            "device name string or a list of them)",
                            name, r, c, mlxd_json_kind(cell));
      }
      if (c == r && !cJSON_IsNull(cell) && !(cJSON_IsArray(cell) && !cell->child))
        return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                            "device matrix '%s': row %d, column %d is on the diagonal and names "
                            "a device (expected null: a rank does not reach itself)",
                            name, r, c);
      c++;
    }
    long have = cJSON_GetArraySize(row);
    if (have != n)
      return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "device matrix '%s': row %d has %ld cells but the matrix has %ld rows "
                          "(expected a square matrix: one cell per rank in every row)",
                          name, r, have, n);
    r++;
  }
  *n_out = (int)n;
  return 0;
}

int mlxd_jaccl_matrix_parse(const char* text, size_t len, const char* name, mlxd_jaccl_matrix* out,
                            mlxd_status* st) {
  memset(out, 0, sizeof *out);
  if (len > MLXD_JACCL_MATRIX_MAX_BYTES)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "device matrix '%s' is %zu bytes (expected at most %d)", name, len,
                        MLXD_JACCL_MATRIX_MAX_BYTES);
  size_t values = mlxd_json_value_bound(text, len);
  if (values > (size_t)MAX_VALUES)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "device matrix '%s' holds up to %zu JSON values (expected at most %ld)",
                        name, values, MAX_VALUES);
  cJSON* root = mlxd_json_parse_doc(text, len, "device matrix", name, EXPECTED_FORMAT, st);
  if (!root) return st->code;
  int n = 0;
  long nnames = 0;
  int rc = check_matrix(root, name, &n, &nnames, st);
  if (rc) goto done;
  out->off = malloc(((size_t)n * (size_t)n + 1) * sizeof *out->off);
  out->names = malloc((size_t)(nnames ? nnames : 1) * sizeof *out->names);
  if (!out->off || !out->names) {
    rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP,
                      "out of memory parsing device matrix '%s'", name);
    goto done;
  }
  out->size = n;
  int k = 0;
  size_t cell = 0;
  const cJSON* row;
  cJSON_ArrayForEach(row, root) {
    const cJSON* v;
    cJSON_ArrayForEach(v, row) {
      out->off[cell++] = k;
      if (cJSON_IsString(v)) {
        snprintf(out->names[k++], sizeof out->names[0], "%s", v->valuestring);
      } else if (cJSON_IsArray(v)) {
        const cJSON* s;
        cJSON_ArrayForEach(s, v)
            snprintf(out->names[k++], sizeof out->names[0], "%s", s->valuestring);
      }
    }
  }
  out->off[cell] = k;
  out->nnames = k;
done:
  cJSON_Delete(root);
  if (rc) mlxd_jaccl_matrix_free(out);
  return rc;
}

const char* mlxd_jaccl_topo_name(int topo) {
  return topo == MLXD_JACCL_MESH ? "mesh" : topo == MLXD_JACCL_RING ? "ring" : "none";
}

/* The first neighbour cell that breaks the ring ((row, col) in *r, *c), or false. */
static bool ring_gap(const mlxd_jaccl_matrix* m, int* r, int* c) {
  int n = m->size, want = mlxd_jaccl_cell_count(m, 0, 1);
  for (int i = 0; i < n; i++) {
    int nb[2] = {(i + n - 1) % n, (i + 1) % n};
    for (int s = 0; s < 2; s++) {
      int cnt = mlxd_jaccl_cell_count(m, i, nb[s]);
      if (cnt == 0 || cnt != want) {
        *r = i, *c = nb[s];
        return true;
      }
    }
  }
  return false;
}

static bool mesh_gap(const mlxd_jaccl_matrix* m, int* r, int* c) {
  for (int i = 0; i < m->size; i++)
    for (int j = 0; j < m->size; j++)
      if (i != j && mlxd_jaccl_cell_count(m, i, j) == 0) {
        *r = i, *c = j;
        return true;
      }
  return false;
}

static int ring_error(const mlxd_jaccl_matrix* m, const char* name, int r, int c, const char* why,
                      mlxd_status* st) {
  int cnt = mlxd_jaccl_cell_count(m, r, c);
  if (cnt == 0)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "device matrix '%s': %s, but row %d, column %d is empty (rank %d names "
                        "no device to its ring neighbour rank %d)",
                        name, why, r, c, r, c);
  return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                      "device matrix '%s': %s, but row %d, column %d lists %d device(s) and row "
                      "0, column 1 lists %d (every ring link needs the same number of wires)",
                      name, why, r, c, cnt, mlxd_jaccl_cell_count(m, 0, 1));
}

int mlxd_jaccl_topology(const mlxd_jaccl_matrix* m, bool prefer_ring, const char* name, int* topo,
                        mlxd_status* st) {
  *topo = 0;
  if (m->size < 2) return 0;
  int r = 0, c = 0, mr = 0, mc = 0;
  if (prefer_ring) {
    if (ring_gap(m, &r, &c)) return ring_error(m, name, r, c, "MLX_JACCL_RING asks for a ring", st);
    *topo = MLXD_JACCL_RING;
    return 0;
  }
  if (!mesh_gap(m, &mr, &mc)) {
    *topo = MLXD_JACCL_MESH;
    return 0;
  }
  if (!ring_gap(m, &r, &c)) {
    *topo = MLXD_JACCL_RING;
    return 0;
  }
  if (mlxd_jaccl_cell_count(m, r, c) != 0)
    return ring_error(m, name, r, c, "the matrix is neither a mesh nor a ring", st);
  return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                      "device matrix '%s' is neither a mesh nor a ring: row %d, column %d is "
                      "empty (a mesh needs every off-diagonal cell filled) and row %d, column %d "
                      "is empty (a ring needs each rank's two neighbour cells filled)",
                      name, mr, mc, r, c);
}

/* ---- the environment ---- */

/* The JACCL_ name, else the MLX_ one (MLX's order); *var names the one read. NULL: neither. */
static const char* env2(const char* jaccl, const char* mlx, const char** var) {
  const char* v = mlxd_env_get(jaccl);
  *var = jaccl;
  if (v) return v;
  *var = mlx;
  return mlxd_env_get(mlx);
}

bool mlxd_jaccl_env_present(bool with_bootstrap) {
  const char* var;
  const char* r = env2("JACCL_RANK", "MLX_RANK", &var);
  const char* d = env2("JACCL_IBV_DEVICES", "MLX_IBV_DEVICES", &var);
  const char* c = env2("JACCL_COORDINATOR", "MLX_JACCL_COORDINATOR", &var);
  return r && *r && d && *d && (with_bootstrap || (c && *c));
}

int mlxd_jaccl_read_file(const char* var, const char* path, char** text, size_t* len,
                         mlxd_status* st) {
  char subject[PATH_MAX + 64];
  snprintf(subject, sizeof subject, "the device matrix '%s' (%s)", path, var);
  return mlxd_user_file_read(path, subject, MLXD_JACCL_MATRIX_MAX_BYTES, text, len, st);
}

/* "VAR: " before a parse error's detail. */
static void prefix_var(mlxd_status* st, const char* var) {
  char tmp[2 * MLXD_MSG_MAX];
  snprintf(tmp, sizeof tmp, "%s: %s", var, st->msg);
  snprintf(st->msg, sizeof st->msg, "%.*s", (int)sizeof st->msg - 1, tmp);
}

static int parse_rank(const char* var, const char* v, int* rank, mlxd_status* st) {
  size_t nd = strspn(v, "0123456789");
  if (v[0] == '\0' || nd != strlen(v) || nd > 9)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "%s='%.40s%s' is not a rank (expected a decimal integer: 0 for the first "
                        "rank)",
                        var, v, strlen(v) > 40 ? "..." : "");
  *rank = (int)strtol(v, NULL, 10);
  return 0;
}

void mlxd_jaccl_config_free(mlxd_jaccl_config* cfg) { mlxd_jaccl_matrix_free(&cfg->m); }

int mlxd_jaccl_config_load(bool with_bootstrap, mlxd_jaccl_config* cfg, mlxd_status* st) {
  memset(cfg, 0, sizeof *cfg);
  const char* rank_s = env2("JACCL_RANK", "MLX_RANK", &cfg->rank_var);
  const char* dev_s = env2("JACCL_IBV_DEVICES", "MLX_IBV_DEVICES", &cfg->devices_var);
  const char* coord_s = NULL;
  if (!with_bootstrap)
    coord_s = env2("JACCL_COORDINATOR", "MLX_JACCL_COORDINATOR", &cfg->coord_var);
  const char* ring_var;
  cfg->prefer_ring = env2("JACCL_RING", "MLX_JACCL_RING", &ring_var) != NULL;
  /* every missing variable named in one message */
  char missing[200] = "";
  size_t used = 0;
  if (!rank_s) used += (size_t)snprintf(missing + used, sizeof missing - used, "MLX_RANK");
  if (!dev_s)
    used += (size_t)snprintf(missing + used, sizeof missing - used, "%sMLX_IBV_DEVICES",
                             used ? ", " : "");
  if (!with_bootstrap && !coord_s)
    used += (size_t)snprintf(missing + used, sizeof missing - used, "%sMLX_JACCL_COORDINATOR",
                             used ? ", " : "");
  if (used)
    return mlxd_fail_at(
        st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP,
        "its configuration is missing: %s not set (nor the JACCL_ form): jaccl needs "
        "this rank, the device matrix file%s (docs/jaccl.md)",
        missing, with_bootstrap ? "" : " and rank 0's ip:port");
  if (parse_rank(cfg->rank_var, rank_s, &cfg->rank, st)) return st->code;
  if (!dev_s[0])
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "%s is set but empty (expected the path of the device matrix, a JSON "
                        "file)",
                        cfg->devices_var);
  if (strlen(dev_s) >= sizeof cfg->path)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "%s is a path of %zu characters (expected fewer than %zu)",
                        cfg->devices_var, strlen(dev_s), sizeof cfg->path);
  snprintf(cfg->path, sizeof cfg->path, "%s", dev_s);
  char* text = NULL;
  size_t len = 0;
  if (mlxd_jaccl_read_file(cfg->devices_var, cfg->path, &text, &len, st)) return st->code;
  int rc = mlxd_jaccl_matrix_parse(text, len, cfg->path, &cfg->m, st);
  free(text);
  if (rc == 0) rc = mlxd_jaccl_topology(&cfg->m, cfg->prefer_ring, cfg->path, &cfg->topo, st);
  if (rc) {
    prefix_var(st, cfg->devices_var);
    mlxd_jaccl_config_free(cfg);
    return rc;
  }
  cfg->size = cfg->m.size;
  if (cfg->rank >= cfg->size) {
    rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                      "%s=%d is out of range: the device matrix '%s' (%s) has %d row%s, so the "
                      "ranks are 0..%d",
                      cfg->rank_var, cfg->rank, cfg->path, cfg->devices_var, cfg->size,
                      cfg->size == 1 ? "" : "s", cfg->size - 1);
    mlxd_jaccl_config_free(cfg);
    return rc;
  }
  if (coord_s) {
    char why[300];
    if (mlxd_net_parse_addr(coord_s, false, &cfg->coord, why, sizeof why) != 0) {
      rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "%s: bad coordinator address: %s (rank 0's side channel, e.g. "
                        "\"10.0.0.1:32323\")",
                        cfg->coord_var, why);
      mlxd_jaccl_config_free(cfg);
      return rc;
    }
    cfg->have_coord = true;
  }
  return 0;
}

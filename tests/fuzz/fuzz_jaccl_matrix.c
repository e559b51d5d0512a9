/* Fuzz target: jaccl's device matrix parser (backends/jaccl/jaccl_config.c,
 * mlxd_jaccl_matrix_parse), the whole input as the file's bytes (no NUL
 * after them), then the topology under both preferences. It must never
 * crash or read past the input; what it accepts must be a square matrix of
 * 1..MAX ranks whose cells hold valid names (1..63 characters of
 * [A-Za-z0-9_.-], at most MAX_RAILS, none twice in a cell), an empty
 * diagonal, and no byte JSON forbids; what it refuses must say why, naming
 * the file. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/jaccl/jaccl_config.h"
#include "util/json_bytes.h"

#define NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mlxd_jaccl_matrix m;
  mlxd_status st = {0};
  int rc = mlxd_jaccl_matrix_parse((const char*)data, size, "fuzz.json", &m, &st);
  if (rc != 0) {
    if (m.off || m.names || m.size || !st.msg[0] || st.code != rc) abort();
    if (!strstr(st.msg, "fuzz.json") && rc != MLXD_ENOMEM) abort();
    return 0;
  }
  if (mlxd_json_bad_byte((const char*)data, size, NULL, NULL, 0)) abort();
  if (m.size < 1 || m.size > MLXD_JACCL_MAX_RANKS) abort();
  int total = 0;
  for (int i = 0; i < m.size; i++)
    for (int j = 0; j < m.size; j++) {
      int n = mlxd_jaccl_cell_count(&m, i, j);
      if (n < 0 || n > MLXD_JACCL_MAX_RAILS || (i == j && n != 0)) abort();
      for (int k = 0; k < n; k++) {
        const char* s = mlxd_jaccl_cell_name(&m, i, j, k);
        size_t len = strlen(s);
        if (len < 1 || len > MLXD_JACCL_DEV_MAX || strspn(s, NAME_CHARS) != len) abort();
        for (int q = 0; q < k; q++)
          if (strcmp(s, mlxd_jaccl_cell_name(&m, i, j, q)) == 0) abort();
      }
      total += n;
    }
  if (total != m.nnames) abort();
  for (int ring = 0; ring < 2; ring++) {
    int topo = -1;
    mlxd_status ts = {0};
    int trc = mlxd_jaccl_topology(&m, ring != 0, "fuzz.json", &topo, &ts);
    if (trc != 0 && (!strstr(ts.msg, "fuzz.json") || m.size < 2)) abort();
    if (trc == 0 && m.size >= 2 && topo != MLXD_JACCL_MESH && topo != MLXD_JACCL_RING) abort();
    if (trc == 0 && ring && m.size >= 2 && topo != MLXD_JACCL_RING) abort();
  }
  mlxd_jaccl_matrix_free(&m);
  return 0;
}

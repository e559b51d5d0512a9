/* Private: cJSON loaded at run time, on the first JSON document a user's file
 * holds (util/json_doc.h, mlxd_json_parse_doc): a rank whose hostfile is
 * plain (what mlxdist-launch writes: net/hostfile.c reads it without
 * cJSON) never maps libcjson. Mapping and relocating it cost every process
 * 0.45-0.75 ms of CPU and 7 page faults at start on the 2-core VM, 1,024 times
 * over in a 1,024-rank job (docs/scale.md, "Where a rank's CPU goes (branch init256)").
 *
 * The users (json_doc.c, net/hostfile.c, backends/jaccl/
 * jaccl_config.c) include this header after cJSON's own: each cJSON function
 * they call is a macro naming its pointer in mlxd_cjson, whose type is the
 * function's own (__typeof__ of cJSON's declaration), so every call is checked
 * against cJSON's header as a direct call would be; cJSON_ArrayForEach is a
 * macro over the nodes' fields and needs nothing. Only on a document that
 * mlxd_json_parse_doc returned (so after the load succeeded) may any of them
 * be called. A function added to a user must be added to MLXD_CJSON_FNS
 * (tests/config: config_no_cjson_link checks the library links no libcjson).
 * Tools and tests that build JSON themselves link libcjson and do not include
 * this header. */
#ifndef MLXD_CJSON_RT_H
#define MLXD_CJSON_RT_H

#include <cjson/cJSON.h>

#include "util/status.h"

#define MLXD_CJSON_FNS(X)      \
  X(cJSON_ParseWithLengthOpts) \
  X(cJSON_Delete)              \
  X(cJSON_IsArray)             \
  X(cJSON_IsObject)            \
  X(cJSON_IsString)            \
  X(cJSON_IsNumber)            \
  X(cJSON_IsBool)              \
  X(cJSON_IsNull)              \
  X(cJSON_GetArraySize)        \
  X(cJSON_GetArrayItem)

typedef struct mlxd_cjson_table {
#define MLXD_CJSON_MEMBER(f) __typeof__(f)* f;
  MLXD_CJSON_FNS(MLXD_CJSON_MEMBER)
#undef MLXD_CJSON_MEMBER
} mlxd_cjson_table;

/* Filled once by mlxd_cjson_load; read-only after. */
extern mlxd_cjson_table mlxd_cjson;

/* Load libcjson (once per process; thread-safe). 0, or MLXD_ESYS with st
 * saying which library could not be loaded or lacks which function, and what
 * needs it (what: "hostfile 'x.json'", ...). Never blocks on anything but the
 * dynamic loader. */
int mlxd_cjson_load(const char* what, mlxd_status* st);

#ifndef MLXD_CJSON_NO_MACROS
#define cJSON_ParseWithLengthOpts (mlxd_cjson.cJSON_ParseWithLengthOpts)
#define cJSON_Delete (mlxd_cjson.cJSON_Delete)
#define cJSON_IsArray (mlxd_cjson.cJSON_IsArray)
#define cJSON_IsObject (mlxd_cjson.cJSON_IsObject)
#define cJSON_IsString (mlxd_cjson.cJSON_IsString)
#define cJSON_IsNumber (mlxd_cjson.cJSON_IsNumber)
#define cJSON_IsBool (mlxd_cjson.cJSON_IsBool)
#define cJSON_IsNull (mlxd_cjson.cJSON_IsNull)
#define cJSON_GetArraySize (mlxd_cjson.cJSON_GetArraySize)
#define cJSON_GetArrayItem (mlxd_cjson.cJSON_GetArrayItem)
#endif

#endif

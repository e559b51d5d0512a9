/* Broken backend plugins, one per build (BAD_MODE), each alone in its own
 * directory as libmlxdist-mpi.so. The loader must refuse each with a message
 * naming the file and what is wrong:
 *   1  mlxdist_plugin_v1 returns a table claiming ABI version 99
 *   2  mlxdist_plugin_v2 returns a table whose struct_size is too small
 *   3  a valid v2 table whose instances have an ops table too small to hold
 *      the v1 ops (found when create runs)
 *   4  a valid v4 table whose instances name kinds in run_kinds but set no
 *      run op (found when create runs)
 * It includes only the frozen ABI headers, as a third-party plugin would. */
#include <string.h>

#include <mlx/c/plugin/plugin_v1.h>
#include <mlx/c/plugin/plugin_v2.h>
#include <mlx/c/plugin/plugin_v4.h>

#define EXPORT __attribute__((visibility("default")))

#if BAD_MODE == 1

static bool v1_available(char* why, size_t n) {
  if (why && n) why[0] = '\0';
  return true;
}
static bool v1_configured(bool with_bootstrap) { return !with_bootstrap; }
static int32_t v1_create(mlxdist_v1_bootstrap* bs, mlxdist_v1_backend** out,
                         mlxdist_v1_status* st) {
  (void)bs;
  *out = NULL;
  st->code = MLXDIST_V1_EUNAVAIL;
  return MLXDIST_V1_EUNAVAIL;
}
static const mlxdist_v1_plugin k_plugin = {
    .struct_size = sizeof(mlxdist_v1_plugin),
    .version = 99,
    .name = "mpi",
    .is_available = v1_available,
    .is_configured = v1_configured,
    .supports_bootstrap = false,
    .create = v1_create,
};
EXPORT const mlxdist_v1_plugin* mlxdist_plugin_v1(const mlxdist_v1_host* host);
const mlxdist_v1_plugin* mlxdist_plugin_v1(const mlxdist_v1_host* host) {
  (void)host;
  return &k_plugin;
}

#elif BAD_MODE == 4
static bool v4_available(char* why, size_t n) {
  if (why && n) why[0] = '\0';
  return true;
}
static bool v4_configured(bool with_bootstrap) { return !with_bootstrap; }
static int32_t v4_split(mlxdist_v4_backend* b, uint64_t seq, int32_t color, int32_t key,
                        mlxdist_v4_backend** out, mlxdist_v4_status* st) {
  (void)b, (void)seq, (void)color, (void)key, (void)st;
  *out = NULL;
  return MLXDIST_V4_EUNAVAIL;
}
static void v4_destroy(mlxdist_v4_backend* b) { (void)b; }
/* Every kind said to go through run, and no run. */
static const mlxdist_v4_ops k_norun_ops = {
    .struct_size = sizeof(mlxdist_v4_ops),
    .split = v4_split,
    .destroy = v4_destroy,
    .run_kinds = ~(uint64_t)0,
};
static mlxdist_v4_backend k_instance = {.ops = &k_norun_ops, .rank = 0, .size = 2};
static int32_t v4_create(mlxdist_v4_bootstrap* bs, mlxdist_v4_backend** out,
                         mlxdist_v4_status* st) {
  (void)bs, (void)st;
  *out = &k_instance;
  return MLXDIST_V4_OK;
}
static const mlxdist_v4_plugin k_plugin = {
    .struct_size = sizeof(mlxdist_v4_plugin),
    .version = MLXDIST_PLUGIN_V4_VERSION,
    .name = "mpi",
    .is_available = v4_available,
    .is_configured = v4_configured,
    .supports_bootstrap = false,
    .create = v4_create,
};
EXPORT const mlxdist_v4_plugin* mlxdist_plugin_v4(const mlxdist_v4_host* host);
const mlxdist_v4_plugin* mlxdist_plugin_v4(const mlxdist_v4_host* host) {
  (void)host;
  return &k_plugin;
}
#else /* BAD_MODE 2 and 3: ABI v2 */

static bool v2_available(char* why, size_t n) {
  if (why && n) why[0] = '\0';
  return true;
}
static bool v2_configured(bool with_bootstrap) { return !with_bootstrap; }

#if BAD_MODE == 3
/* An instance whose ops table ends before split and destroy. */
static const mlxdist_v2_ops k_short_ops = {
    .struct_size = (uint32_t)offsetof(mlxdist_v2_ops, split),
};
static mlxdist_v2_backend k_instance = {.ops = &k_short_ops, .rank = 0, .size = 2};
#endif

static int32_t v2_create(mlxdist_v2_bootstrap* bs, mlxdist_v2_backend** out,
                         mlxdist_v2_status* st) {
  (void)bs;
  (void)st;
#if BAD_MODE == 3
  *out = &k_instance;
  return MLXDIST_V2_OK;
#else
  *out = NULL;
  st->code = MLXDIST_V2_EUNAVAIL;
  return MLXDIST_V2_EUNAVAIL;
#endif
}

static const mlxdist_v2_plugin k_plugin = {
#if BAD_MODE == 2
    .struct_size = (uint32_t)offsetof(mlxdist_v2_plugin, name), /* a truncated table */
#else
    .struct_size = sizeof(mlxdist_v2_plugin),
#endif
    .version = MLXDIST_PLUGIN_V2_VERSION,
    .name = "mpi",
    .is_available = v2_available,
    .is_configured = v2_configured,
    .supports_bootstrap = false,
    .create = v2_create,
};
EXPORT const mlxdist_v2_plugin* mlxdist_plugin_v2(const mlxdist_v2_host* host);
const mlxdist_v2_plugin* mlxdist_plugin_v2(const mlxdist_v2_host* host) {
  (void)host;
  return &k_plugin;
}
#endif

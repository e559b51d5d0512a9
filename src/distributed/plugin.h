/* Private: the core side of backend plugins (the ABI itself is in
 * mlx/c/plugin/plugin_v<N>.h; docs/plugin-abi.md).
 *
 * plugin.c finds and dlopens libmlxdist-<name>.so; plugin_adapter.c reads
 * its table (mlxdist_plugin_v3, else _v2, else _v1), checks it and
 * adapts it to the core's backend interface (backend.h): the plugin's
 * status becomes an mlxd_status, its instances become mlxd_backends, and an
 * op its table is too short to hold is treated as absent. */
#ifndef MLXD_PLUGIN_H
#define MLXD_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>

#include "distributed/backend.h"
#include "util/text.h"

/* Load libmlxdist-<name>.so and return its kind, or NULL with why set
 * (every path tried and why it was skipped). The outcome is cached. */
const mlxd_backend_kind* mlxd_plugin_load(const char* name, char* why, size_t why_len);

/* plugin.c -> plugin_adapter.c: adapt the plugin opened as handle (found at
 * path, expected to be the backend `name`). Returns its kind, or NULL with
 * the reason appended to t (the caller then dlcloses handle). */
const mlxd_backend_kind* mlxd_plugin_adapt(void* handle, const char* path, const char* name,
                                           mlxd_text* t);

/* For an instance made by a plugin: "<describe text> (plugin <path>, ABI
 * v<N>)", or "(plugin <path>, ABI v1: no describe op)" when the plugin's ops
 * table has no describe. False (buf untouched) for any other backend. */
bool mlxd_plugin_describe(const mlxd_backend* b, char* buf, size_t len);

#endif

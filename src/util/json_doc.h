/* Private: one JSON document from a file the user wrote (the ring's hostfile,
 * net/hostfile.c; jaccl's device matrix, backends/jaccl/jaccl_config.c),
 * read so that every fault is named with its place, before and after cJSON:
 * the bytes JSON forbids (util/json_bytes.h), an escaped NUL, an empty file, a
 * syntax error, and anything after the value. What the document must hold is
 * the caller's to check. */
#ifndef MLXD_JSON_DOC_H
#define MLXD_JSON_DOC_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "util/status.h"

/* An upper bound of the JSON values in text[0, len): one, plus one per '[',
 * '{' and ',' outside strings (a container holds at most one more value than
 * it has commas). It bounds the nodes, so the memory, cJSON would build: a
 * caller refuses a file above its own bound before parsing. Pure. */
size_t mlxd_json_value_bound(const char* text, size_t len);

/* "a list", "an empty list", "an object", "a string", "a number", "a
 * boolean", "null": what v is, for messages. */
const char* mlxd_json_kind(const cJSON* v);

/* The one JSON document text[0, len) holds, or NULL with st filled (code
 * MLXD_EINVAL, layer bootstrap) as "<what> '<name>' ..." naming the first
 * fault and its line and column:
 *   - a byte JSON forbids where it stands (mlxd_json_bad_byte);
 *   - an escaped NUL ("\u0000") in a string: cJSON would end the string
 *     there and cut the value short unseen, and no value mlxdist reads holds
 *     one;
 *   - nothing but whitespace ("is empty (expected <expected>)");
 *   - a syntax error, saying whether the file ends inside a string or with
 *     brackets open (a file cut short);
 *   - anything but whitespace after the value.
 * what: "hostfile", "device matrix"; expected: the format in words. The
 * caller owns the result (cJSON_Delete). */
cJSON* mlxd_json_parse_doc(const char* text, size_t len, const char* what, const char* name,
                           const char* expected, mlxd_status* st);

#endif

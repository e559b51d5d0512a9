/* Private: the MLXDIST_* names in the environment that mlxdist does not know
 * (a typo such as MLXDIST_TIMEUOT would otherwise be ignored in silence).
 *
 * Known names: every tunable (tunables.h, the one table) and the few the
 * project's own scripts, examples and tests read (the list in env_names.c;
 * MLXDIST_TEST_* is the test suite's). An unknown name is told with the
 * closest known one (edit distance) or "no close name". Init
 * (src/distributed/group.c) calls mlxd_env_names_check() after
 * mlxd_tunables_check(); mlxdist-launch checks its own environment and its
 * --env / hostfile "envs" names once, and passes the names it reported in
 * MLXDIST_ENV_REPORTED so that its ranks do not repeat them. */
#ifndef MLXD_ENV_NAMES_H
#define MLXD_ENV_NAMES_H

#include <stdbool.h>
#include <stddef.h>

#include "util/status.h"
#include "util/text.h"

/* Whether the len bytes at name are a variable mlxdist knows. */
bool mlxd_env_name_known(const char* name, size_t len);

/* The known tunable nearest to the len bytes at name (Damerau-Levenshtein
 * distance, letters compared without case), or NULL when none is within
 * max(2, n/4) edits, n the length of the part after "MLXDIST_"; a name that
 * is the start of a known one (4 letters or more after the prefix) counts
 * as at that limit. */
const char* mlxd_env_name_closest(const char* name, size_t len);

/* The unknown MLXDIST_* names among the entries "NAME=value" of env (n of
 * them, or up to a NULL entry when n < 0); entries without '=' and other
 * prefixes are skipped. With skip_reported, a name listed in
 * MLXDIST_ENV_REPORTED (':'-separated) is not counted, nor is one already in
 * names. For each unknown name adds to lines (may be NULL) "NAME is not a
 * variable mlxdist knows (did you mean X?)" or "... (no close name)" (NAME's
 * bytes other than letters, digits and '_' as \xNN, cut after 100), after
 * sep when lines is not empty, and to names (may be NULL) the name as it is,
 * ':'-separated (so several lists can be added up). Returns their number. */
int mlxd_env_names_unknown(const char* const* env, int n, bool skip_reported, mlxd_text* lines,
                           const char* sep, mlxd_text* names);

/* Init's check of this process's environment: none unknown: 0. Under
 * MLXDIST_STRICT_ENV=1, fails st (MLXD_EINVAL, plain) naming every unknown
 * name (MLXDIST_ENV_REPORTED does not excuse one). Otherwise writes one line
 * per unknown name not in MLXDIST_ENV_REPORTED to stderr, "mlxdist: warning:
 * <line>; it is ignored", the first time it is called in this process only
 * (later inits and splits print nothing), and returns 0. Thread-safe. */
int mlxd_env_names_check(mlxd_status* st);

#endif

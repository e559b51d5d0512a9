/* mlxdist-launch: a rank on another host, started with one ssh per rank (so
 * that each rank has its own exit status and output pipes, relayed and
 * prefixed like a local rank's, and one rank can be stopped alone; several
 * ranks on one host can share one connection with the user's ssh options,
 * e.g. ControlMaster). Pure: builds strings only.
 *
 * ssh runs "sh -c '<script>'" on the host; the script (POSIX sh, one line):
 *   - keeps its stdin (the ssh channel) as fd 3 and reads the job token (and
 *     with --secret the secret, written into a 0600 file in a private
 *     directory, removed at exit) from it: neither is ever on a command line;
 *     for jaccl also the device matrix, written beside it (MLX_IBV_DEVICES);
 *   - says on stderr that it started (LAUNCH_STARTED_LINE, which the launcher
 *     consumes: it tells an exit status 255 of the program from ssh's own);
 *   - cds to --cwd, exports MLX_RANK, MLX_WORLD_SIZE, MLXDIST_JOB_TOKEN,
 *     MLXDIST_RENDEZVOUS, MLXDIST_RING_ADDR / MLXDIST_IFNAME,
 *     MLXDIST_PORT_RANGE, the hostfile's and --env's K=V (MLX_HOSTFILE unset);
 *   - starts the program with stdin from /dev/null, in its own session when
 *     setsid(1) is there (so that a stop reaches what it started);
 *   - a watcher waits for the end of fd 3 (the launcher closed it, or ssh or
 *     the link died) and then sends SIGTERM, and SIGKILL after the grace;
 *   - exits with the program's status (sh's 128+signal for a signal).
 * Every word that comes from the user is single-quoted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

/* ---- a growing string ---- */

typedef struct sbuf {
  char* p;
  size_t len;
  bool oom;
} sbuf;

static void put(sbuf* b, const char* s) {
  if (b->oom) return;
  size_t n = strlen(s);
  char* np = realloc(b->p, b->len + n + 1);
  if (!np) {
    b->oom = true;
    return;
  }
  b->p = np;
  memcpy(b->p + b->len, s, n + 1);
  b->len += n;
}

int launch_sh_quote(char** buf, size_t* len, const char* s) {
  sbuf b = {*buf, *len, false};
  if (!b.p) put(&b, "");
  put(&b, "'");
  for (const char* c = s; *c && !b.oom; c++) {
    char one[2] = {*c, '\0'};
    put(&b, *c == '\'' ? "'\\''" : one);
  }
  put(&b, "'");
  *buf = b.p;
  *len = b.len;
  return b.oom ? -1 : 0;
}

static void putq(sbuf* b, const char* s) {
  if (b->oom) return;
  if (launch_sh_quote(&b->p, &b->len, s) != 0) b->oom = true;
}

/* "export NAME='value'; " */
static void put_export(sbuf* b, const char* name, const char* value) {
  put(b, "export ");
  put(b, name);
  put(b, "=");
  putq(b, value);
  put(b, "; ");
}

static void put_kv(sbuf* b, const char* kv) {
  const char* eq = strchr(kv, '=');
  if (!eq) return;
  char name[256];
  size_t n = (size_t)(eq - kv);
  if (n >= sizeof name) return;
  memcpy(name, kv, n);
  name[n] = '\0';
  put_export(b, name, eq + 1);
}

char* launch_remote_script(const launch_remote* r) {
  sbuf b = {0};
  char num[64], msg[600];
  /* fd 3: the ssh channel; the script's own stdin is /dev/null from here on */
  put(&b, "exec 3<&0 </dev/null; umask 077; ");
  snprintf(msg, sizeof msg, "[launch] rank %d on host %.200s: ", r->rank, r->host);
  put(&b, "m=");
  putq(&b, msg);
  put(&b, "; IFS= read -r t <&3 || { echo \"${m}no job token on stdin\" >&2; exit 125; }; ");
  put(&b, "printf '\\001mlxdist-launch: remote rank started\\n' >&2; d=; ");
  if (r->secret || r->matrix) {
    if (r->secret)
      put(&b, "IFS= read -r s <&3 || { echo \"${m}no secret on stdin\" >&2; exit 125; }; ");
    if (r->matrix)
      put(&b, "IFS= read -r x <&3 || { echo \"${m}no device matrix on stdin\" >&2; exit 125; }; ");
    put(&b, r->secret ? "d=$(mktemp -d \"${TMPDIR:-/tmp}/mlxdist-secret.XXXXXX\") || exit 125; "
                      : "d=$(mktemp -d \"${TMPDIR:-/tmp}/mlxdist-jaccl.XXXXXX\") || exit 125; ");
    put(&b, "trap 'rm -rf \"$d\"' EXIT; ");
  }
  if (r->secret)
    put(&b,
        "printf '%s\\n' \"$s\" >\"$d/secret\" || exit 125; s=; "
        "export MLXDIST_SECRET_FILE=\"$d/secret\"; ");
  if (r->matrix)
    put(&b,
        "printf '%s\\n' \"$x\" >\"$d/devices.json\" || exit 125; x=; "
        "export MLX_IBV_DEVICES=\"$d/devices.json\"; "
        "unset JACCL_RANK JACCL_IBV_DEVICES JACCL_COORDINATOR JACCL_RING MLX_JACCL_RING; ");
  put(&b, "cd ");
  putq(&b, r->cwd);
  put(&b, " || { echo \"${m}cannot cd to \"");
  putq(&b, r->cwd);
  put(&b, " >&2; exit 126; }; unset MLX_HOSTFILE; export MLXDIST_JOB_TOKEN=\"$t\"; t=; ");
  snprintf(num, sizeof num, "%d", r->rank);
  put_export(&b, "MLX_RANK", num);
  snprintf(num, sizeof num, "%d", r->world);
  put_export(&b, "MLX_WORLD_SIZE", num);
  if (r->rendezvous) put_export(&b, "MLXDIST_RENDEZVOUS", r->rendezvous);
  if (r->jaccl_coord) put_export(&b, "MLX_JACCL_COORDINATOR", r->jaccl_coord);
  if (r->jaccl_ring) put_export(&b, "MLX_JACCL_RING", "1");
  if (r->ring_addr && *r->ring_addr) put_export(&b, "MLXDIST_RING_ADDR", r->ring_addr);
  if (r->ifname && *r->ifname) put_export(&b, "MLXDIST_IFNAME", r->ifname);
  if (r->port_range && *r->port_range) put_export(&b, "MLXDIST_PORT_RANGE", r->port_range);
  if (r->verbose) put_export(&b, "MLX_RING_VERBOSE", "1");
  for (int i = 0; i < r->n_envs; i++) put_kv(&b, r->envs[i]);
  /* the program, in its own session where setsid(1) exists */
  sbuf prog = {0};
  for (int i = 0; r->program[i]; i++) {
    if (i) put(&prog, " ");
    putq(&prog, r->program[i]);
  }
  if (prog.oom) b.oom = true;
  put(&b, "if command -v setsid >/dev/null 2>&1; then setsid ");
  put(&b, prog.p ? prog.p : "");
  put(&b, " </dev/null & else ");
  put(&b, prog.p ? prog.p : "");
  put(&b, " </dev/null & fi; p=$!; ");
  free(prog.p);
  /* the watcher: the end of the channel stops the program (its group first) */
  snprintf(num, sizeof num, "%.0f", r->grace > 0 ? r->grace : 1);
  /* The grace is slept a second at a time, while the program lives, so that
   * no sleep outlives the job by more than a second. */
  put(&b,
      "{ cat >/dev/null; kill -TERM -\"$p\" || kill -TERM \"$p\"; n=0; "
      "while [ \"$n\" -lt ");
  put(&b, num);
  put(&b,
      " ] && kill -0 \"$p\"; do sleep 1; n=$((n+1)); done; "
      "kill -KILL -\"$p\" || kill -KILL \"$p\"; } <&3 >/dev/null 2>&1 & w=$!; exec 3<&-; "
      "wait \"$p\"; st=$?; kill \"$w\" 2>/dev/null; exit \"$st\"");
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  return b.p;
}

char** launch_split_words(const char* cmd, char* why, size_t why_len) {
  size_t cap = strlen(cmd) / 2 + 2;
  char** av = calloc(cap, sizeof *av);
  char* w = malloc(strlen(cmd) + 1);
  if (!av || !w) {
    free(av);
    free(w);
    snprintf(why, why_len, "out of memory");
    return NULL;
  }
  size_t n = 0;
  const char* c = cmd;
  for (;;) {
    while (*c == ' ' || *c == '\t' || *c == '\n') c++;
    if (!*c) break;
    size_t k = 0;
    char q = 0;
    for (; *c && (q || (*c != ' ' && *c != '\t' && *c != '\n')); c++) {
      if (q == '\'' && *c == '\'') {
        q = 0;
      } else if (q == '"' && *c == '"') {
        q = 0;
      } else if (!q && (*c == '\'' || *c == '"')) {
        q = *c;
      } else if (q != '\'' && *c == '\\' && c[1]) {
        w[k++] = *++c;
      } else {
        w[k++] = *c;
      }
    }
    if (q) {
      snprintf(why, why_len, "--ssh '%.200s' has an unclosed %s quote", cmd,
               q == '\'' ? "single" : "double");
      free(w);
      launch_argv_free(av);
      return NULL;
    }
    w[k] = '\0';
    if (!(av[n++] = strdup(w))) {
      free(w);
      launch_argv_free(av);
      snprintf(why, why_len, "out of memory");
      return NULL;
    }
  }
  free(w);
  if (n == 0) {
    launch_argv_free(av);
    snprintf(why, why_len, "--ssh needs a command, got '%.200s'", cmd);
    return NULL;
  }
  return av;
}

char** launch_ssh_argv(char* const* ssh_words, double connect_timeout, const char* host,
                       const char* script) {
  int nw = 0;
  while (ssh_words[nw]) nw++;
  char** av = calloc((size_t)nw + 16, sizeof *av);
  if (!av) return NULL;
  int k = 0;
  bool ok = true;
  for (int i = 0; i < nw && ok; i++) ok = (av[k++] = strdup(ssh_words[i])) != NULL;
  char opt[3][64];
  int ct = connect_timeout >= 1 ? (int)(connect_timeout + 0.5) : 1;
  snprintf(opt[0], sizeof opt[0], "ConnectTimeout=%d", ct);
  snprintf(opt[1], sizeof opt[1], "ServerAliveInterval=%d", LAUNCH_ALIVE_INTERVAL_S);
  snprintf(opt[2], sizeof opt[2], "ServerAliveCountMax=%d", LAUNCH_ALIVE_COUNT);
  const char* fixed[] = {"-T",   "-o", "BatchMode=yes", "-o", opt[0], "-o",
                         opt[1], "-o", opt[2],          host};
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed && ok; i++)
    ok = (av[k++] = strdup(fixed[i])) != NULL;
  char* cmd = NULL;
  size_t len = 0;
  if (ok) {
    cmd = strdup("sh -c ");
    len = cmd ? strlen(cmd) : 0;
    ok = cmd && launch_sh_quote(&cmd, &len, script) == 0;
  }
  if (ok)
    av[k++] = cmd;
  else
    free(cmd);
  if (!ok) {
    launch_argv_free(av);
    return NULL;
  }
  return av;
}

void launch_argv_free(char** av) {
  if (!av) return;
  for (int i = 0; av[i]; i++) free(av[i]);
  free(av);
}

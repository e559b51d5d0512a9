/* mlxdist-launch: start N ranks of a program on this host.
 *
 * ring (default): take the user's hostfile or reserve N*K free TCP ports on
 * 127.0.0.1 and write MLX's hostfile (JSON, one list of "ip:port" strings per
 * rank) into a private temp dir, and fork/exec the ranks with MLX_RANK,
 * MLX_HOSTFILE and MLX_WORLD_SIZE set. Each output line of rank r is prefixed
 * with "[r] ". The first rank to fail stops the others (SIGTERM, SIGKILL after
 * a grace period) and gives the exit status.
 *
 * mpi: run `mpirun -np N ...` (OpenMPI or MPICH flags) under the same
 * supervision (timeout, signal forwarding, exit status).
 *
 * Every ring job gets MLXDIST_JOB_TOKEN, 16 random bytes in hex, so that its
 * ranks refuse connections of any other job (two jobs given the same hostfile
 * by mistake never exchange data). --secret writes 32 random bytes (hex) into
 * a file of mode 0600 in a private 0700 directory, removed at exit, and hands
 * its PATH to the ranks in MLXDIST_SECRET_FILE: the secret is never on a
 * command line, in the environment or in ps. docs/security.md.
 *
 * Across hosts (--hosts, or a hostfile of hosts: hosts.c), a job with a host
 * other than this one runs over the launcher's rendezvous (across.c); a job
 * whose hosts are all localhost keeps the path above (a written hostfile).
 *
 * The parts are listed in launch.h. The launcher links the static library for
 * the ring's hostfile parser and clock only: it needs no libmlxdist.so. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "launch.h"
#include "net/net.h"
#include "security/secret.h"
#include "util/env_names.h"
#include "util/text.h"
#include "util/tunables.h"

#define TOKEN_BYTES 16
#define SECRET_BYTES 32

static void to_hex(const unsigned char* b, size_t n, char* out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
  out[2 * n] = '\0';
}

/* "MLXDIST_JOB_TOKEN=<32 hex digits>" from the CSPRNG; 0 or -1 after a message. */
static int make_token(char* kv, size_t n) {
  unsigned char t[TOKEN_BYTES];
  char hex[2 * TOKEN_BYTES + 1];
  mlxd_status st = {0};
  if (mlxd_random_bytes(t, sizeof t, &st) != 0) {
    launch_msg("cannot generate the job token: %s", st.msg);
    return -1;
  }
  to_hex(t, sizeof t, hex);
  snprintf(kv, n, "MLXDIST_JOB_TOKEN=%s", hex);
  return 0;
}

/* --secret: a private directory and a 0600 file with a fresh secret. */
typedef struct job_secret {
  char dir[PATH_MAX - 16];
  char path[PATH_MAX];
  char kv[PATH_MAX + 32]; /* "MLXDIST_SECRET_FILE=<path>" */
} job_secret;

static void secret_remove(job_secret* s) {
  if (s->path[0]) unlink(s->path);
  if (s->dir[0]) rmdir(s->dir);
  s->path[0] = s->dir[0] = '\0';
}

static int secret_make(job_secret* s) {
  memset(s, 0, sizeof *s);
  const char* tmp = getenv("TMPDIR");
  if (!tmp || !*tmp) tmp = "/tmp";
  snprintf(s->dir, sizeof s->dir, "%s/mlxdist-secret-XXXXXX", tmp);
  if (!mkdtemp(s->dir)) { /* mkdtemp makes it 0700 */
    launch_msg("--secret: cannot create a private directory in %s: %s.", tmp, strerror(errno));
    s->dir[0] = '\0';
    return -1;
  }
  snprintf(s->path, sizeof s->path, "%s/secret", s->dir);
  unsigned char b[SECRET_BYTES];
  char hex[2 * SECRET_BYTES + 2];
  mlxd_status st = {0};
  int fd = open(s->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    launch_msg("--secret: cannot create %s: %s.", s->path, strerror(errno));
    s->path[0] = '\0';
    secret_remove(s);
    return -1;
  }
  int ok = mlxd_random_bytes(b, sizeof b, &st) == 0;
  if (ok) {
    to_hex(b, sizeof b, hex);
    strcat(hex, "\n");
    ok = write(fd, hex, strlen(hex)) == (ssize_t)strlen(hex);
  }
  memset(b, 0, sizeof b);
  memset(hex, 0, sizeof hex);
  if (close(fd) != 0) ok = 0;
  if (!ok) {
    launch_msg("--secret: cannot write the secret file %s.", s->path);
    secret_remove(s);
    return -1;
  }
  snprintf(s->kv, sizeof s->kv, "MLXDIST_SECRET_FILE=%s", s->path);
  return 0;
}

/* "MLXDIST_SHM_SESSION=mlxdist-<pid>-<16 hex digits>": where the ranks of a job on this host
 * meet (the ring's first exchange goes through it, not over TCP: docs/ring.md), unless the
 * ranks will run with MLXDIST_TRANSPORT=tcp (the last --env wins over this environment).
 * 1: none wanted; 0; -1 after a message. */
static int make_session(const launch_opts* o, char* kv, size_t n) {
  const char* mode = getenv("MLXDIST_TRANSPORT");
  for (int i = 0; i < o->n_envs; i++)
    if (strncmp(o->envs[i], "MLXDIST_TRANSPORT=", 18) == 0) mode = o->envs[i] + 18;
  if (mode && strcasecmp(mode, "tcp") == 0) return 1;
  unsigned char b[8];
  char hex[2 * sizeof b + 1];
  mlxd_status st = {0};
  if (mlxd_random_bytes(b, sizeof b, &st) != 0) {
    launch_msg("cannot name the job's shared-memory session: %s", st.msg);
    return -1;
  }
  to_hex(b, sizeof b, hex);
  snprintf(kv, n, "MLXDIST_SHM_SESSION=mlxdist-%ld-%s", (long)getpid(), hex);
  return 0;
}

static int run_mpi(const launch_opts* o, const launch_hosts* hs, int sfd) {
  int status = 1;
  char** av = launch_mpi_argv(o, hs, &status);
  if (!av) return status;
  if (o->verbose) {
    fputs("[launch] running:", stderr);
    for (int i = 0; av[i]; i++) fprintf(stderr, " %s", av[i]);
    fputc('\n', stderr);
  }
  launch_spawn sp = {.argv = av};
  int rc = launch_one(&sp, sfd, o->timeout);
  launch_mpi_argv_free(av);
  return rc;
}

static int run_ring(const launch_opts* o, int sfd) {
  launch_hostfile hf;
  if (launch_hostfile_prepare(o, &hf) != 0) return 1;
  if (o->verbose) {
    launch_msg("starting %d rank%s of '%s' with MLX_HOSTFILE=%s", hf.n, hf.n == 1 ? "" : "s",
               o->program[0], hf.path);
    fprintf(stderr, "%s\n", hf.json);
  }
  /* Every rank's environment besides MLX_RANK: the ring's variables first,
   * then --env (which may override them). */
  char* hostfile_kv = malloc(strlen(hf.path) + sizeof "MLX_HOSTFILE=");
  const char** env = calloc((size_t)(6 + o->n_envs), sizeof *env);
  char world_kv[32];
  char token_kv[64];
  char session_kv[96];
  int session = 1;
  job_secret secret = {0};
  int rc = 1;
  if (!hostfile_kv || !env) {
    launch_msg("out of memory");
  } else if (make_token(token_kv, sizeof token_kv) != 0 ||
             (o->secret && secret_make(&secret) != 0) ||
             (hf.n > 1 && (session = make_session(o, session_kv, sizeof session_kv)) < 0)) {
    /* said why */
  } else {
    sprintf(hostfile_kv, "MLX_HOSTFILE=%s", hf.path);
    snprintf(world_kv, sizeof world_kv, "MLX_WORLD_SIZE=%d", hf.n);
    int e = 0;
    env[e++] = hostfile_kv;
    env[e++] = world_kv;
    env[e++] = token_kv;
    /* an empty value, not this environment's: a session of an outer job is never inherited */
    env[e++] = session == 0 ? session_kv : "MLXDIST_SHM_SESSION=";
    if (o->secret) env[e++] = secret.kv;
    if (o->verbose) env[e++] = "MLX_RING_VERBOSE=1";
    for (int i = 0; i < o->n_envs; i++) env[e++] = o->envs[i];
    launch_spawn sp = {.argv = o->program, .set_env = env, .n_env = e};
    launch_hostfile_release_ports(&hf); /* just before the ranks start, so they can bind them */
    rc = launch_ranks(&sp, hf.n, sfd, o->timeout);
  }
  secret_remove(&secret);
  free(env);
  free(hostfile_kv);
  launch_hostfile_free(&hf);
  return rc;
}

/* --backend jaccl|jaccl-ring on this host (hs: a hostfile of local hosts with
 * "rdma" lists; NULL: --ibv-devices or MLX_IBV_DEVICES): MLX's variables,
 * the coordinator on a port bound here until the ranks start (jaccl.c). */
static int run_jaccl_local(const launch_opts* o, const launch_hosts* hs, int sfd) {
  launch_jaccl j;
  int rc = launch_jaccl_local(o, hs, &j);
  if (rc != 0) return rc;
  const char** env = calloc((size_t)(8 + o->n_envs), sizeof *env);
  char world_kv[32], token_kv[64];
  job_secret secret = {0};
  rc = 1;
  if (!env) {
    launch_msg("out of memory");
  } else if (make_token(token_kv, sizeof token_kv) != 0 ||
             (o->secret && secret_make(&secret) != 0)) {
    /* said why */
  } else {
    int e = 0;
    snprintf(world_kv, sizeof world_kv, "MLX_WORLD_SIZE=%d", j.n);
    env[e++] = world_kv;
    env[e++] = token_kv;
    if (o->secret) env[e++] = secret.kv;
    for (int i = 0; i < j.n_kv; i++) env[e++] = j.kv[i];
    for (int i = 0; i < o->n_envs; i++) env[e++] = o->envs[i];
    if (o->verbose) {
      launch_msg("starting %d rank%s of '%s' with jaccl%s on this host:", j.n, j.n == 1 ? "" : "s",
                 o->program[0], o->jaccl_ring ? "-ring" : "");
      for (int i = 0; i < j.n_kv; i++) launch_msg("  %s", j.kv[i]);
    }
    launch_spawn sp = {.argv = o->program, .set_env = env, .n_env = e};
    launch_jaccl_release(&j); /* just before the ranks start: rank 0 binds the port */
    rc = launch_ranks(&sp, j.n, sfd, o->timeout);
  }
  secret_remove(&secret);
  free(env);
  launch_jaccl_free(&j);
  return rc;
}

/* The hosts of --hosts or of a hostfile of hosts into hs; false for a job on
 * this host (no --hosts, or a hostfile in the ring's own format). Exits 2 on
 * a bad list or file. */
static bool read_hosts(const launch_opts* o, launch_hosts* hs) {
  char why[MLXD_MSG_MAX + 256];
  if (o->hosts) {
    if (launch_hosts_from_list(o->hosts, o->n, hs, why, sizeof why) != 0)
      launch_bad_usage("%s.", why);
    return true;
  }
  if (!o->hostfile) return false;
  mlxd_status st = {0};
  char* text = NULL;
  size_t len = 0;
  if (mlxd_net_hostfile_read(o->hostfile, &text, &len, &st) != 0) {
    mlxd_status_render(&st, NULL);
    launch_bad_usage("%s.", st.msg);
  }
  int rc = launch_hosts_from_file(text, len, o->hostfile, o->n, hs, why, sizeof why);
  if (rc == 1 && o->mpi) { /* a bad file's own problem first */
    mlxd_net_hosts h;
    if (launch_hostfile_check(text, len, o->hostfile, o->n, o->connections, &h, why, sizeof why))
      rc = -1;
    else
      mlxd_net_hosts_free(&h);
  }
  free(text);
  if (rc < 0) launch_bad_usage("%s.", why);
  if (rc == 1 && o->mpi)
    launch_bad_usage(
        "--hostfile of ranks (lists of \"ip:port\") applies to the ring backend only (give a "
        "hostfile of hosts, or --hosts, for mpirun).");
  if (rc == 1 && o->jaccl)
    launch_bad_usage(
        "jaccl: --hostfile '%s' is not a hostfile of hosts (a list of lists is the ring's "
        "hostfile, or a device matrix: give that with --ibv-devices); jaccl takes MLX's hosts "
        "with \"rdma\" lists, e.g. [{\"ssh\": \"h1\", \"ips\": [\"10.0.0.1\"], \"rdma\": "
        "[null, \"mlx5_0\"]}, ...] (docs/launch.md).",
        o->hostfile);
  return rc == 0;
}

/* lo->envs becomes a new list (the caller frees it; the strings stay
 * borrowed): the hostfile's "envs" first, then --env's, which so win. */
static int with_hostfile_envs(launch_opts* lo, const launch_hosts* hs) {
  const int n_opt = lo->n_envs;
  const char** opt = lo->envs;
  lo->envs = calloc((size_t)(hs->n_envs + n_opt + 1), sizeof *lo->envs);
  if (!lo->envs) {
    launch_msg("out of memory");
    return -1;
  }
  lo->n_envs = 0;
  for (int i = 0; i < hs->n_envs; i++) lo->envs[lo->n_envs++] = hs->envs[i];
  for (int i = 0; i < n_opt; i++) lo->envs[lo->n_envs++] = opt[i];
  return 0;
}

/* A job whose hosts are all this one: today's path with N = the ranks, the
 * hostfile's variables before --env's. */
static int run_local_hosts(const launch_opts* o, const launch_hosts* hs, int sfd) {
  launch_opts lo = *o;
  lo.hosts = lo.hostfile = NULL;
  lo.n = hs->ranks;
  if (with_hostfile_envs(&lo, hs) != 0) return 1;
  int rc = lo.mpi ? run_mpi(&lo, NULL, sfd) : run_ring(&lo, sfd);
  free(lo.envs);
  return rc;
}

static int run_hosts(const launch_opts* o, const launch_hosts* hs, int sfd) {
  if (o->jaccl && launch_hosts_all_local(hs)) {
    launch_opts lo = *o;
    if (with_hostfile_envs(&lo, hs) != 0) return 1;
    int rc = run_jaccl_local(&lo, hs, sfd);
    free(lo.envs);
    return rc;
  }
  if (launch_hosts_all_local(hs)) return run_local_hosts(o, hs, sfd);
  if (o->mpi) return run_mpi(o, hs, sfd);
  char token_kv[64];
  job_secret secret = {0};
  int rc = 1;
  if (make_token(token_kv, sizeof token_kv) == 0 && (!o->secret || secret_make(&secret) == 0))
    rc = launch_run_hosts(o, hs, sfd, strchr(token_kv, '=') + 1, o->secret ? secret.path : NULL);
  secret_remove(&secret);
  memset(token_kv, 0, sizeof token_kv);
  return rc;
}

extern char** environ;

/* The MLXDIST_* names mlxdist does not know, in this environment and in the
 * ranks' own variables (--env, the hostfile's "envs"), told once here rather
 * than once per rank: under MLXDIST_STRICT_ENV=1 (here or in --env) the job
 * does not start (exit 2); otherwise one warning line each, and
 * MLXDIST_ENV_REPORTED=<the names> goes to every rank (local, remote, mpirun)
 * so that they do not repeat them. */
static void check_env_names(launch_opts* o, const launch_hosts* hs) {
  char lines[4096], names[4096];
  mlxd_text l = {lines, sizeof lines, 0}, nm = {names, sizeof names, 0};
  lines[0] = names[0] = '\0';
  const char* sep = "\n";
  int k = mlxd_env_names_unknown((const char* const*)environ, -1, false, &l, sep, &nm);
  k += mlxd_env_names_unknown(o->envs, o->n_envs, false, &l, sep, &nm);
  k += mlxd_env_names_unknown((const char* const*)hs->envs, hs->n_envs, false, &l, sep, &nm);
  if (k == 0) return;
  /* strict as the ranks will be: here, then the hostfile's "envs", then --env (the last wins) */
  bool strict = mlxd_tunable_long(MLXD_T_STRICT_ENV) == 1;
  const char* const* lists[2] = {(const char* const*)hs->envs, o->envs};
  int counts[2] = {hs->n_envs, o->n_envs};
  const char key[] = "MLXDIST_STRICT_ENV=";
  for (int l = 0; l < 2; l++)
    for (int i = 0; i < counts[l]; i++) {
      const char* v = lists[l][i] + sizeof key - 1;
      double x = 0; /* empty: the default, 0 */
      if (strncmp(lists[l][i], key, sizeof key - 1) == 0 &&
          (!*v || mlxd_tunable_parse(MLXD_T_STRICT_ENV, v, &x, NULL, 0) == 0))
        strict = x == 1;
    }
  if (strict)
    launch_bad_usage(
        "%s; MLXDIST_STRICT_ENV=1 makes an unknown MLXDIST_* name an error (fix or "
        "unset the variable%s).",
        lines, k > 1 ? "s" : "");
  for (char *p = lines, *nl; p && *p; p = nl ? nl + 1 : NULL) {
    nl = strchr(p, '\n');
    if (nl) *nl = '\0';
    launch_msg("warning: %s; it is ignored (told here once, not by every rank).", p);
  }
  /* only names the ranks' check accepts as MLXDIST_ENV_REPORTED's value: else they warn too */
  if (strspn(names, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_:") !=
          strlen(names) ||
      nm.used + 1 >= sizeof names)
    return;
  static char kv[sizeof names + 32];
  snprintf(kv, sizeof kv, "MLXDIST_ENV_REPORTED=%s", names);
  const char** envs = realloc(o->envs, (size_t)(o->n_envs + 1) * sizeof *envs);
  if (!envs) return;
  o->envs = envs;
  o->envs[o->n_envs++] = kv;
}

int main(int argc, char** argv) {
  launch_opts o;
  launch_parse_args(argc, argv, &o); /* exits 2 on bad arguments */
  launch_hosts hs = {0};
  bool across = read_hosts(&o, &hs); /* exits 2 on a bad list or file */
  if (across && hs.backend >= 0 && !o.backend_given) {
    o.mpi = hs.backend == 1;
    o.jaccl = hs.backend >= 2;
    o.jaccl_ring = hs.backend == 3;
  }
  if (across && o.jaccl && o.ibv_devices)
    launch_bad_usage(
        "--ibv-devices applies to a job on this host; across hosts the matrix is "
        "the hostfile's \"rdma\" lists.");
  if (across && o.jaccl && launch_jaccl_check_hosts(&o, &hs) != 0) {
    fputs("Run 'mlxdist-launch --help' for usage.\n", stderr); /* as launch_bad_usage */
    launch_hosts_free(&hs);
    launch_free_args(&o);
    return 2;
  }
  if (across && o.mpi && o.secret) launch_bad_usage("--secret applies to the ring backend only.");
  if (across && o.connections)
    launch_bad_usage("--connections applies to a job on this host only (a hostfile of ranks).");
  check_env_names(&o, &hs);
  /* before any port is reserved or pipe made; launch_ranks checks again with the job's size */
  int ranks = across ? hs.ranks : o.n;
  int conns = across ? 0 : o.connections ? o.connections : 1;
  if (launch_nofile(ranks, conns) != 0 || (!across && !o.mpi && launch_procs(ranks) != 0)) {
    launch_hosts_free(&hs);
    launch_free_args(&o);
    return 1;
  }
  int sfd = launch_block_signals();
  if (sfd < 0) {
    launch_msg("cannot set up signal handling: %s.", strerror(errno));
    return 1;
  }
  int rc = across    ? run_hosts(&o, &hs, sfd)
           : o.jaccl ? run_jaccl_local(&o, NULL, sfd)
           : o.mpi   ? run_mpi(&o, NULL, sfd)
                     : run_ring(&o, sfd);
  close(sfd);
  launch_hosts_free(&hs);
  launch_free_args(&o);
  return rc;
}

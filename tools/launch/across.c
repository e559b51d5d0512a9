/* mlxdist-launch: a job across hosts.
 *
 * Every rank learns its peers from the launcher's rendezvous (rendezvous.c,
 * contract C1 in the plan; src/net/rendezvous.c, docs/ring.md): the
 * launcher listens on its own address that routes to the hosts (never
 * 0.0.0.0), hands MLXDIST_RENDEZVOUS to every rank, and the ranks bind their
 * listening ports themselves (port 0, or --port-range), on their host's
 * address (MLXDIST_RING_ADDR: the hostfile's first "ips" entry, else the
 * host's name resolved here) or on --ifname's address (MLXDIST_IFNAME). So no
 * port is guessed and none collides with another job.
 *
 * Ranks on localhost/127.0.0.1/::1 are forked here (remote.c's script is not
 * needed); the others are started with one ssh each (remote.c). The token
 * and the secret reach a remote rank on ssh's stdin only. Supervision is
 * supervise.c's: the end of a rank's stdin pipe stops it on its host. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "launch.h"

/* The host part of an ssh destination "user@host" (brackets of "[v6]" dropped). */
static void host_part(const char* name, char* out, size_t n) {
  const char* at = strrchr(name, '@');
  const char* h = at ? at + 1 : name;
  size_t len = strlen(h);
  if (len >= 2 && h[0] == '[' && h[len - 1] == ']') {
    h++;
    len -= 2;
  }
  snprintf(out, n, "%.*s", (int)len, h);
}

/* name's first address (IPv4 preferred) as text; -1 (after a message unless quiet). */
static int resolve(const char* name, char* ip, size_t n, bool quiet) {
  char h[256];
  host_part(name, h, sizeof h);
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
  int e = getaddrinfo(h, NULL, &hints, &res);
  if (e != 0) {
    if (!quiet)
      launch_msg(
          "cannot resolve host '%s' here: %s; give its address in the hostfile (\"ips\") or "
          "choose the interface with --ifname.",
          h, gai_strerror(e));
    return -1;
  }
  const struct addrinfo* pick = res;
  for (const struct addrinfo* a = res; a; a = a->ai_next)
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  int rc = getnameinfo(pick->ai_addr, pick->ai_addrlen, ip, (socklen_t)n, NULL, 0, NI_NUMERICHOST);
  freeaddrinfo(res);
  if (rc != 0) {
    launch_msg("cannot print the address of host '%s'.", h);
    return -1;
  }
  return 0;
}

/* This machine's address that routes to ip (a UDP connect sends nothing). */
static int local_addr_to(const char* ip, char* out, size_t n) {
  struct sockaddr_storage ss = {0};
  socklen_t len = 0;
  struct sockaddr_in* s4 = (struct sockaddr_in*)&ss;
  struct sockaddr_in6* s6 = (struct sockaddr_in6*)&ss;
  if (inet_pton(AF_INET, ip, &s4->sin_addr) == 1) {
    s4->sin_family = AF_INET;
    s4->sin_port = htons(9);
    len = sizeof *s4;
  } else if (inet_pton(AF_INET6, ip, &s6->sin6_addr) == 1) {
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(9);
    len = sizeof *s6;
  } else {
    launch_msg("'%s' is not an IP address.", ip);
    return -1;
  }
  int fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_storage me;
  socklen_t ml = sizeof me;
  int rc = -1;
  if (fd >= 0 && connect(fd, (struct sockaddr*)&ss, len) == 0 &&
      getsockname(fd, (struct sockaddr*)&me, &ml) == 0 &&
      getnameinfo((struct sockaddr*)&me, ml, out, (socklen_t)n, NULL, 0, NI_NUMERICHOST) == 0)
    rc = 0;
  else
    launch_msg("no route from this machine to %s: %s.", ip, strerror(errno));
  if (fd >= 0) close(fd);
  return rc;
}

/* The secret file's line (for the remote ranks' stdin); -1 after a message. */
static int read_secret(const char* path, char* out, size_t n) {
  FILE* f = fopen(path, "r");
  if (!f || !fgets(out, (int)n, f)) {
    launch_msg("--secret: cannot read %s back.", path);
    if (f) fclose(f);
    return -1;
  }
  fclose(f);
  out[strcspn(out, "\n")] = '\0';
  return 0;
}

typedef struct plan {
  int n;
  char (*ip)[64];    /* per host: MLXDIST_RING_ADDR ("" with --ifname) */
  const char** host; /* per rank */
  char*** argv;      /* per rank (NULL: the program, local) */
  const char** in;   /* per rank: stdin data (remote ranks) */
  const char** env;  /* local ranks' environment */
  int n_env;
  char** ssh_words;
  char rdv[128];
  char stdin_data[256];
  char* stdin_jaccl; /* jaccl: stdin_data and the matrix's line */
  launch_jaccl* j;   /* jaccl: NULL for ring */
  char kv[8][PATH_MAX + 64];
} plan;

static void plan_free(plan* p) {
  if (p->argv)
    for (int r = 0; r < p->n; r++) launch_argv_free(p->argv[r]);
  free(p->argv);
  free(p->ip);
  free(p->host);
  free(p->in);
  free(p->env);
  launch_argv_free(p->ssh_words);
  memset(p->stdin_data, 0, sizeof p->stdin_data);
  if (p->stdin_jaccl) memset(p->stdin_jaccl, 0, strlen(p->stdin_jaccl));
  free(p->stdin_jaccl);
}

/* Where every host's ranks listen, and the launcher's own address. */
static int addresses(const launch_opts* o, const launch_hosts* hs, plan* p, char* bind_ip,
                     size_t bn) {
  const char* route_to = NULL;
  for (int i = 0; i < hs->n; i++) {
    const launch_host* h = &hs->h[i];
    if (h->ip[0])
      snprintf(p->ip[i], sizeof p->ip[i], "%s", h->ip);
    else if (!h->local && resolve(h->name, p->ip[i], sizeof p->ip[i], o->ifname != NULL) != 0 &&
             !o->ifname)
      return -1;
    if (!h->local && !route_to && p->ip[i][0]) route_to = p->ip[i];
  }
  if (!route_to) {
    launch_msg(
        "cannot tell which address of this machine the hosts reach: give their addresses "
        "in the hostfile (\"ips\").");
    return -1;
  }
  if (local_addr_to(route_to, bind_ip, bn) != 0) return -1;
  for (int i = 0; i < hs->n; i++) {
    if (hs->h[i].ip[0]) continue; /* the hostfile's "ips" win */
    if (o->ifname)                /* the ranks pick their interface's address */
      p->ip[i][0] = '\0';
    else if (hs->h[i].local) /* reachable from the other hosts: the launcher's own address */
      snprintf(p->ip[i], sizeof p->ip[i], "%s", bind_ip);
  }
  return 0;
}

/* The local ranks' environment (besides MLX_RANK): the rendezvous, then the
 * hostfile's and --env's variables (which may override them). */
static int local_env(const launch_opts* o, const launch_hosts* hs, plan* p, const char* token_hex,
                     const char* secret_path) {
  p->env = calloc((size_t)(12 + hs->n_envs + o->n_envs), sizeof *p->env);
  if (!p->env) return -1;
  int e = 0, k = 0;
  snprintf(p->kv[k], sizeof p->kv[k], "MLX_WORLD_SIZE=%d", hs->ranks);
  p->env[e++] = p->kv[k++];
  snprintf(p->kv[k], sizeof p->kv[k], "MLXDIST_JOB_TOKEN=%s", token_hex);
  p->env[e++] = p->kv[k++];
  if (p->j) { /* jaccl: its variables instead of the ring's */
    for (int i = 0; i < p->j->n_kv; i++) p->env[e++] = p->j->kv[i];
  } else {
    snprintf(p->kv[k], sizeof p->kv[k], "MLXDIST_RENDEZVOUS=%s", p->rdv);
    p->env[e++] = p->kv[k++];
    int li = 0; /* the (first) local host */
    while (li < hs->n - 1 && !hs->h[li].local) li++;
    if (p->ip[li][0])
      snprintf(p->kv[k], sizeof p->kv[k], "MLXDIST_RING_ADDR=%s", p->ip[li]);
    else
      snprintf(p->kv[k], sizeof p->kv[k], "MLXDIST_IFNAME=%s", o->ifname);
    p->env[e++] = p->kv[k++];
  }
  if (o->port_range && !p->j) {
    snprintf(p->kv[k], sizeof p->kv[k], "MLXDIST_PORT_RANGE=%s", o->port_range);
    p->env[e++] = p->kv[k++];
  }
  if (secret_path) {
    snprintf(p->kv[k], sizeof p->kv[k], "MLXDIST_SECRET_FILE=%s", secret_path);
    p->env[e++] = p->kv[k++];
  }
  if (o->verbose) p->env[e++] = "MLX_RING_VERBOSE=1";
  for (int i = 0; i < hs->n_envs; i++) p->env[e++] = hs->envs[i];
  for (int i = 0; i < o->n_envs; i++) p->env[e++] = o->envs[i];
  p->n_env = e;
  return 0;
}

/* Rank r's ssh command line. */
static char** remote_argv(const launch_opts* o, const launch_hosts* hs, plan* p, int r,
                          const char* cwd, const char** envs, int n_envs) {
  int hi = launch_hosts_of_rank(hs, r);
  launch_remote rm = {.rank = r,
                      .world = hs->ranks,
                      .host = hs->h[hi].name,
                      .cwd = cwd,
                      .rendezvous = p->rdv,
                      .ring_addr = p->ip[hi],
                      .ifname = p->ip[hi][0] ? NULL : o->ifname,
                      .port_range = o->port_range,
                      .envs = envs,
                      .n_envs = n_envs,
                      .verbose = o->verbose,
                      .secret = o->secret,
                      .grace = LAUNCH_GRACE_S,
                      .program = o->program};
  if (p->j) { /* jaccl: no rendezvous; the matrix on stdin, the coordinator */
    rm.rendezvous = rm.ring_addr = rm.ifname = rm.port_range = NULL;
    rm.matrix = true;
    rm.jaccl_coord = p->j->coord;
    rm.jaccl_ring = o->jaccl_ring;
  }
  char* script = launch_remote_script(&rm);
  if (!script) return NULL;
  char** av = launch_ssh_argv(p->ssh_words, o->connect_timeout, hs->h[hi].name, script);
  free(script);
  return av;
}

static bool rdv_started(void* ctx) { return launch_rdv_done(ctx); }
static bool rdv_failed(void* ctx) { return launch_rdv_failed(ctx); }

static void print_plan(const launch_opts* o, const launch_hosts* hs, const plan* p,
                       const char* bind_ip) {
  if (p->j)
    launch_msg("starting %d rank%s of '%s' on %d host%s; jaccl%s, coordinator %s", hs->ranks,
               hs->ranks == 1 ? "" : "s", o->program[0], hs->n, hs->n == 1 ? "" : "s",
               o->jaccl_ring ? "-ring" : "", p->j->coord);
  else
    launch_msg("starting %d rank%s of '%s' on %d host%s; rendezvous at %s (bound by %s)", hs->ranks,
               hs->ranks == 1 ? "" : "s", o->program[0], hs->n, hs->n == 1 ? "" : "s", p->rdv,
               bind_ip);
  for (int i = 0, r = 0; i < hs->n; r += hs->h[i].slots, i++)
    if (p->j)
      launch_msg("  host %s: rank %d, %s%s", hs->h[i].name, r,
                 hs->h[i].local ? "local (no ssh)" : "over ssh",
                 i == 0 ? ", the coordinator's host" : "");
    else
      launch_msg("  host %s: rank%s %d..%d, %s, listening on %s", hs->h[i].name,
                 hs->h[i].slots == 1 ? "" : "s", r, r + hs->h[i].slots - 1,
                 hs->h[i].local ? "local (no ssh)" : "over ssh",
                 p->ip[i][0] ? p->ip[i] : "the address of --ifname");
}

int launch_run_hosts(const launch_opts* o, const launch_hosts* hs, int sfd, const char* token_hex,
                     const char* secret_path) {
  plan p = {.n = hs->ranks};
  launch_jaccl jaccl;
  char why[512], bind_ip[64], cwd[PATH_MAX], secret[128] = "";
  int rc = 1;
  launch_rdv* rdv = NULL;
  const char** envs = calloc((size_t)(hs->n_envs + o->n_envs + 1), sizeof *envs);
  p.ip = calloc((size_t)hs->n, sizeof *p.ip);
  p.host = calloc((size_t)p.n, sizeof *p.host);
  p.argv = calloc((size_t)p.n + 1, sizeof *p.argv);
  p.in = calloc((size_t)p.n, sizeof *p.in);
  if (!envs || !p.ip || !p.host || !p.argv || !p.in) {
    launch_msg("out of memory");
    goto out;
  }
  int n_envs = 0;
  for (int i = 0; i < hs->n_envs; i++) envs[n_envs++] = hs->envs[i];
  for (int i = 0; i < o->n_envs; i++) envs[n_envs++] = o->envs[i];
  if (!(p.ssh_words = launch_split_words(o->ssh ? o->ssh : "ssh", why, sizeof why))) {
    launch_msg("%s.", why);
    rc = 2;
    goto out;
  }
  if (o->cwd)
    snprintf(cwd, sizeof cwd, "%s", o->cwd);
  else if (!getcwd(cwd, sizeof cwd)) {
    launch_msg("cannot tell the current directory (%s); give --cwd.", strerror(errno));
    goto out;
  }
  if (addresses(o, hs, &p, bind_ip, sizeof bind_ip) != 0) goto out;
  if (secret_path && read_secret(secret_path, secret, sizeof secret) != 0) goto out;
  snprintf(p.stdin_data, sizeof p.stdin_data, "%s\n%s%s", token_hex, secret, secret[0] ? "\n" : "");
  memset(secret, 0, sizeof secret);
  for (int r = 0; r < p.n; r++) p.host[r] = hs->h[launch_hosts_of_rank(hs, r)].name;
  double rdv_timeout = LAUNCH_RDV_FACTOR * o->connect_timeout;
  if (o->jaccl) { /* MLX's variables, no rendezvous (docs/jaccl.md, "Launching") */
    if ((rc = launch_jaccl_hosts(o, hs, p.ip[0], p.ssh_words, &jaccl)) != 0) goto out;
    p.j = &jaccl;
    size_t l = strlen(p.stdin_data) + strlen(jaccl.matrix) + 2;
    if (!(p.stdin_jaccl = malloc(l))) {
      rc = 1;
      launch_msg("out of memory");
      goto out;
    }
    snprintf(p.stdin_jaccl, l, "%s%s\n", p.stdin_data, jaccl.matrix);
    rc = 1;
  } else {
    rdv = launch_rdv_start(p.n, token_hex, bind_ip, o->port_range, rdv_timeout, p.host, p.rdv,
                           sizeof p.rdv);
    if (!rdv) goto out;
  }
  if (local_env(o, hs, &p, token_hex, secret_path) != 0) {
    launch_msg("out of memory");
    goto out;
  }
  for (int r = 0; r < p.n; r++) {
    if (hs->h[launch_hosts_of_rank(hs, r)].local) continue;
    if (!(p.argv[r] = remote_argv(o, hs, &p, r, cwd, envs, n_envs))) {
      launch_msg("out of memory");
      goto out;
    }
    p.in[r] = p.stdin_jaccl ? p.stdin_jaccl : p.stdin_data;
  }
  if (o->verbose) print_plan(o, hs, &p, bind_ip);
  unsetenv("MLX_HOSTFILE"); /* the local ranks take the rendezvous, not a stale hostfile */
  launch_spawn sp = {.argv = o->program,
                     .set_env = p.env,
                     .n_env = p.n_env,
                     .rank_argv = p.argv,
                     .rank_host = p.host,
                     .rank_stdin = p.in,
                     .host_prefix = o->verbose,
                     .started = rdv ? rdv_started : NULL,
                     .started_ctx = rdv,
                     .failed = rdv ? rdv_failed : NULL,
                     .start_timeout = rdv_timeout + 2.0};
  if (p.j) launch_jaccl_release(p.j); /* just before rank 0 starts: it binds the port */
  rc = launch_ranks(&sp, p.n, sfd, o->timeout);
out:
  launch_rdv_stop(rdv);
  if (p.j) launch_jaccl_free(p.j);
  free(envs);
  plan_free(&p);
  return rc;
}

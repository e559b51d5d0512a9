/* mlxdist-launch: --backend jaccl and jaccl-ring (MLX's RDMA backend, docs/jaccl.md).
 *
 * What a rank gets, as MLX's launcher gives it (mlx.launch, launch_jaccl in
 * python/mlx/_distributed_utils/launch.py): MLX_RANK; MLX_IBV_DEVICES, the
 * path of the device matrix; MLX_JACCL_COORDINATOR, the first host's address
 * and a port; MLX_JACCL_RING=1 with jaccl-ring. The matrix's rows are the
 * hostfile's "rdma" lists, one rank per host entry (MLX's rule: its launcher
 * has no slots for jaccl); for a job on this host the file of --ibv-devices,
 * or of MLX_IBV_DEVICES (JACCL_IBV_DEVICES) already set. Every list and the
 * whole matrix are checked before anything starts, by jaccl's own rules
 * (backends/jaccl/jaccl_config.h), each error naming the host and entry.
 *
 * Where MLX writes the matrix into a mktemp file it never removes, mlxdist
 * writes it into a 0600 file in a private 0700 directory, removed when the
 * job ends (also after a failure or SIGINT/SIGTERM/SIGHUP, which the
 * launcher handles; on a remote host by its script's exit trap).
 *
 * The coordinator's port is never guessed (MLX takes 32323): when the first
 * host is this machine the launcher binds it (port 0, the first free one of
 * --port-range, or --coordinator-port) and holds it listening until the ranks
 * start; on another host it reads that host's sockets over ssh
 * (/proc/net/tcp, /proc/net/tcp6) and takes a port no socket there uses, in
 * --port-range or in the host's ephemeral range, from a random start. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/jaccl/jaccl_config.h"
#include "launch.h"
#include "net/net.h"
#include "util/clock.h"
#include "util/json_doc.h"

#define WHY(...) (snprintf(why, why_len, __VA_ARGS__), 2)
#define PROBE_EXTRA_S 5.0    /* the probe's bound: --connect-timeout plus this */
#define PROBE_MAX (4u << 20) /* bytes of /proc/net/tcp* read back */

/* One device name of host i's entry j (item k, -1: the entry is the name). */
static int check_dev(const char* s, const char* where, int j, int k, char* why, size_t why_len) {
  char prob[200], item[32] = "";
  if (!mlxd_jaccl_dev_name_problem(s, prob, sizeof prob)) return 0;
  if (k >= 0) snprintf(item, sizeof item, " item %d", k);
  return WHY("%s: \"rdma\" entry %d%s%s%s", where, j, item, s[0] ? ": " : " ", prob);
}

/* Host i's "rdma" list: n entries, its own null, the others null, a name or a list of names. */
static int check_row(const launch_hosts* hs, int i, const char* name, char* why, size_t why_len) {
  const launch_host* h = &hs->h[i];
  char where[400];
  snprintf(where, sizeof where, "hostfile '%.200s', host %d (%.64s)", name, i, h->name);
  if (h->slots != 1)
    return WHY(
        "%s has %d ranks (its slots or -n), but jaccl runs one rank per host entry, as MLX's "
        "launcher does: list the host once per rank, each entry with its own \"rdma\" list",
        where, h->slots);
  if (!h->rdma)
    return WHY(
        "%s has no \"rdma\" list (jaccl needs one per host: %d entries, the RDMA device that "
        "reaches each host in the hostfile's order, null for the host itself)",
        where, hs->n);
  cJSON* row = cJSON_Parse(h->rdma);
  int rc = 0;
  if (!cJSON_IsArray(row)) {
    rc = WHY("%s: \"rdma\" is %s (expected a list of %d entries, null for the host itself)", where,
             row ? mlxd_json_kind(row) : "not JSON", hs->n);
  } else if (cJSON_GetArraySize(row) != hs->n) {
    rc = WHY("%s: \"rdma\" has %d entries, expected %d (one per host, null for the host itself)",
             where, cJSON_GetArraySize(row), hs->n);
  }
  int j = 0;
  const cJSON* e;
  if (rc == 0) cJSON_ArrayForEach(e, row) {
      if (j == i && !cJSON_IsNull(e))
        rc = WHY("%s: \"rdma\" entry %d is the host itself and must be null, got %s", where, j,
                 mlxd_json_kind(e));
      else if (cJSON_IsString(e))
        rc = check_dev(e->valuestring, where, j, -1, why, why_len);
      else if (cJSON_IsArray(e)) {
        int k = 0;
        const cJSON* s;
        cJSON_ArrayForEach(s, e) {
          if (rc) break;
          if (!cJSON_IsString(s))
            rc = WHY("%s: \"rdma\" entry %d item %d is %s (expected a device name)", where, j, k,
                     mlxd_json_kind(s));
          else
            rc = check_dev(s->valuestring, where, j, k, why, why_len);
          k++;
        }
      } else if (!cJSON_IsNull(e))
        rc = WHY("%s: \"rdma\" entry %d is %s (expected null, a device name or a list of names)",
                 where, j, mlxd_json_kind(e));
      if (rc) break;
      j++;
    }
  cJSON_Delete(row);
  return rc;
}

/* The whole matrix by jaccl's own parser and topology rule; *n its rows. */
static int check_matrix(const char* text, size_t len, const char* name, bool ring, int* n,
                        char* why, size_t why_len) {
  mlxd_status st = {0};
  mlxd_jaccl_matrix m;
  int topo = 0;
  if (mlxd_jaccl_matrix_parse(text, len, name, &m, &st) != 0) return WHY("%s", st.msg);
  int rc = mlxd_jaccl_topology(&m, ring, name, &topo, &st) != 0 ? WHY("%s", st.msg) : 0;
  *n = m.size;
  mlxd_jaccl_matrix_free(&m);
  return rc;
}

static launch_jaccl* g_cleanup; /* removed at exit, whatever way the launcher exits */

static void remove_files(launch_jaccl* j) {
  if (j->path[0]) unlink(j->path);
  if (j->dir[0]) rmdir(j->dir);
  j->path[0] = j->dir[0] = '\0';
}

static void cleanup_at_exit(void) {
  if (g_cleanup) remove_files(g_cleanup);
}

/* The matrix into dir/devices.json (0600; the directory 0700). 1 after a message. */
static int write_matrix(launch_jaccl* j) {
  const char* tmp = getenv("TMPDIR");
  if (!tmp || !*tmp || strlen(tmp) > sizeof j->dir - 32) tmp = "/tmp";
  snprintf(j->dir, sizeof j->dir, "%s/mlxdist-jaccl.XXXXXX", tmp);
  if (!mkdtemp(j->dir)) {
    launch_msg("jaccl: cannot create a private directory in %s for the device matrix: %s.", tmp,
               strerror(errno));
    j->dir[0] = '\0';
    return 1;
  }
  static bool registered;
  if (!registered) registered = atexit(cleanup_at_exit) == 0;
  g_cleanup = j;
  snprintf(j->path, sizeof j->path, "%s/devices.json", j->dir);
  int fd = open(j->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  size_t len = strlen(j->matrix);
  bool ok = fd >= 0 && write(fd, j->matrix, len) == (ssize_t)len && write(fd, "\n", 1) == 1;
  int e = errno;
  if (fd >= 0 && close(fd) != 0) ok = false;
  if (!ok) {
    launch_msg("jaccl: cannot write the device matrix %s: %s.", j->path, strerror(e));
    remove_files(j);
    return 1;
  }
  return 0;
}

/* Bind ip on port (0: any; or the first free one of port_range) and hold it listening. */
static int bind_coordinator(launch_jaccl* j, const char* ip, const launch_opts* o) {
  char spec[128], why[256];
  snprintf(spec, sizeof spec, strchr(ip, ':') ? "[%s]:0" : "%s:0", ip);
  mlxd_net_addr a;
  if (mlxd_net_parse_addr(spec, true, &a, why, sizeof why) != 0 || a.sa.ss_family == AF_UNSPEC) {
    launch_msg("jaccl: the coordinator's address '%s' is not an IP address.", ip);
    return 1;
  }
  unsigned lo = (unsigned)o->coord_port, hi = lo;
  if (!lo && o->port_range && mlxd_rdv_parse_port_range(o->port_range, &lo, &hi, why, sizeof why))
    lo = hi = 0;
  int fd = socket(a.sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), err = 0, one = 1;
  bool ok = false;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  for (unsigned p = lo; fd >= 0 && p <= hi && !ok; p++) {
    if (a.sa.ss_family == AF_INET)
      ((struct sockaddr_in*)(void*)&a.sa)->sin_port = htons((uint16_t)p);
    else
      ((struct sockaddr_in6*)(void*)&a.sa)->sin6_port = htons((uint16_t)p);
    ok = bind(fd, (struct sockaddr*)&a.sa, a.len) == 0 && listen(fd, 1) == 0;
    err = errno;
    if (!ok && err != EADDRINUSE && err != EACCES) break;
  }
  socklen_t len = sizeof a.sa;
  if (!ok || getsockname(fd, (struct sockaddr*)&a.sa, &len) != 0) {
    if (fd < 0) err = errno;
    if (o->coord_port)
      launch_msg("jaccl: cannot listen on %s port %d (--coordinator-port): %s.", ip, o->coord_port,
                 strerror(err));
    else if (lo)
      launch_msg("jaccl: no free port for the coordinator on %s in --port-range %u-%u (%s).", ip,
                 lo, hi, strerror(err));
    else
      launch_msg("jaccl: cannot listen on %s for the coordinator: %s.", ip, strerror(err));
    if (fd >= 0) close(fd);
    return 1;
  }
  mlxd_net_format_addr((struct sockaddr*)&a.sa, j->coord, sizeof j->coord);
  j->hold_fd = fd;
  return 0;
}

int launch_jaccl_free_port(const char* text, unsigned lo, unsigned hi, unsigned start,
                           unsigned* port, char* why, size_t why_len) {
  const char* p = text;
  if (!lo) { /* the first line: ip_local_port_range */
    if (sscanf(p, "%u %u", &lo, &hi) != 2 || lo < 1 || hi > 65535 || lo > hi)
      return WHY("cannot read its ephemeral port range (/proc/sys/net/ipv4/ip_local_port_range)");
    p = strchr(p, '\n');
  }
  static unsigned char used[65536 / 8];
  memset(used, 0, sizeof used);
  int sockets = 0;
  for (; p && *p; p = strchr(p, '\n')) {
    if (*p == '\n') p++;
    unsigned local = 0;
    /* "  12: 0100007F:1F90 00000000:0000 0A ...": the local address's port, in hex */
    if (sscanf(p, " %*u: %*[0-9A-Fa-f]:%x", &local) == 1 && local < 65536) {
      used[local / 8] |= (unsigned char)(1u << (local % 8));
      sockets++;
    }
  }
  if (sockets == 0) return WHY("read no socket table from it (/proc/net/tcp: is it Linux?)");
  unsigned span = hi - lo + 1;
  for (unsigned k = 0; k < span; k++) {
    unsigned q = lo + (start + k) % span;
    if (!(used[q / 8] & (1u << (q % 8)))) {
      *port = q;
      return 0;
    }
  }
  return WHY("has no free port in %u-%u (every one is in use by a socket there)", lo, hi);
}

/* Run argv with stdout captured into *out (at most PROBE_MAX bytes), bounded by limit_s:
 * then the child is killed. Returns its exit status, or -1 (timed out or not started). */
static int capture(char* const* argv, double limit_s, char** out, size_t* len) {
  int po[2];
  *out = NULL;
  *len = 0;
  if (pipe2(po, O_CLOEXEC) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) {
    close(po[0]);
    close(po[1]);
    return -1;
  }
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setpgid(0, 0);
    int dn = open("/dev/null", O_RDONLY);
    if (dn >= 0) dup2(dn, 0);
    dup2(po[1], 1);
    execvp(argv[0], argv);
    _exit(127);
  }
  setpgid(pid, pid);
  close(po[1]);
  size_t cap = 65536;
  char* buf = malloc(cap + 1);
  double end = mlxd_now() + limit_s;
  bool timed_out = false;
  while (buf) {
    double left = end - mlxd_now();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    struct pollfd pf = {.fd = po[0], .events = POLLIN};
    int r = poll(&pf, 1, (int)(left * 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    if (*len == cap && cap < PROBE_MAX) {
      char* nb = realloc(buf, 2 * cap + 1);
      if (!nb) break;
      buf = nb, cap *= 2;
    }
    if (*len == cap) break; /* enough: the rest is not read */
    ssize_t k = read(po[0], buf + *len, cap - *len);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    *len += (size_t)k;
  }
  close(po[0]);
  int st = 0;
  if (timed_out || !buf) kill(-pid, SIGKILL);
  /* the output ended: the child exits at once, or is killed after the bound */
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (mlxd_now() > end) {
      kill(-pid, SIGKILL);
      timed_out = true;
      waitpid(pid, &st, 0);
      break;
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  if (!buf) return -1;
  buf[*len] = '\0';
  *out = buf;
  if (timed_out) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* The first host is another machine: a port that no socket uses there. */
static int remote_port(launch_jaccl* j, const char* ip, const char* host, const launch_opts* o,
                       char* const* ssh_words) {
  unsigned lo = 0, hi = 0, port = 0;
  char why[300];
  if (o->coord_port)
    lo = hi = (unsigned)o->coord_port;
  else if (o->port_range && mlxd_rdv_parse_port_range(o->port_range, &lo, &hi, why, sizeof why))
    lo = hi = 0;
  char** av = launch_ssh_argv(ssh_words, o->connect_timeout, host,
                              "cat /proc/sys/net/ipv4/ip_local_port_range /proc/net/tcp && "
                              "{ cat /proc/net/tcp6 2>/dev/null || :; }");
  if (!av) {
    launch_msg("out of memory");
    return 1;
  }
  char* text = NULL;
  size_t len = 0;
  double limit = o->connect_timeout + PROBE_EXTRA_S;
  int st = capture(av, limit, &text, &len);
  launch_argv_free(av);
  if (st != 0) {
    if (st < 0)
      launch_msg(
          "jaccl: cannot read host %s's sockets to choose the coordinator's port: ssh "
          "gave no answer within %.0f s.",
          host, limit);
    else
      launch_msg(
          "jaccl: cannot read host %s's sockets to choose the coordinator's port (ssh "
          "exit status %d); give --coordinator-port P.",
          host, st);
    free(text);
    return 1;
  }
  /* with a range of ours the first line (the host's range) matches no socket line */
  unsigned seed = (unsigned)getpid() ^ (unsigned)time(NULL);
  int rc = launch_jaccl_free_port(text, lo, hi, seed, &port, why, sizeof why);
  free(text);
  if (rc != 0) {
    if (o->coord_port)
      launch_msg("jaccl: --coordinator-port %d is in use on host %s.", o->coord_port, host);
    else
      launch_msg("jaccl: host %s %s; give --coordinator-port P or --port-range A-B.", host, why);
    return 1;
  }
  snprintf(j->coord, sizeof j->coord, strchr(ip, ':') ? "[%s]:%u" : "%s:%u", ip, port);
  return 0;
}

static int finish(launch_jaccl* j, const launch_opts* o) {
  int k = 0;
  snprintf(j->kv[k++], sizeof j->kv[0], "MLX_JACCL_COORDINATOR=%s", j->coord);
  if (j->path[0]) snprintf(j->kv[k++], sizeof j->kv[0], "MLX_IBV_DEVICES=%s", j->path);
  if (o->jaccl_ring) snprintf(j->kv[k++], sizeof j->kv[0], "MLX_JACCL_RING=1");
  j->n_kv = k;
  /* the JACCL_ forms win over MLX_'s in a rank: none of the launcher's environment reaches it */
  unsetenv("JACCL_RANK");
  unsetenv("JACCL_IBV_DEVICES");
  unsetenv("JACCL_COORDINATOR");
  unsetenv("JACCL_RING");
  unsetenv("MLX_JACCL_RING");
  unsetenv("MLX_HOSTFILE");
  return 0;
}

static void init(launch_jaccl* j) {
  memset(j, 0, sizeof *j);
  j->hold_fd = -1;
}

/* The "rdma" lists of hs into j->matrix; 2 after a message. */
static int from_hosts(launch_jaccl* j, const launch_opts* o, const launch_hosts* hs) {
  char why[MLXD_MSG_MAX + 512];
  const char* name = o->hostfile ? o->hostfile : "--hosts";
  if (!o->hostfile) {
    launch_msg(
        "jaccl needs the device matrix: give a hostfile whose hosts have \"rdma\" lists "
        "(docs/launch.md), not --hosts.");
    return 2;
  }
  size_t cap = 3;
  for (int i = 0; i < hs->n; i++) {
    if (check_row(hs, i, name, why, sizeof why) != 0) {
      launch_msg("%s.", why);
      return 2;
    }
    cap += strlen(hs->h[i].rdma) + 1;
  }
  if (!(j->matrix = malloc(cap))) {
    launch_msg("out of memory");
    return 1;
  }
  size_t at = 0;
  j->matrix[at++] = '[';
  for (int i = 0; i < hs->n; i++) {
    if (i) j->matrix[at++] = ',';
    size_t l = strlen(hs->h[i].rdma);
    memcpy(j->matrix + at, hs->h[i].rdma, l);
    at += l;
  }
  j->matrix[at++] = ']';
  j->matrix[at] = '\0';
  char mname[300];
  snprintf(mname, sizeof mname, "the \"rdma\" lists of hostfile '%.200s' (row = host)", name);
  if (check_matrix(j->matrix, at, mname, o->jaccl_ring, &j->n, why, sizeof why) != 0) {
    launch_msg("%s.", why);
    return 2;
  }
  return 0;
}

int launch_jaccl_check_hosts(const launch_opts* o, const launch_hosts* hs) {
  launch_jaccl j;
  init(&j);
  int rc = from_hosts(&j, o, hs);
  free(j.matrix);
  return rc;
}

int launch_jaccl_local(const launch_opts* o, const launch_hosts* hs, launch_jaccl* j) {
  init(j);
  int rc = 0;
  if (hs) {
    if ((rc = from_hosts(j, o, hs)) != 0 || (rc = write_matrix(j)) != 0) {
      launch_jaccl_free(j);
      return rc;
    }
  } else {
    const char *var = "--ibv-devices", *path = o->ibv_devices;
    if (!path && (path = getenv("JACCL_IBV_DEVICES"))) var = "JACCL_IBV_DEVICES";
    if (!path && (path = getenv("MLX_IBV_DEVICES"))) var = "MLX_IBV_DEVICES";
    if (!path || !*path) {
      launch_msg(
          "jaccl on this host needs the device matrix (which RDMA device each rank reaches "
          "each other rank through): give --ibv-devices FILE or set MLX_IBV_DEVICES, or run "
          "across hosts with a hostfile whose hosts have \"rdma\" lists (docs/jaccl.md).");
      return 2;
    }
    mlxd_status st = {0};
    char* text = NULL;
    size_t len = 0;
    char why[MLXD_MSG_MAX + 256];
    if (mlxd_jaccl_read_file(var, path, &text, &len, &st) != 0) {
      launch_msg("%s.", st.msg);
      return 2;
    }
    rc = check_matrix(text, len, path, o->jaccl_ring, &j->n, why, sizeof why);
    free(text);
    if (rc != 0) {
      launch_msg("%s: %s.", var, why);
      return 2;
    }
    if (o->n && o->n != j->n) {
      launch_msg("-n %d disagrees with the device matrix '%s' (%s): it has %d rows, one per rank.",
                 o->n, path, var, j->n);
      return 2;
    }
    if (!realpath(path, j->user_path)) snprintf(j->user_path, sizeof j->user_path, "%s", path);
  }
  if ((rc = bind_coordinator(j, "127.0.0.1", o)) != 0) {
    launch_jaccl_free(j);
    return rc;
  }
  finish(j, o);
  if (!hs) snprintf(j->kv[j->n_kv++], sizeof j->kv[0], "MLX_IBV_DEVICES=%s", j->user_path);
  return 0;
}

int launch_jaccl_hosts(const launch_opts* o, const launch_hosts* hs, const char* ip0,
                       char* const* ssh_words, launch_jaccl* j) {
  init(j);
  int rc = from_hosts(j, o, hs);
  if (rc == 0 && (!ip0 || !*ip0)) {
    rc = 2;
    launch_msg(
        "jaccl: the coordinator listens on the first host (%s), but its address is not known: "
        "give its \"ips\" in the hostfile.",
        hs->h[0].name);
  }
  if (rc != 0) {
    launch_jaccl_free(j);
    return rc;
  }
  bool local0 = hs->h[0].local;
  for (int i = 0; i < hs->n; i++)
    if (hs->h[i].local) { /* the local ranks' file, once */
      rc = write_matrix(j);
      break;
    }
  if (rc == 0)
    rc = local0 ? bind_coordinator(j, ip0, o) : remote_port(j, ip0, hs->h[0].name, o, ssh_words);
  if (rc != 0) {
    launch_jaccl_free(j);
    return rc;
  }
  return finish(j, o);
}

void launch_jaccl_release(launch_jaccl* j) {
  if (j->hold_fd >= 0) close(j->hold_fd);
  j->hold_fd = -1;
}

void launch_jaccl_free(launch_jaccl* j) {
  launch_jaccl_release(j);
  remove_files(j);
  if (g_cleanup == j) g_cleanup = NULL;
  free(j->matrix);
  j->matrix = NULL;
}

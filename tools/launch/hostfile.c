/* mlxdist-launch: the ring hostfile MLX_HOSTFILE names.
 *
 * A user's file (--hostfile) is read with the ranks' own reader and parser
 * (src/net/hostfile.c; the launcher's own checks are in
 * hostfile_check.c), so a file the ranks would refuse is refused here, before
 * anything starts, with the same reason. Without one, N*K ports
 * of 127.0.0.1 are reserved (bound and listening, so nothing else takes them
 * until the ranks start) and written as MLX's JSON hostfile into a private
 * temporary directory that is removed at exit. The ports are taken below the
 * kernel's ephemeral range (ip_local_port_range) when there is room for
 * them there: between the launcher's release and a rank's bind, a port of
 * that range can be taken by any outgoing connection, and a big job's ranks
 * make many (at 1,024 ranks a rank found its port so taken: "Address already
 * in use"). */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"
#include "net/net.h"

#define PORTS_LOW 10000 /* the lowest port reserved below the ephemeral range */

static char tmpdir[PATH_MAX - 64];
static char tmpfile_path[PATH_MAX];

static void cleanup_tmp(void) {
  if (tmpfile_path[0]) unlink(tmpfile_path);
  if (tmpdir[0]) rmdir(tmpdir);
  tmpfile_path[0] = tmpdir[0] = '\0';
}

/* MLX's hostfile format: one list of "ip:port" strings per rank. */
static char* hosts_json(const mlxd_net_hosts* h) {
  cJSON* root = cJSON_CreateArray();
  if (!root) return NULL;
  for (int r = 0; r < h->size; r++) {
    cJSON* list = cJSON_CreateArray();
    if (!list || !cJSON_AddItemToArray(root, list)) {
      cJSON_Delete(list);
      cJSON_Delete(root);
      return NULL;
    }
    for (int c = 0; c < h->nconn; c++) {
      cJSON* s = cJSON_CreateString(h->addrs[r * h->nconn + c].text);
      if (!s || !cJSON_AddItemToArray(list, s)) {
        cJSON_Delete(s);
        cJSON_Delete(root);
        return NULL;
      }
    }
  }
  char* text = cJSON_Print(root);
  cJSON_Delete(root);
  return text;
}

static int write_text(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  if (!f) return -1;
  size_t len = strlen(text);
  int rc = (fwrite(text, 1, len, f) == len && fputc('\n', f) != EOF) ? 0 : -1;
  if (fclose(f) != 0) rc = -1;
  return rc;
}

/* Read and parse the user's file as the ranks will; exits 2 when they would
 * refuse it or it disagrees with the command line. */
static void use_given(const launch_opts* o, launch_hostfile* hf, mlxd_net_hosts* h) {
  mlxd_status st = {0};
  char* text = NULL;
  size_t len = 0;
  char why[MLXD_MSG_MAX + 128];
  if (mlxd_net_hostfile_read(o->hostfile, &text, &len, &st) != 0) {
    mlxd_status_render(&st, NULL); /* the "[launch]" tag is added by launch_bad_usage */
    launch_bad_usage("%s.", st.msg);
  }
  int rc = launch_hostfile_check(text, len, o->hostfile, o->n, o->connections, h, why, sizeof why);
  free(text);
  if (rc != 0) launch_bad_usage("%s.", why);
  if (mlxd_net_hostfile_resolve(o->hostfile, h, &st) != 0) {
    mlxd_status_render(&st, NULL);
    launch_bad_usage("%s.", st.msg);
  }
  if (!realpath(o->hostfile, hf->path)) snprintf(hf->path, sizeof hf->path, "%s", o->hostfile);
}

/* The first port of the kernel's ephemeral range (32768 when unknown). */
static unsigned ephemeral_low(void) {
  unsigned lo = 32768, hi = 0;
  int fd = open("/proc/sys/net/ipv4/ip_local_port_range", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return lo;
  char buf[64];
  ssize_t k = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (k <= 0) return lo;
  buf[k] = '\0';
  if (sscanf(buf, "%u %u", &lo, &hi) != 2 || lo < 1024 || lo > 65535) lo = 32768;
  return lo;
}

/* Bind fd to 127.0.0.1: a free port of [*next, top) (walking on from a random start, wrapping
 * once past it), or any port (0) when that range is used up or absent; listening. */
static int bind_reserved(int fd, unsigned* next, unsigned lo, unsigned top, unsigned* tried) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  while (top > lo && *tried < top - lo) {
    unsigned p = *next;
    *next = p + 1 >= top ? lo : p + 1;
    (*tried)++;
    sa.sin_port = htons((uint16_t)p);
    if (bind(fd, (struct sockaddr*)&sa, sizeof sa) == 0) return listen(fd, 1);
    if (errno != EADDRINUSE && errno != EACCES) return -1;
  }
  sa.sin_port = 0;
  if (bind(fd, (struct sockaddr*)&sa, sizeof sa) != 0) return -1;
  return listen(fd, 1);
}

/* Bind every address of h to a free port of 127.0.0.1 and keep it listening. */
static int reserve_ports(mlxd_net_hosts* h, int* fds) {
  int n = h->size * h->nconn;
  unsigned top = ephemeral_low(), lo = PORTS_LOW, tried = 0;
  if (top < lo + 2u * (unsigned)n) top = lo; /* no room below the range: any port */
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts); /* a start of its own: two launchers rarely walk together */
  unsigned next = top > lo ? lo + (unsigned)((ts.tv_nsec ^ getpid()) % (long)(top - lo)) : lo;
  for (int i = 0; i < n; i++) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    fds[i] = fd;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind_reserved(fd, &next, lo, top, &tried) != 0) return -1;
    mlxd_net_addr* a = &h->addrs[i];
    a->len = sizeof a->sa;
    if (getsockname(fd, (struct sockaddr*)&a->sa, &a->len) != 0) return -1;
    mlxd_net_format_addr((const struct sockaddr*)&a->sa, a->text, sizeof a->text);
  }
  return 0;
}

/* A private directory under $TMPDIR (or /tmp) for the generated file. */
static int make_tmpdir(launch_hostfile* hf) {
  const char* tmp = getenv("TMPDIR");
  if (!tmp || !*tmp || strlen(tmp) > sizeof tmpdir - 32) tmp = "/tmp";
  snprintf(tmpdir, sizeof tmpdir, "%s/mlxdist-launch.XXXXXX", tmp);
  if (!mkdtemp(tmpdir)) {
    tmpdir[0] = '\0';
    launch_msg("cannot create a temporary directory under '%s': %s.", tmp, strerror(errno));
    return -1;
  }
  atexit(cleanup_tmp);
  snprintf(tmpfile_path, sizeof tmpfile_path, "%s/hostfile.json", tmpdir);
  snprintf(hf->path, sizeof hf->path, "%s", tmpfile_path);
  return 0;
}

static int generate(const launch_opts* o, launch_hostfile* hf, mlxd_net_hosts* h) {
  h->size = o->n;
  h->nconn = o->connections ? o->connections : 1;
  int n = h->size * h->nconn;
  h->addrs = calloc((size_t)n, sizeof *h->addrs);
  hf->fds = calloc((size_t)n, sizeof *hf->fds);
  if (!h->addrs || !hf->fds) {
    launch_msg("out of memory");
    return -1;
  }
  hf->n_fds = n;
  for (int i = 0; i < hf->n_fds; i++) hf->fds[i] = -1;
  if (make_tmpdir(hf) != 0) return -1;
  if (reserve_ports(h, hf->fds) != 0) {
    launch_msg("cannot reserve %d free TCP ports on 127.0.0.1: %s.", hf->n_fds, strerror(errno));
    return -1;
  }
  return 0;
}

int launch_hostfile_prepare(const launch_opts* o, launch_hostfile* hf) {
  memset(hf, 0, sizeof *hf);
  mlxd_net_hosts h = {0};
  int rc = 0;
  if (o->hostfile)
    use_given(o, hf, &h);
  else
    rc = generate(o, hf, &h);
  if (rc == 0) {
    hf->n = h.size;
    hf->json = hosts_json(&h);
    if (!hf->json) {
      launch_msg("out of memory");
      rc = -1;
    }
  }
  if (rc == 0 && !o->hostfile && write_text(hf->path, hf->json) != 0) {
    launch_msg("cannot write the hostfile '%s': %s.", hf->path, strerror(errno));
    rc = -1;
  }
  mlxd_net_hosts_free(&h);
  if (rc != 0) launch_hostfile_free(hf);
  return rc == 0 ? 0 : 1;
}

void launch_hostfile_release_ports(launch_hostfile* hf) {
  for (int i = 0; i < hf->n_fds; i++)
    if (hf->fds[i] >= 0) close(hf->fds[i]);
  free(hf->fds);
  hf->fds = NULL;
  hf->n_fds = 0;
}

void launch_hostfile_free(launch_hostfile* hf) {
  launch_hostfile_release_ports(hf);
  free(hf->json);
  hf->json = NULL;
}

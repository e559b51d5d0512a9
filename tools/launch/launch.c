/* mlxdist-launch: start N ranks of a program on this host.
 *
 * ring (default): reserve N*K free TCP ports on 127.0.0.1, write MLX's hostfile
 * (JSON, one list of "ip:port" strings per rank) into a private temp dir, and
 * fork/exec the ranks with MLX_RANK, MLX_HOSTFILE and MLX_WORLD_SIZE set. Each
 * output line of rank r is prefixed with "[r] ". The first rank to fail stops
 * the others (SIGTERM, SIGKILL after a grace period) and gives the exit status.
 *
 * mpi: run `mpirun -np N ...` (OpenMPI or MPICH flags) under the same
 * supervision (timeout, signal forwarding, exit status).
 *
 * This program does not use libmlxdist. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MLXD_MAX_RANKS 1024
#define MLXD_MAX_CONNECTIONS 64
#define MLXD_GRACE_S 3.0
#define MLXD_DRAIN_S 1.0
#define MLXD_MAX_LINE 65536

/* ------------------------------------------------------------------------ */
/* small helpers                                                             */

static double mlxd_launch_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void mlxd_usage(FILE* f) {
  fprintf(f,
          "Usage: mlxdist-launch -n N [options] [--] PROGRAM [ARGS...]\n"
          "\n"
          "Start N ranks of PROGRAM on this host and supervise them.\n"
          "\n"
          "Options:\n"
          "  -n, --np N            number of ranks (1..%d); with --hostfile, taken from the file\n"
          "  --backend ring|mpi    ring (default): local TCP ring, hostfile in MLX's format;\n"
          "                        mpi: run the ranks with mpirun\n"
          "  --connections K       ring: TCP connections per rank (1..%d, default 1)\n"
          "  --hostfile F          ring: use the JSON hostfile F as is (a list with one list\n"
          "                        of \"ip:port\" strings per rank); N is its number of lists\n"
          "  --env K=V             set K=V in every rank's environment (repeatable)\n"
          "  --verbose             print what is launched; ring: set MLX_RING_VERBOSE=1\n"
          "  --timeout S           kill all ranks after S seconds and exit 124 (default: none;\n"
          "                        also read from MLXDIST_LAUNCH_TIMEOUT; 0 means none)\n"
          "  -h, --help            print this help\n"
          "\n"
          "ring: each rank gets MLX_RANK, MLX_WORLD_SIZE and MLX_HOSTFILE. Every complete\n"
          "line a rank writes is printed with the prefix \"[rank] \", stdout lines on stdout\n"
          "and stderr lines on stderr.\n"
          "\n"
          "mpi: runs `mpirun -np N --oversubscribe [--allow-run-as-root] --tag-output -x K=V\n"
          "PROGRAM ARGS` for Open MPI (lines are prefixed by Open MPI as \"[1,rank]<stdout>:\"),\n"
          "or `mpirun -np N -prepend-rank -genv K V PROGRAM ARGS` for MPICH (prefix \"[rank] \");\n"
          "the flavour is detected from `mpirun --version`.\n"
          "\n"
          "Exit status: 0 when every rank succeeds; otherwise the status of the first rank\n"
          "that failed (128+signal when it was killed by a signal) after the other ranks\n"
          "were stopped (SIGTERM, then SIGKILL after %.0f s); 124 on timeout; 2 for bad\n"
          "arguments. SIGINT and SIGTERM are forwarded to the ranks.\n",
          MLXD_MAX_RANKS, MLXD_MAX_CONNECTIONS, MLXD_GRACE_S);
}

static void mlxd_bad_usage(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("[launch] ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs("\nRun 'mlxdist-launch --help' for usage.\n", stderr);
  va_end(ap);
  exit(2);
}

static void mlxd_msg(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("[launch] ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  fflush(stderr);
  va_end(ap);
}

static long mlxd_parse_long(const char* what, const char* s, long lo, long hi) {
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end != '\0' || v < lo || v > hi)
    mlxd_bad_usage("%s must be an integer from %ld to %ld, got '%s'.", what, lo, hi, s);
  return v;
}

static double mlxd_parse_seconds(const char* what, const char* s) {
  char* end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end != '\0' || !(v >= 0.0) || v > 1e9)
    mlxd_bad_usage("%s must be a number of seconds >= 0, got '%s'.", what, s);
  return v;
}

static bool mlxd_valid_env_name(const char* s, size_t n) {
  if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return false;
  for (size_t i = 1; i < n; i++)
    if (!(isalnum((unsigned char)s[i]) || s[i] == '_')) return false;
  return true;
}

/* ------------------------------------------------------------------------ */
/* options                                                                   */

typedef struct mlxd_opts {
  int n;             /* 0: not given */
  bool mpi;
  int connections;   /* 0: not given */
  const char* hostfile;
  const char** envs;
  int n_envs;
  bool verbose;
  double timeout;    /* 0: none */
  char** program;    /* argv of the program, NULL-terminated */
} mlxd_opts;

/* Match argv[*i] against a long option "--name" (also "--name=value") or a
 * short one "-c" (also "-cvalue"); on a match return its value and advance *i. */
static const char* mlxd_opt_value(int argc, char** argv, int* i, const char* lng, const char* shrt,
                                  bool* matched) {
  const char* a = argv[*i];
  const char* inl = NULL;
  *matched = false;
  size_t ll = strlen(lng);
  if (strncmp(a, lng, ll) == 0 && (a[ll] == '\0' || a[ll] == '=')) {
    *matched = true;
    if (a[ll] == '=') inl = a + ll + 1;
  } else if (shrt && strncmp(a, shrt, 2) == 0) {
    *matched = true;
    if (a[2] != '\0') inl = a + 2;
  }
  if (!*matched) return NULL;
  if (inl) return inl;
  if (*i + 1 >= argc) mlxd_bad_usage("option %s needs a value.", lng);
  (*i)++;
  return argv[*i];
}

static void mlxd_parse_args(int argc, char** argv, mlxd_opts* o) {
  memset(o, 0, sizeof *o);
  o->envs = calloc((size_t)argc, sizeof *o->envs);
  if (!o->envs) {
    mlxd_msg("out of memory");
    exit(1);
  }
  bool have_timeout = false;
  int i = 1;
  for (; i < argc; i++) {
    const char* a = argv[i];
    bool m = false;
    const char* v;
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (a[0] != '-' || a[1] == '\0') break; /* the program */
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      mlxd_usage(stdout);
      exit(0);
    }
    if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0) {
      o->verbose = true;
      continue;
    }
    if ((v = mlxd_opt_value(argc, argv, &i, "--np", "-n", &m)) || m) {
      o->n = (int)mlxd_parse_long("-n (the number of ranks)", v, 1, MLXD_MAX_RANKS);
    } else if ((v = mlxd_opt_value(argc, argv, &i, "--backend", NULL, &m)) || m) {
      if (strcmp(v, "ring") == 0)
        o->mpi = false;
      else if (strcmp(v, "mpi") == 0)
        o->mpi = true;
      else
        mlxd_bad_usage("--backend must be 'ring' or 'mpi', got '%s'.", v);
    } else if ((v = mlxd_opt_value(argc, argv, &i, "--connections", NULL, &m)) || m) {
      o->connections =
          (int)mlxd_parse_long("--connections", v, 1, MLXD_MAX_CONNECTIONS);
    } else if ((v = mlxd_opt_value(argc, argv, &i, "--hostfile", NULL, &m)) || m) {
      if (!*v) mlxd_bad_usage("--hostfile needs a file name, got an empty string.");
      o->hostfile = v;
    } else if ((v = mlxd_opt_value(argc, argv, &i, "--env", NULL, &m)) || m) {
      const char* eq = strchr(v, '=');
      if (!eq || !mlxd_valid_env_name(v, (size_t)(eq - v)))
        mlxd_bad_usage("--env expects NAME=VALUE with NAME made of letters, digits and '_', "
                       "got '%s'.", v);
      o->envs[o->n_envs++] = v;
    } else if ((v = mlxd_opt_value(argc, argv, &i, "--timeout", NULL, &m)) || m) {
      o->timeout = mlxd_parse_seconds("--timeout", v);
      have_timeout = true;
    } else {
      mlxd_bad_usage("unknown option '%s'.", a);
    }
  }
  if (i >= argc) mlxd_bad_usage("no program to launch was given (expected '-- PROGRAM ARGS...').");
  o->program = argv + i;
  if (!have_timeout) {
    const char* e = getenv("MLXDIST_LAUNCH_TIMEOUT");
    if (e && *e) o->timeout = mlxd_parse_seconds("MLXDIST_LAUNCH_TIMEOUT", e);
  }
  if (o->mpi) {
    if (o->hostfile)
      mlxd_bad_usage("--hostfile applies to the ring backend only (use an mpirun hostfile "
                     "through your MPI instead).");
    if (o->connections)
      mlxd_bad_usage("--connections applies to the ring backend only.");
  }
  if (!o->hostfile && o->n == 0)
    mlxd_bad_usage("the number of ranks is missing: give -n N (or --hostfile F).");
}

/* ------------------------------------------------------------------------ */
/* ring hostfile                                                             */

static char* mlxd_read_file(const char* path, size_t* len) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char* buf = malloc(cap + 1);
  while (buf) {
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (n < cap) break;
    cap *= 2;
    char* nb = realloc(buf, cap + 1);
    if (!nb) {
      free(buf);
      buf = NULL;
    }
    buf = nb;
  }
  int err = ferror(f);
  fclose(f);
  if (!buf || err) {
    free(buf);
    return NULL;
  }
  buf[n] = '\0';
  if (len) *len = n;
  return buf;
}

/* Validate a user hostfile and return its number of ranks (exits 2 if bad). */
static int mlxd_check_hostfile(const char* path, int want_connections) {
  char* text = mlxd_read_file(path, NULL);
  if (!text) mlxd_bad_usage("cannot read hostfile '%s': %s.", path, strerror(errno));
  cJSON* root = cJSON_Parse(text);
  free(text);
  if (!root)
    mlxd_bad_usage("hostfile '%s' is not valid JSON (expected a list with one list of "
                   "\"ip:port\" strings per rank).", path);
  if (!cJSON_IsArray(root) || cJSON_GetArraySize(root) < 1)
    mlxd_bad_usage("hostfile '%s' must be a non-empty JSON list with one list of \"ip:port\" "
                   "strings per rank.", path);
  int n = cJSON_GetArraySize(root);
  if (n > MLXD_MAX_RANKS) mlxd_bad_usage("hostfile '%s' has %d ranks; at most %d are supported.",
                                         path, n, MLXD_MAX_RANKS);
  int r = 0;
  const cJSON* rank;
  cJSON_ArrayForEach(rank, root) {
    if (!cJSON_IsArray(rank) || cJSON_GetArraySize(rank) < 1)
      mlxd_bad_usage("hostfile '%s': entry %d must be a non-empty list of \"ip:port\" strings.",
                     path, r);
    if (want_connections && cJSON_GetArraySize(rank) != want_connections)
      mlxd_bad_usage("hostfile '%s': rank %d has %d addresses but --connections is %d.", path, r,
                     cJSON_GetArraySize(rank), want_connections);
    const cJSON* addr;
    cJSON_ArrayForEach(addr, rank) {
      const char* s = cJSON_GetStringValue(addr);
      const char* colon = s ? strrchr(s, ':') : NULL;
      if (!colon || colon == s || colon[1] == '\0')
        mlxd_bad_usage("hostfile '%s': rank %d has an entry that is not an \"ip:port\" string.",
                       path, r);
    }
    r++;
  }
  cJSON_Delete(root);
  return n;
}

/* Bind n_sock listening sockets to 127.0.0.1 on free ports; fill fds and ports. */
static int mlxd_reserve_ports(int n_sock, int* fds, int* ports) {
  for (int i = 0; i < n_sock; i++) fds[i] = -1;
  for (int i = 0; i < n_sock; i++) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    fds[i] = fd;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = 0;
    if (bind(fd, (struct sockaddr*)&sa, sizeof sa) != 0) return -1;
    if (listen(fd, 1) != 0) return -1;
    socklen_t len = sizeof sa;
    if (getsockname(fd, (struct sockaddr*)&sa, &len) != 0) return -1;
    ports[i] = ntohs(sa.sin_port);
  }
  return 0;
}

static int mlxd_write_hostfile(const char* path, int n, int k, const int* ports) {
  cJSON* root = cJSON_CreateArray();
  if (!root) return -1;
  for (int r = 0; r < n; r++) {
    cJSON* list = cJSON_CreateArray();
    if (!list || !cJSON_AddItemToArray(root, list)) {
      cJSON_Delete(list);
      cJSON_Delete(root);
      return -1;
    }
    for (int c = 0; c < k; c++) {
      char addr[32];
      snprintf(addr, sizeof addr, "127.0.0.1:%d", ports[r * k + c]);
      cJSON* s = cJSON_CreateString(addr);
      if (!s || !cJSON_AddItemToArray(list, s)) {
        cJSON_Delete(s);
        cJSON_Delete(root);
        return -1;
      }
    }
  }
  char* text = cJSON_Print(root);
  cJSON_Delete(root);
  if (!text) return -1;
  FILE* f = fopen(path, "w");
  int rc = -1;
  if (f) {
    size_t len = strlen(text);
    rc = (fwrite(text, 1, len, f) == len && fputc('\n', f) != EOF) ? 0 : -1;
    if (fclose(f) != 0) rc = -1;
  }
  free(text);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* output relay                                                              */

typedef struct mlxd_relay {
  int fd;      /* read end of the child's pipe, -1 when closed */
  int out_fd;  /* 1 or 2 */
  char* buf;
  size_t len, cap;
} mlxd_relay;

static void mlxd_write_all(int fd, const struct iovec* iov_in, int n) {
  struct iovec iov[3];
  memcpy(iov, iov_in, (size_t)n * sizeof *iov);
  int i = 0;
  while (i < n) {
    ssize_t w = writev(fd, iov + i, n - i);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        poll(&p, 1, 1000);
        continue;
      }
      return; /* EPIPE etc.: the reader went away; drop the output */
    }
    size_t left = (size_t)w;
    while (i < n && left >= iov[i].iov_len) {
      left -= iov[i].iov_len;
      i++;
    }
    if (i < n) {
      iov[i].iov_base = (char*)iov[i].iov_base + left;
      iov[i].iov_len -= left;
    }
  }
}

static void mlxd_emit_line(const char* prefix, int out_fd, const char* line, size_t len,
                           bool add_newline) {
  struct iovec iov[3];
  int n = 0;
  if (prefix && *prefix) iov[n++] = (struct iovec){(void*)prefix, strlen(prefix)};
  iov[n++] = (struct iovec){(void*)line, len};
  if (add_newline) iov[n++] = (struct iovec){(void*)"\n", 1};
  mlxd_write_all(out_fd, iov, n);
}

/* Print every complete line in r->buf (and everything when flush_all). */
static void mlxd_relay_lines(mlxd_relay* r, const char* prefix, bool flush_all) {
  size_t start = 0;
  for (;;) {
    char* nl = memchr(r->buf + start, '\n', r->len - start);
    if (!nl) break;
    size_t end = (size_t)(nl - r->buf) + 1;
    mlxd_emit_line(prefix, r->out_fd, r->buf + start, end - start, false);
    start = end;
  }
  if (r->len - start >= MLXD_MAX_LINE || (flush_all && r->len > start)) {
    mlxd_emit_line(prefix, r->out_fd, r->buf + start, r->len - start, true);
    start = r->len;
  }
  memmove(r->buf, r->buf + start, r->len - start);
  r->len -= start;
}

/* Read what is available; returns false at end of file (the relay is closed). */
static bool mlxd_relay_read(mlxd_relay* r, const char* prefix) {
  if (r->cap - r->len < 16384) {
    size_t nc = r->cap ? r->cap * 2 : 32768;
    char* nb = realloc(r->buf, nc);
    if (!nb) {
      mlxd_relay_lines(r, prefix, true);
      return true;
    }
    r->buf = nb;
    r->cap = nc;
  }
  ssize_t got = read(r->fd, r->buf + r->len, r->cap - r->len);
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (got <= 0) {
    mlxd_relay_lines(r, prefix, true);
    close(r->fd);
    r->fd = -1;
    return false;
  }
  r->len += (size_t)got;
  mlxd_relay_lines(r, prefix, false);
  return true;
}

/* ------------------------------------------------------------------------ */
/* supervision                                                               */

typedef struct mlxd_child {
  pid_t pid;
  bool alive;
  char prefix[24];
  mlxd_relay out, err;
} mlxd_child;

typedef struct mlxd_run {
  mlxd_child* kids;
  int n;
  int alive;
  int first_fail_rank;  /* -1: none yet */
  int first_fail_code;
  bool stopping;        /* SIGTERM sent */
  bool killed;          /* SIGKILL sent */
  double kill_at;
  int interrupted;      /* signal forwarded from the user, 0 if none */
  bool timed_out;
} mlxd_run;

static void mlxd_signal_all(mlxd_run* run, int sig) {
  for (int i = 0; i < run->n; i++) {
    pid_t pid = run->kids[i].pid;
    if (pid <= 0) continue;
    /* Each rank leads its own process group: reach its children too. A dead
     * rank's group may still hold orphans; its id cannot be reused meanwhile. */
    if (kill(-pid, sig) != 0 && run->kids[i].alive) kill(pid, sig);
  }
}

static void mlxd_begin_stop(mlxd_run* run) {
  if (run->stopping) return;
  run->stopping = true;
  run->kill_at = mlxd_launch_now() + MLXD_GRACE_S;
  mlxd_signal_all(run, SIGTERM);
}

static void mlxd_reap(mlxd_run* run, bool name_ranks) {
  for (;;) {
    int st = 0;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid <= 0) return;
    for (int i = 0; i < run->n; i++) {
      mlxd_child* c = &run->kids[i];
      if (c->pid != pid || !c->alive) continue;
      c->alive = false;
      run->alive--;
      int code = 0;
      char how[96];
      if (WIFEXITED(st)) {
        code = WEXITSTATUS(st);
        snprintf(how, sizeof how, "exited with status %d", code);
      } else if (WIFSIGNALED(st)) {
        code = 128 + WTERMSIG(st);
        snprintf(how, sizeof how, "was killed by signal %d (%s)", WTERMSIG(st),
                 strsignal(WTERMSIG(st)));
      }
      if (code != 0 && run->first_fail_rank < 0 && !run->stopping) {
        run->first_fail_rank = i;
        run->first_fail_code = code;
        if (name_ranks) {
          if (run->alive > 0)
            mlxd_msg("rank %d %s; stopping the other %d rank%s.", i, how, run->alive,
                     run->alive == 1 ? "" : "s");
          else
            mlxd_msg("rank %d %s.", i, how);
        }
        mlxd_begin_stop(run);
      } else if (code != 0 && run->first_fail_rank < 0) {
        /* a rank stopped by us (timeout or forwarded signal) */
        run->first_fail_rank = i;
        run->first_fail_code = code;
      }
    }
  }
}

/* Run the children to completion and return the launcher's exit status. */
static int mlxd_supervise(mlxd_run* run, int sfd, double timeout, bool name_ranks) {
  double start = mlxd_launch_now();
  double deadline = timeout > 0 ? start + timeout : 0;
  double drain_until = 0;
  int nfds = 1 + 2 * run->n;
  struct pollfd* pfd = calloc((size_t)nfds, sizeof *pfd);
  mlxd_relay** who = calloc((size_t)nfds, sizeof *who);
  mlxd_child** owner = calloc((size_t)nfds, sizeof *owner);
  if (!pfd || !who || !owner) {
    mlxd_msg("out of memory while supervising the ranks; killing them.");
    mlxd_signal_all(run, SIGKILL);
    while (wait(NULL) > 0 || errno == EINTR) {
    }
    free(pfd);
    free(who);
    free(owner);
    return 1;
  }
  for (;;) {
    int open = 0;
    for (int i = 0; i < run->n; i++)
      open += (run->kids[i].out.fd >= 0) + (run->kids[i].err.fd >= 0);
    double now = mlxd_launch_now();
    if (run->alive == 0) {
      if (open == 0) break;
      /* An orphaned grandchild may hold a pipe open: do not wait for it long. */
      if (drain_until == 0) drain_until = now + MLXD_DRAIN_S;
      if (now >= drain_until) break;
    }
    if (deadline > 0 && !run->timed_out && now >= deadline && run->alive > 0) {
      run->timed_out = true;
      mlxd_msg("timeout: the ranks ran longer than the %g s limit (--timeout or "
               "MLXDIST_LAUNCH_TIMEOUT); killing %d rank%s.",
               timeout, run->alive, run->alive == 1 ? "" : "s");
      mlxd_begin_stop(run);
    }
    if (run->stopping && !run->killed && now >= run->kill_at && run->alive > 0) {
      run->killed = true;
      if (name_ranks)
        mlxd_msg("%d rank%s still running %.0f s after SIGTERM; sending SIGKILL.", run->alive,
                 run->alive == 1 ? "" : "s", MLXD_GRACE_S);
      mlxd_signal_all(run, SIGKILL);
    }
    double wake = -1;
    if (deadline > 0 && !run->timed_out && run->alive > 0) wake = deadline;
    if (run->stopping && !run->killed && run->alive > 0 && (wake < 0 || run->kill_at < wake))
      wake = run->kill_at;
    if (drain_until > 0 && (wake < 0 || drain_until < wake)) wake = drain_until;
    int ms = -1;
    if (wake >= 0) {
      double left = (wake - now) * 1000.0;
      ms = left <= 0 ? 0 : (left > 1e9 ? 1000000000 : (int)left + 1);
    }
    int k = 0;
    pfd[k++] = (struct pollfd){.fd = sfd, .events = POLLIN};
    for (int i = 0; i < run->n; i++) {
      mlxd_relay* rs[2] = {&run->kids[i].out, &run->kids[i].err};
      for (int j = 0; j < 2; j++) {
        if (rs[j]->fd < 0) continue;
        who[k] = rs[j];
        owner[k] = &run->kids[i];
        pfd[k++] = (struct pollfd){.fd = rs[j]->fd, .events = POLLIN};
      }
    }
    int pr = poll(pfd, (nfds_t)k, ms);
    if (pr < 0 && errno != EINTR) {
      mlxd_msg("poll failed: %s; killing the ranks.", strerror(errno));
      mlxd_signal_all(run, SIGKILL);
      break;
    }
    if (pr <= 0) continue;
    for (int i = 1; i < k; i++)
      if (pfd[i].revents) mlxd_relay_read(who[i], owner[i]->prefix);
    if (pfd[0].revents & POLLIN) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD) continue;
        if (run->alive > 0) {
          if (run->interrupted) {
            run->killed = true;
            mlxd_signal_all(run, SIGKILL);
          } else {
            run->interrupted = sig;
            if (name_ranks) mlxd_msg("received %s; forwarding it to the ranks.", strsignal(sig));
            mlxd_signal_all(run, sig);
            run->stopping = true;
            run->kill_at = mlxd_launch_now() + MLXD_GRACE_S;
          }
        }
      }
      mlxd_reap(run, name_ranks);
    }
  }
  /* Make sure nothing is left running, then reap everything. */
  if (run->alive > 0) mlxd_signal_all(run, SIGKILL);
  while (run->alive > 0) {
    int st;
    pid_t pid = waitpid(-1, &st, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < run->n; i++)
      if (run->kids[i].pid == pid && run->kids[i].alive) {
        run->kids[i].alive = false;
        run->alive--;
      }
  }
  for (int i = 0; i < run->n; i++) {
    mlxd_relay* rs[2] = {&run->kids[i].out, &run->kids[i].err};
    for (int j = 0; j < 2; j++) {
      if (rs[j]->fd >= 0) {
        mlxd_relay_lines(rs[j], run->kids[i].prefix, true);
        close(rs[j]->fd);
        rs[j]->fd = -1;
      }
      free(rs[j]->buf);
      rs[j]->buf = NULL;
    }
  }
  free(pfd);
  free(who);
  free(owner);
  if (run->timed_out) return 124;
  if (run->first_fail_rank >= 0) return run->first_fail_code;
  if (run->interrupted) return 128 + run->interrupted;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* starting the children                                                     */

typedef struct mlxd_spawn {
  char** argv;
  const char** set_env;  /* "K=V" strings, applied in order */
  int n_env;
} mlxd_spawn;

static sigset_t mlxd_old_mask;

static pid_t mlxd_start_child(const mlxd_spawn* sp, mlxd_child* c, int rank) {
  int po[2], pe[2];
  if (pipe2(po, O_CLOEXEC) != 0) return -1;
  if (pipe2(pe, O_CLOEXEC) != 0) {
    close(po[0]);
    close(po[1]);
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    close(po[0]);
    close(po[1]);
    close(pe[0]);
    close(pe[1]);
    return -1;
  }
  if (pid == 0) {
    setpgid(0, 0);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigprocmask(SIG_SETMASK, &mlxd_old_mask, NULL);
    if (dup2(po[1], 1) < 0 || dup2(pe[1], 2) < 0) _exit(127);
    for (int i = 0; i < sp->n_env; i++) {
      const char* kv = sp->set_env[i];
      const char* eq = strchr(kv, '=');
      char name[256];
      size_t nl = (size_t)(eq - kv);
      if (nl >= sizeof name) continue;
      memcpy(name, kv, nl);
      name[nl] = '\0';
      setenv(name, eq + 1, 1);
    }
    execvp(sp->argv[0], sp->argv);
    int e = errno;
    dprintf(2, "[launch] rank %d: cannot run '%s': %s.\n", rank, sp->argv[0], strerror(e));
    _exit(e == ENOENT ? 127 : 126);
  }
  setpgid(pid, pid); /* also in the parent, so a signal right away reaches the group */
  close(po[1]);
  close(pe[1]);
  fcntl(po[0], F_SETFL, fcntl(po[0], F_GETFL) | O_NONBLOCK);
  fcntl(pe[0], F_SETFL, fcntl(pe[0], F_GETFL) | O_NONBLOCK);
  c->pid = pid;
  c->alive = true;
  c->out = (mlxd_relay){.fd = po[0], .out_fd = 1};
  c->err = (mlxd_relay){.fd = pe[0], .out_fd = 2};
  return pid;
}

static int mlxd_setup_signals(void) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  if (sigprocmask(SIG_BLOCK, &set, &mlxd_old_mask) != 0) return -1;
  signal(SIGPIPE, SIG_IGN);
  return signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

static char mlxd_tmpdir[PATH_MAX - 64];
static char mlxd_tmpfile[PATH_MAX];

static void mlxd_cleanup_tmp(void) {
  if (mlxd_tmpfile[0]) unlink(mlxd_tmpfile);
  if (mlxd_tmpdir[0]) rmdir(mlxd_tmpdir);
  mlxd_tmpfile[0] = mlxd_tmpdir[0] = '\0';
}

/* ------------------------------------------------------------------------ */
/* mpi                                                                       */

typedef enum { MLXD_MPI_NONE, MLXD_MPI_OPENMPI, MLXD_MPI_MPICH, MLXD_MPI_OTHER } mlxd_mpi_kind;

static mlxd_mpi_kind mlxd_detect_mpi(void) {
  FILE* p = popen("mpirun --version 2>&1", "r");
  if (!p) return MLXD_MPI_NONE;
  char line[512];
  bool ompi = false, mpich = false, any = false;
  while (fgets(line, sizeof line, p)) {
    any = true;
    if (strstr(line, "Open MPI") || strstr(line, "OpenRTE") || strstr(line, "Open RTE"))
      ompi = true;
    if (strstr(line, "HYDRA") || strstr(line, "MPICH") || strstr(line, "Intel(R) MPI"))
      mpich = true;
  }
  int st = pclose(p);
  if (!any || (WIFEXITED(st) && WEXITSTATUS(st) == 127)) return MLXD_MPI_NONE;
  if (ompi) return MLXD_MPI_OPENMPI;
  if (mpich) return MLXD_MPI_MPICH;
  return MLXD_MPI_OTHER;
}

static char** mlxd_mpi_argv(const mlxd_opts* o, mlxd_mpi_kind kind) {
  int nprog = 0;
  while (o->program[nprog]) nprog++;
  size_t cap = (size_t)(16 + 3 * o->n_envs + nprog);
  char** av = calloc(cap, sizeof *av);
  if (!av) return NULL;
  static char np[16];
  snprintf(np, sizeof np, "%d", o->n);
  int k = 0;
  av[k++] = "mpirun";
  av[k++] = "-np";
  av[k++] = np;
  if (kind == MLXD_MPI_OPENMPI) {
    av[k++] = "--oversubscribe";
    if (geteuid() == 0) av[k++] = "--allow-run-as-root";
    av[k++] = "--tag-output";
    for (int i = 0; i < o->n_envs; i++) {
      av[k++] = "-x";
      av[k++] = (char*)o->envs[i];
    }
  } else {
    if (kind == MLXD_MPI_MPICH) av[k++] = "-prepend-rank";
    for (int i = 0; i < o->n_envs; i++) {
      const char* eq = strchr(o->envs[i], '=');
      av[k++] = "-genv";
      av[k++] = strndup(o->envs[i], (size_t)(eq - o->envs[i]));
      av[k++] = (char*)(eq + 1);
    }
  }
  for (int i = 0; i < nprog; i++) av[k++] = o->program[i];
  av[k] = NULL;
  return av;
}

/* ------------------------------------------------------------------------ */

int main(int argc, char** argv) {
  mlxd_opts o;
  mlxd_parse_args(argc, argv, &o);

  int sfd = mlxd_setup_signals();
  if (sfd < 0) {
    mlxd_msg("cannot set up signal handling: %s.", strerror(errno));
    return 1;
  }

  if (o.mpi) {
    mlxd_mpi_kind kind = mlxd_detect_mpi();
    if (kind == MLXD_MPI_NONE) {
      mlxd_msg("--backend mpi needs 'mpirun' on PATH, but 'mpirun --version' could not run.");
      return 127;
    }
    char** av = mlxd_mpi_argv(&o, kind);
    if (!av) {
      mlxd_msg("out of memory");
      return 1;
    }
    if (o.verbose) {
      fputs("[launch] running:", stderr);
      for (int i = 0; av[i]; i++) fprintf(stderr, " %s", av[i]);
      fputc('\n', stderr);
    }
    mlxd_child kid;
    memset(&kid, 0, sizeof kid);
    mlxd_spawn sp = {.argv = av, .set_env = NULL, .n_env = 0};
    fflush(NULL);
    if (mlxd_start_child(&sp, &kid, 0) < 0) {
      mlxd_msg("cannot start mpirun: %s.", strerror(errno));
      return 1;
    }
    mlxd_run run = {.kids = &kid, .n = 1, .alive = 1, .first_fail_rank = -1};
    int rc = mlxd_supervise(&run, sfd, o.timeout, false);
    free(av);
    return rc;
  }

  /* ring */
  int n = o.n, k = o.connections ? o.connections : 1;
  char hostfile_path[PATH_MAX];
  int* fds = NULL;
  int n_sock = 0;
  if (o.hostfile) {
    int fn = mlxd_check_hostfile(o.hostfile, o.connections);
    if (o.n && o.n != fn)
      mlxd_bad_usage("-n %d does not match hostfile '%s', which lists %d ranks.", o.n,
                     o.hostfile, fn);
    n = fn;
    if (!realpath(o.hostfile, hostfile_path))
      snprintf(hostfile_path, sizeof hostfile_path, "%s", o.hostfile);
  } else {
    const char* tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > sizeof mlxd_tmpdir - 32) tmp = "/tmp";
    snprintf(mlxd_tmpdir, sizeof mlxd_tmpdir, "%s/mlxdist-launch.XXXXXX", tmp);
    if (!mkdtemp(mlxd_tmpdir)) {
      mlxd_msg("cannot create a temporary directory under '%s': %s.", tmp, strerror(errno));
      return 1;
    }
    atexit(mlxd_cleanup_tmp);
    snprintf(mlxd_tmpfile, sizeof mlxd_tmpfile, "%s/hostfile.json", mlxd_tmpdir);
    snprintf(hostfile_path, sizeof hostfile_path, "%s", mlxd_tmpfile);
    n_sock = n * k;
    fds = calloc((size_t)n_sock, sizeof *fds);
    int* ports = calloc((size_t)n_sock, sizeof *ports);
    if (!fds || !ports) {
      mlxd_msg("out of memory");
      return 1;
    }
    if (mlxd_reserve_ports(n_sock, fds, ports) != 0) {
      mlxd_msg("cannot reserve %d free TCP ports on 127.0.0.1: %s.", n_sock, strerror(errno));
      return 1;
    }
    if (mlxd_write_hostfile(hostfile_path, n, k, ports) != 0) {
      mlxd_msg("cannot write the hostfile '%s': %s.", hostfile_path, strerror(errno));
      return 1;
    }
    free(ports);
  }
  if (o.verbose) {
    mlxd_msg("starting %d rank%s of '%s' with MLX_HOSTFILE=%s", n, n == 1 ? "" : "s",
             o.program[0], hostfile_path);
    char* text = mlxd_read_file(hostfile_path, NULL);
    if (text) {
      fprintf(stderr, "%s", text);
      free(text);
    }
  }

  /* Environment for every rank: fixed variables first, then --env (which may override). */
  int n_env = 4 + o.n_envs;
  const char** env = calloc((size_t)n_env, sizeof *env);
  char* hf_kv = malloc(strlen(hostfile_path) + 16);
  char ws_kv[32], rank_kv[32];
  if (!env || !hf_kv) {
    mlxd_msg("out of memory");
    return 1;
  }
  sprintf(hf_kv, "MLX_HOSTFILE=%s", hostfile_path);
  snprintf(ws_kv, sizeof ws_kv, "MLX_WORLD_SIZE=%d", n);
  int e = 0;
  env[e++] = rank_kv;
  env[e++] = hf_kv;
  env[e++] = ws_kv;
  if (o.verbose) env[e++] = "MLX_RING_VERBOSE=1";
  for (int i = 0; i < o.n_envs; i++) env[e++] = o.envs[i];

  mlxd_child* kids = calloc((size_t)n, sizeof *kids);
  if (!kids) {
    mlxd_msg("out of memory");
    return 1;
  }
  mlxd_run run = {.kids = kids, .n = n, .alive = 0, .first_fail_rank = -1};
  mlxd_spawn sp = {.argv = o.program, .set_env = env, .n_env = e};
  /* Release the reserved ports just before the ranks start, so they can bind them. */
  for (int i = 0; i < n_sock; i++) close(fds[i]);
  free(fds);
  fflush(NULL);
  for (int r = 0; r < n; r++) {
    snprintf(rank_kv, sizeof rank_kv, "MLX_RANK=%d", r);
    snprintf(kids[r].prefix, sizeof kids[r].prefix, "[%d] ", r);
    if (mlxd_start_child(&sp, &kids[r], r) < 0) {
      mlxd_msg("cannot start rank %d: %s; stopping the others.", r, strerror(errno));
      run.n = r;
      mlxd_signal_all(&run, SIGKILL);
      mlxd_supervise(&run, sfd, 0, false);
      return 1;
    }
    run.alive++;
  }
  int rc = mlxd_supervise(&run, sfd, o.timeout, true);
  free(kids);
  free(env);
  free(hf_kv);
  free(o.envs);
  close(sfd);
  return rc;
}

/* mlxdist-launch: the command line, the help text and the refusal of bad usage. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"
#include "util/tunables.h"

static void usage(FILE* f) {
  fprintf(
      f,
      "Usage: mlxdist-launch -n N [options] [--] PROGRAM [ARGS...]\n"
      "       mlxdist-launch --hosts H1,H2,... [-n K] [options] [--] PROGRAM [ARGS...]\n"
      "\n"
      "Start N ranks of PROGRAM on this host, or K ranks on each host (over ssh), and\n"
      "supervise them.\n"
      "\n"
      "Options:\n"
      "  -n, --np N            number of ranks (1..%d); with --hostfile, taken from the file;\n"
      "                        with --hosts or a hostfile of hosts: ranks per host (default 1)\n"
      "  --hosts H1,H2,...     hosts (ssh names or addresses), rank order host-major;\n"
      "                        localhost, 127.0.0.1 and ::1 are started without ssh\n"
      "  --backend B           ring (default): local TCP ring, hostfile in MLX's format;\n"
      "                        mpi: run the ranks with mpirun; jaccl, jaccl-ring: MLX's\n"
      "                        RDMA backend (one rank per host, the device matrix from\n"
      "                        the hostfile's \"rdma\" lists or --ibv-devices; docs/jaccl.md)\n"
      "  --ibv-devices F       jaccl on this host: the device matrix file (MLX_IBV_DEVICES);\n"
      "                        -n defaults to its number of rows\n"
      "  --coordinator-port P  jaccl: rank 0's side channel listens on port P of the first\n"
      "                        host (default: a port found free there, never guessed)\n"
      "  --connections K       ring: TCP connections per rank (1..%d, default 1)\n"
      "  --hostfile F          ring: use the JSON hostfile F as is (a list with one list\n"
      "                        of \"ip:port\" strings per rank); N is its number of lists;\n"
      "                        checked as the ranks check it (docs/ring.md); or hosts:\n"
      "                        MLX's [{\"ssh\": \"h1\", \"ips\": [\"10.0.0.1\"]}, ...], its\n"
      "                        {\"backend\": .., \"envs\": [..], \"hosts\": [..]}, or lines\n"
      "                        \"host[:slots]\" (docs/launch.md)\n"
      "  --ssh CMD             the ssh command, split into words (default: ssh); BatchMode,\n"
      "                        ConnectTimeout and ServerAlive options are added\n"
      "  --cwd DIR             directory the remote ranks run in (default: this one)\n"
      "  --ifname NAME         ranks listen on this interface's address (MLXDIST_IFNAME)\n"
      "                        where the hostfile gives no \"ips\"\n"
      "  --port-range A-B      ranks and the rendezvous listen on ports A..B only\n"
      "  --connect-timeout S   ssh connect bound; the ranks must reach the rendezvous\n"
      "                        within %.0f times S (default %.0f)\n"
      "  --env K=V             set K=V in every rank's environment (repeatable); an\n"
      "                        MLXDIST_* value is checked as the ranks would check it\n"
      "  --verbose             print what is launched; ring: set MLX_RING_VERBOSE=1\n"
      "  --timeout S           kill all ranks after S seconds and exit 124 (default: none;\n"
      "                        also read from MLXDIST_LAUNCH_TIMEOUT; 0 means none)\n"
      "  --secret              ring: a fresh secret for this job in a private file, passed\n"
      "                        as MLXDIST_SECRET_FILE; every connection proves it\n"
      "  -h, --help            print this help\n"
      "\n"
      "ring: each rank gets MLX_RANK, MLX_WORLD_SIZE, MLX_HOSTFILE and a random\n"
      "MLXDIST_JOB_TOKEN for this job (its connections refuse any other job's). Every complete\n"
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
      LAUNCH_MAX_RANKS, LAUNCH_MAX_CONNECTIONS, LAUNCH_RDV_FACTOR, LAUNCH_CONNECT_TIMEOUT_S,
      LAUNCH_GRACE_S);
}

void launch_bad_usage(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  launch_vmsg(fmt, ap);
  va_end(ap);
  fputs("Run 'mlxdist-launch --help' for usage.\n", stderr);
  exit(2);
}

/* An option's integer: decimal digits only (no sign, blanks, hex or suffix), in [lo, hi]. */
static long parse_long(const char* what, const char* s, long lo, long hi) {
  size_t nd = strspn(s, "0123456789");
  long v = -1;
  if (nd > 0 && nd <= 9 && s[nd] == '\0') v = strtol(s, NULL, 10);
  if (v < lo || v > hi)
    launch_bad_usage("%s must be an integer from %ld to %ld, got '%s'.", what, lo, hi, s);
  return v;
}

/* --timeout and MLXDIST_LAUNCH_TIMEOUT: checked by the tunable's own rule
 * (src/util/tunables.h), so both accept the same values. */
static double parse_seconds(const char* what, const char* s) {
  double v = 0;
  char why[400], exp[256];
  if (mlxd_tunable_parse(MLXD_T_LAUNCH_TIMEOUT, s, &v, why, sizeof why) != 0)
    launch_bad_usage("%s must be %s (0: no limit), got '%s'.", what,
                     mlxd_tunable_expected(MLXD_T_LAUNCH_TIMEOUT, exp, sizeof exp), s);
  return v;
}

/* --connect-timeout: seconds, > 0 and at most a day. */
static double parse_positive(const char* what, const char* s) {
  char* end = NULL;
  double v = strtod(s, &end);
  if (!*s || *end || !(v > 0 && v <= 86400))
    launch_bad_usage("%s must be a number of seconds above 0 and at most 86400, got '%s'.", what,
                     s);
  return v;
}

/* --port-range A-B: 1 <= A <= B <= 65535. */
static void check_port_range(const char* s) {
  unsigned a = 0, b = 0;
  int used = 0;
  if (sscanf(s, "%5u-%5u%n", &a, &b, &used) != 2 || s[used] || !isdigit((unsigned char)s[0]) ||
      a < 1 || b > 65535 || a > b)
    launch_bad_usage("--port-range must be A-B with 1 <= A <= B <= 65535, got '%s'.", s);
}

/* --ifname: a Linux interface name (1..15 bytes, no '/', blank or ':'). */
static void check_ifname(const char* s) {
  size_t n = strlen(s);
  bool ok = n >= 1 && n <= 15;
  for (size_t i = 0; ok && i < n; i++)
    ok = isgraph((unsigned char)s[i]) && s[i] != '/' && s[i] != ':';
  if (!ok)
    launch_bad_usage("--ifname must be a network interface name (1..15 characters), got '%s'.", s);
}

static bool valid_env_name(const char* s, size_t n) {
  if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return false;
  for (size_t i = 1; i < n; i++)
    if (!(isalnum((unsigned char)s[i]) || s[i] == '_')) return false;
  return true;
}

/* Match argv[*i] against a long option "--name" (also "--name=value") or a
 * short one "-c" (also "-cvalue"); on a match return its value and advance *i. */
static const char* opt_value(int argc, char** argv, int* i, const char* lng, const char* shrt,
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
  if (*i + 1 >= argc) launch_bad_usage("option %s needs a value.", lng);
  (*i)++;
  return argv[*i];
}

/* One option that takes a value, at argv[*i]; false if it is none of them. */
static bool parse_valued(int argc, char** argv, int* i, launch_opts* o, bool* have_timeout) {
  bool m = false;
  const char* v;
  if ((v = opt_value(argc, argv, i, "--np", "-n", &m)) || m) {
    o->n = (int)parse_long("-n (the number of ranks)", v, 1, LAUNCH_MAX_RANKS);
  } else if ((v = opt_value(argc, argv, i, "--backend", NULL, &m)) || m) {
    if (strcmp(v, "ring") != 0 && strcmp(v, "mpi") != 0 && strcmp(v, "jaccl") != 0 &&
        strcmp(v, "jaccl-ring") != 0)
      launch_bad_usage("--backend must be 'ring', 'mpi', 'jaccl' or 'jaccl-ring', got '%s'.", v);
    o->mpi = strcmp(v, "mpi") == 0;
    o->jaccl = strncmp(v, "jaccl", 5) == 0;
    o->jaccl_ring = strcmp(v, "jaccl-ring") == 0;
    o->backend_given = true;
  } else if ((v = opt_value(argc, argv, i, "--ibv-devices", NULL, &m)) || m) {
    if (!*v) launch_bad_usage("--ibv-devices needs a file name, got an empty string.");
    o->ibv_devices = v;
  } else if ((v = opt_value(argc, argv, i, "--coordinator-port", NULL, &m)) || m) {
    o->coord_port = (int)parse_long("--coordinator-port", v, 1, 65535);
  } else if ((v = opt_value(argc, argv, i, "--connections", NULL, &m)) || m) {
    o->connections = (int)parse_long("--connections", v, 1, LAUNCH_MAX_CONNECTIONS);
  } else if ((v = opt_value(argc, argv, i, "--hostfile", NULL, &m)) || m) {
    if (!*v) launch_bad_usage("--hostfile needs a file name, got an empty string.");
    o->hostfile = v;
  } else if ((v = opt_value(argc, argv, i, "--env", NULL, &m)) || m) {
    const char* eq = strchr(v, '=');
    if (!eq || !valid_env_name(v, (size_t)(eq - v)))
      launch_bad_usage(
          "--env expects NAME=VALUE with NAME made of letters, digits and '_', "
          "got '%s'.",
          v);
    /* an MLXDIST_* value the ranks would refuse at init is refused here, before they start */
    int t = mlxd_tunable_find(v, (size_t)(eq - v));
    char why[400];
    if (t >= 0 && eq[1] && mlxd_tunable_parse((mlxd_tunable)t, eq + 1, NULL, why, sizeof why) != 0)
      launch_bad_usage("--env %s: %s.", v, why);
    o->envs[o->n_envs++] = v;
  } else if ((v = opt_value(argc, argv, i, "--hosts", NULL, &m)) || m) {
    if (!*v) launch_bad_usage("--hosts needs a list of hosts, got an empty string.");
    o->hosts = v;
  } else if ((v = opt_value(argc, argv, i, "--ssh", NULL, &m)) || m) {
    char why[300];
    char** w = launch_split_words(v, why, sizeof why);
    if (!w) launch_bad_usage("%s.", why);
    launch_argv_free(w);
    o->ssh = v;
  } else if ((v = opt_value(argc, argv, i, "--cwd", NULL, &m)) || m) {
    if (!*v) launch_bad_usage("--cwd needs a directory, got an empty string.");
    o->cwd = v;
  } else if ((v = opt_value(argc, argv, i, "--ifname", NULL, &m)) || m) {
    check_ifname(v);
    o->ifname = v;
  } else if ((v = opt_value(argc, argv, i, "--port-range", NULL, &m)) || m) {
    check_port_range(v);
    o->port_range = v;
  } else if ((v = opt_value(argc, argv, i, "--connect-timeout", NULL, &m)) || m) {
    o->connect_timeout = parse_positive("--connect-timeout", v);
  } else if ((v = opt_value(argc, argv, i, "--timeout", NULL, &m)) || m) {
    o->timeout = parse_seconds("--timeout", v);
    *have_timeout = true;
  }
  return m;
}

/* What no single option can say: defaults from the environment, options that
 * do not go together, and what is missing. */
static void check_combination(launch_opts* o, bool have_timeout) {
  if (!have_timeout) {
    const char* e = getenv("MLXDIST_LAUNCH_TIMEOUT");
    if (e && *e) o->timeout = parse_seconds("MLXDIST_LAUNCH_TIMEOUT", e);
  }
  if (o->hosts && o->hostfile)
    launch_bad_usage("--hosts and --hostfile both name the hosts; give one of them.");
  if (o->hosts && o->connections)
    launch_bad_usage("--connections applies to a job on this host only (a hostfile of ranks).");
  if (o->mpi) {
    if (o->connections) launch_bad_usage("--connections applies to the ring backend only.");
    if (o->secret) launch_bad_usage("--secret applies to the ring backend only.");
  }
  if (o->jaccl && o->connections)
    launch_bad_usage(
        "--connections applies to the ring backend only (jaccl's wires are the "
        "device matrix's).");
  if (!o->jaccl && (o->ibv_devices || o->coord_port))
    launch_bad_usage("%s applies to --backend jaccl or jaccl-ring only.",
                     o->ibv_devices ? "--ibv-devices" : "--coordinator-port");
  if (o->ibv_devices && o->hostfile)
    launch_bad_usage(
        "--ibv-devices and a hostfile's \"rdma\" lists both give the device "
        "matrix; give one of them.");
  if (!o->hostfile && !o->hosts && o->n == 0 && !o->jaccl)
    launch_bad_usage("the number of ranks is missing: give -n N (or --hosts or --hostfile F).");
}

void launch_parse_args(int argc, char** argv, launch_opts* o) {
  memset(o, 0, sizeof *o);
  o->connect_timeout = LAUNCH_CONNECT_TIMEOUT_S;
  o->envs = calloc((size_t)argc, sizeof *o->envs);
  if (!o->envs) {
    launch_msg("out of memory");
    exit(1);
  }
  bool have_timeout = false;
  int i = 1;
  for (; i < argc; i++) {
    const char* a = argv[i];
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (a[0] != '-' || a[1] == '\0') break; /* the program */
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      exit(0);
    }
    if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0)
      o->verbose = true;
    else if (strcmp(a, "--secret") == 0)
      o->secret = true;
    else if (!parse_valued(argc, argv, &i, o, &have_timeout))
      launch_bad_usage("unknown option '%s'.", a);
  }
  if (i >= argc)
    launch_bad_usage("no program to launch was given (expected '-- PROGRAM ARGS...').");
  o->program = argv + i;
  check_combination(o, have_timeout);
}

void launch_free_args(launch_opts* o) {
  free(o->envs);
  o->envs = NULL;
}

/* mlxdist-launch, shared between its parts:
 *   args.c      the command line (options, usage, the "[launch]" messages)
 *   hostfile.c  the ring hostfile: a user's, checked with the ranks' own parser,
 *               or one written on free local ports
 *   hostfile_check.c  the launcher's checks of a user's hostfile (pure, fuzzed)
 *   mpi.c       the mpirun command line for --backend mpi
 *   relay.c     a child's output, line by line, with the "[rank] " prefix
 *   spawn.c     making a child's process: the open-file limit, the signals the
 *               launcher blocks, the environment (MLX_RANK, the gate), posix_spawn
 *   supervise.c starting the children with their pipes relayed, stopping them all on
 *               the first failure,
 *               --timeout, forwarded signals and the exit status
 *   watch.c     what the supervisor knows of each rank: its records (the table),
 *               its first error line (the failure summary), /proc (stopped?)
 *   main.c      the outline, the job's token (MLXDIST_JOB_TOKEN) and --secret's
 *               per-job secret file (docs/security.md).
 *   hosts.c     the hosts of a job across machines: --hosts, and the hostfile
 *               forms of MLX's launcher and host:slots (pure, fuzzed)
 *   remote.c    a remote rank: the ssh command line and the POSIX sh script
 *               it runs on the host (pure)
 *   across.c    a job across hosts: addresses, the rendezvous, the ranks'
 *               command lines and environment
 *   rendezvous.c the launcher as the job's all-gather (MLXDIST_RENDEZVOUS): ranks
 *               started across hosts post their addresses to it.
 *   jaccl.c     --backend jaccl|jaccl-ring: the device matrix (a hostfile's "rdma"
 *               lists or --ibv-devices), its private file, the coordinator. */
#ifndef MLXD_LAUNCH_H
#define MLXD_LAUNCH_H

#include <limits.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The most ranks of a job: what the hostfile and the rendezvous records can
 * name (MLXD_NET_HOSTFILE_MAX_RANKS, MLXD_RDV_MAX_RANKS). What stops a job
 * before that is the host's: launch_nofile and launch_procs check its limits
 * before anything starts; memory is the job's own (docs/scale.md). */
#define LAUNCH_MAX_RANKS 65536
#define LAUNCH_MAX_CONNECTIONS 64
#define LAUNCH_GRACE_S 3.0    /* SIGTERM to SIGKILL */
#define LAUNCH_DRAIN_S 1.0    /* how long output of orphans is read after the ranks are gone */
#define LAUNCH_MAX_LINE 65536 /* a longer line is printed in pieces */
#define LAUNCH_CONNECT_TIMEOUT_S 10.0 /* --connect-timeout's default */
#define LAUNCH_STARTED_LINE "\001mlxdist-launch: remote rank started\n" /* remote.c -> stderr */
#define LAUNCH_RDV_FACTOR 3.0     /* the rendezvous waits this many connect timeouts */
#define LAUNCH_ALIVE_INTERVAL_S 5 /* ssh ServerAliveInterval ... */
#define LAUNCH_ALIVE_COUNT 3      /* ... and ServerAliveCountMax: a dead link in 15 s */

/* ---- args.c ---- */

typedef struct launch_opts {
  int n; /* 0: not given */
  bool mpi;
  int connections; /* 0: not given */
  const char* hostfile;
  const char** envs; /* "K=V" from --env, in order */
  int n_envs;
  bool verbose;
  double timeout; /* 0: none */
  bool secret;    /* --secret: a per-job secret file for the ranks (MLXDIST_SECRET_FILE) */
  bool backend_given;
  const char* hosts;       /* --hosts h1,h2,... */
  const char* ssh;         /* --ssh CMD (default "ssh") */
  const char* cwd;         /* --cwd DIR (default: the launcher's) */
  const char* ifname;      /* --ifname NAME */
  const char* port_range;  /* --port-range A-B */
  double connect_timeout;  /* --connect-timeout S (default LAUNCH_CONNECT_TIMEOUT_S) */
  bool jaccl;              /* --backend jaccl or jaccl-ring */
  bool jaccl_ring;         /* --backend jaccl-ring: MLX_JACCL_RING=1 */
  const char* ibv_devices; /* --ibv-devices FILE: the device matrix of a job on this host */
  int coord_port;          /* --coordinator-port P (0: picked, never guessed) */
  char** program;          /* argv of the program, NULL-terminated */
} launch_opts;

/* Parse the command line into o; prints the help and exits 0 for --help, and
 * exits 2 with a message naming the problem for bad arguments. */
void launch_parse_args(int argc, char** argv, launch_opts* o);
void launch_free_args(launch_opts* o);

/* msg.c: "[launch] <message>" on stderr, one line written at once (any thread). */
void launch_msg(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void launch_vmsg(const char* fmt, va_list ap) __attribute__((format(printf, 1, 0)));
/* "[launch] <message>" and a pointer to --help, then exit 2. */
_Noreturn void launch_bad_usage(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- hostfile.c ---- */

typedef struct launch_hostfile {
  char path[PATH_MAX]; /* what MLX_HOSTFILE is set to */
  int n;               /* number of ranks */
  char* json;          /* the hostfile as the ranks read it, for --verbose */
  int* fds;            /* generated: the reserved ports, held until the ranks start */
  int n_fds;
} launch_hostfile;

struct mlxd_net_hosts;
/* hostfile_check.c (pure, fuzzed): parse a user's hostfile of len bytes (name
 * for messages) with the ranks' parser and check it against -n and
 * --connections (0: not given) and LAUNCH_MAX_RANKS. Returns 0 with out filled
 * (host names not yet resolved), or -1 with why. */
int launch_hostfile_check(const char* text, size_t len, const char* name, int n, int connections,
                          struct mlxd_net_hosts* out, char* why, size_t why_len);

/* The given hostfile (checked; exits 2 when it is bad or disagrees with -n or
 * --connections) or a new one on free ports of 127.0.0.1 in a private temporary
 * directory, removed at exit. Returns 0, or 1 after a message. */
int launch_hostfile_prepare(const launch_opts* o, launch_hostfile* hf);
/* Close the reserved ports so that the ranks can bind them. */
void launch_hostfile_release_ports(launch_hostfile* hf);
void launch_hostfile_free(launch_hostfile* hf);

/* ---- mpi.c ---- */

typedef struct launch_hosts launch_hosts; /* hosts.c */

typedef enum {
  LAUNCH_MPI_NONE,
  LAUNCH_MPI_OPENMPI,
  LAUNCH_MPI_MPICH,
  LAUNCH_MPI_OTHER
} launch_mpi_kind;

/* The mpirun command line for o (NULL-terminated; free with launch_mpi_argv_free);
 * hs: the hosts (NULL: this host only). NULL after a message, with *status the
 * exit status to use. */
char** launch_mpi_argv(const launch_opts* o, const launch_hosts* hs, int* status);
/* The same for a given MPI flavour (pure: unit-tested); NULL with why. */
char** launch_mpi_build(const launch_opts* o, const launch_hosts* hs, launch_mpi_kind kind,
                        bool as_root, char* why, size_t why_len);
void launch_mpi_argv_free(char** av);

/* ---- relay.c ---- */

/* One output pipe of a child: complete lines are written to out_fd (1 or 2)
 * with the prefix, whatever way the child's writes split them. */
typedef struct launch_relay {
  int fd; /* read end of the child's pipe (non-blocking), -1 when closed */
  int out_fd;
  const char* prefix; /* "[r] ", or "" */
  /* Called with every line relayed (without the prefix; NULL: none). */
  void (*on_line)(void* ctx, const char* line, size_t len);
  void* ctx;
  /* A line (with its newline) consumed instead of printed, once; it sets
   * *swallowed (NULL: none). A remote rank's script says it started so. */
  const char* swallow;
  bool* swallowed;
  int epfd; /* the epoll set watching fd (supervise.c; 0 or -1: none): left before the close */
  char* buf;
  size_t len, cap;
} launch_relay;

/* Read what is available and print the complete lines; at end of file print
 * the rest and close the pipe. */
void launch_relay_read(launch_relay* r);
/* Print what is left (also a last line without a newline), close, free. */
void launch_relay_finish(launch_relay* r);

/* ---- watch.c ---- */

#define LAUNCH_VIEW_LINE 512
#define LAUNCH_DUMP_WAIT_S 1.0 /* how long the ranks get to print their records */
#define LAUNCH_STOPPED_S 2.0   /* a rank stopped (state T) this long is reported */

/* One rank as the supervisor sees it. */
typedef struct launch_view {
  bool has_record; /* its last record's heading: */
  char host[64];
  char why[32];
  char note[128]; /* "in all_sum #17 for 3.2 s" */
  unsigned long long colls;
  double record_at;
  char first_err[LAUNCH_VIEW_LINE]; /* its first line that reports a failure */
  char last_line[LAUNCH_VIEW_LINE]; /* its last stderr line (not a record's) */
  bool stopped;                     /* state T/t in /proc/<pid>/stat */
  double stopped_since;             /* 0: not stopped */
  bool stopped_reported;
} launch_view;

/* A line of the rank's stderr (len bytes, maybe with its newline). */
void launch_view_line(launch_view* v, const char* line, size_t len);
/* The state letter of /proc/<pid>/stat ('R', 'S', 'T', ...), 0 if unknown. */
char launch_proc_state(pid_t pid);
/* Whether the process catches SIGUSR1 (SigCgt of /proc/<pid>/status): an
 * mlxdist rank with MLXDIST_DUMP_SIGNAL=1 and a group does. */
bool launch_catches_sigusr1(pid_t pid);
/* The ranks' last records side by side under title, the rank behind marked. */
void launch_view_table(const launch_view* v, int n, const char* title);
/* The failure summary: the first rank to fail (how: "was killed by signal 9
 * (Killed)"), its message, then the others: codes[i] (exit code, 0 if it
 * succeeded), by_us[i] (it ended after the launcher began to stop the job). */
void launch_view_summary(const launch_view* v, int n, int first, const char* how, const int* codes,
                         const bool* by_us);

/* ---- hosts.c ---- */

typedef struct launch_host {
  char name[256]; /* the ssh destination ("host", "user@host" or an IP) */
  char ip[64];    /* the address its ranks listen on: "ips"[0], "" when not given */
  int slots;      /* ranks on this host */
  bool local;     /* localhost, 127.0.0.1 or ::1: started without ssh */
  char* rdma;     /* its "rdma" list as compact JSON (malloc'd), NULL when not given */
} launch_host;

typedef struct launch_hosts {
  launch_host* h;
  int n;       /* hosts */
  int ranks;   /* the sum of the slots */
  int backend; /* the object form's "backend": -1 not given, 0 ring, 1 mpi, 2 jaccl, 3 jaccl-ring */
  char** envs; /* the object form's "envs" ("K=V", checked) */
  int n_envs;
} launch_hosts;

/* --hosts: "h1,h2,..." with per_host ranks each (0: not given, 1). Returns 0
 * with out filled, or -1 with why. Pure. */
int launch_hosts_from_list(const char* list, int per_host, launch_hosts* out, char* why,
                           size_t why_len);
/* A hostfile's text (name for messages): MLX's launcher's list of
 * {"ssh": h, "ips": [...]} or its object {"backend", "envs", "hosts"}, or
 * lines "host[:slots]" ("host slots=K" too). per_host ranks per host (0: 1;
 * a line's own slots win). Returns 0 with out filled, 1 when the text is the
 * ring's own format (a list of lists), empty, or not one valid JSON value
 * (the ring's parser says what is wrong; out untouched), or -1 with why. Pure
 * (fuzzed: tests/fuzz/fuzz_launch_hostfile.c). */
int launch_hosts_from_file(const char* text, size_t len, const char* name, int per_host,
                           launch_hosts* out, char* why, size_t why_len);
void launch_hosts_free(launch_hosts* hs);
/* The host index of rank r (host-major order). */
int launch_hosts_of_rank(const launch_hosts* hs, int r);
/* Whether every host is local (the job stays on this machine). */
bool launch_hosts_all_local(const launch_hosts* hs);
/* Whether name is an ssh destination the launcher accepts (no blank, no
 * quote, no leading '-', 1..255 bytes). */
bool launch_host_name_ok(const char* name);

/* ---- remote.c ---- */

/* What a remote rank's script needs (remote.c). */
typedef struct launch_remote {
  int rank, world;
  const char* host;        /* for the script's own messages */
  const char* cwd;         /* the directory to run in */
  const char* rendezvous;  /* MLXDIST_RENDEZVOUS */
  const char* ring_addr;   /* MLXDIST_RING_ADDR (NULL or "": not set) */
  const char* ifname;      /* MLXDIST_IFNAME (NULL: not set) */
  const char* port_range;  /* MLXDIST_PORT_RANGE (NULL: not set) */
  const char* const* envs; /* "K=V", applied after the above */
  int n_envs;
  bool verbose; /* MLX_RING_VERBOSE=1 */
  bool secret;  /* a second stdin line is the secret: into a 0600 file, MLXDIST_SECRET_FILE */
  double grace; /* SIGTERM to SIGKILL once stdin ends */
  char* const* program;
  /* jaccl (rendezvous NULL then): a further stdin line is the device matrix,
   * written into a 0600 file in a private directory removed at exit,
   * MLX_IBV_DEVICES; and these variables: */
  bool matrix;
  const char* jaccl_coord; /* MLX_JACCL_COORDINATOR */
  bool jaccl_ring;         /* MLX_JACCL_RING=1 */
} launch_remote;

/* s quoted for a POSIX shell ('...'), appended to a malloc'd string *buf of
 * *len bytes; -1 when out of memory. */
int launch_sh_quote(char** buf, size_t* len, const char* s);
/* The sh script (one line) that runs rank r on its host: cd, environment,
 * token (and secret) read from stdin, the program with stdin from /dev/null
 * killed when stdin ends, the program's exit status (128+signal). malloc'd. */
char* launch_remote_script(const launch_remote* r);
/* The words of --ssh CMD (blanks separate, '...' and "..." quote, \ escapes):
 * a NULL-terminated malloc'd list, or NULL with why. */
char** launch_split_words(const char* cmd, char* why, size_t why_len);
/* The ssh command for one remote rank: ssh's words, -T, BatchMode=yes,
 * ConnectTimeout, ServerAlive options, the host, then "sh -c '<script>'". */
char** launch_ssh_argv(char* const* ssh_words, double connect_timeout, const char* host,
                       const char* script);
void launch_argv_free(char** av);

/* ---- across.c ---- */

/* Run the job on hs (with remote hosts) over the rendezvous; returns the
 * launcher's exit status. */
int launch_run_hosts(const launch_opts* o, const launch_hosts* hs, int sfd, const char* token_hex,
                     const char* secret_path);

/* ---- jaccl.c ---- */

/* What the ranks of a jaccl job get besides MLX_RANK (docs/jaccl.md, "Launching"). */
typedef struct launch_jaccl {
  int n;                     /* ranks: the matrix's rows */
  char* matrix;              /* from a hostfile: the matrix, compact JSON (remote ranks' stdin) */
  char dir[PATH_MAX - 32];   /* the private directory of the written matrix ("": none) */
  char path[PATH_MAX];       /* the written matrix (0600), the local ranks' MLX_IBV_DEVICES */
  char user_path[PATH_MAX];  /* --ibv-devices / MLX_IBV_DEVICES, on this host */
  char coord[128];           /* MLX_JACCL_COORDINATOR: "ip:port" */
  int hold_fd;               /* the coordinator's port, bound here until the ranks start; -1 */
  char kv[3][PATH_MAX + 32]; /* "MLX_JACCL_COORDINATOR=..", "MLX_IBV_DEVICES=..", MLX_JACCL_RING */
  int n_kv;
} launch_jaccl;

/* Check hs's "rdma" lists (and one rank per entry) before anything else, names
 * resolved or ports chosen: 0, or 2 after a message naming the host and entry. */
int launch_jaccl_check_hosts(const launch_opts* o, const launch_hosts* hs);
/* A job on this host: the matrix of hs's "rdma" lists (all hosts local; written
 * into a private file) or, with hs NULL, of --ibv-devices or MLX_IBV_DEVICES
 * (checked, its size against -n); the coordinator 127.0.0.1 on a port bound
 * here. Unsets the JACCL_ forms, MLX_JACCL_RING and MLX_HOSTFILE in this
 * process (the ranks inherit its environment). 0, or 2 (bad input) / 1 after
 * a message naming the problem. */
int launch_jaccl_local(const launch_opts* o, const launch_hosts* hs, launch_jaccl* j);
/* A job across hosts: the matrix of hs's "rdma" lists (one rank per host
 * entry; written here only when a host is local); the coordinator on ip0, the
 * first host's address: bound here when that host is local, else a port no
 * socket uses there, read over ssh (ssh_words). 0, or 2 / 1 after a message. */
int launch_jaccl_hosts(const launch_opts* o, const launch_hosts* hs, const char* ip0,
                       char* const* ssh_words, launch_jaccl* j);
/* Pure: a port in lo..hi (lo 0: the range is text's first line, the host's
 * ip_local_port_range) that no line of text (/proc/net/tcp and tcp6) has as
 * its local port, from lo + start % (hi - lo + 1) on. 0 with *port, or 2
 * with why. */
int launch_jaccl_free_port(const char* text, unsigned lo, unsigned hi, unsigned start,
                           unsigned* port, char* why, size_t why_len);
/* Close the held coordinator port, just before the ranks start (rank 0 binds it). */
void launch_jaccl_release(launch_jaccl* j);
/* Release, remove the written matrix and its directory, free. */
void launch_jaccl_free(launch_jaccl* j);

/* ---- spawn.c ---- */

/* The open-file limit (RLIMIT_NOFILE) for a job of ranks ranks with conns
 * reserved ports each (0: none reserved): the launcher holds about 3 fds per
 * rank (two output pipes, an ssh rank's stdin, or its rendezvous connection)
 * plus the reserved ports, and its ranks inherit its limit, where a full mesh
 * of the ring needs about conns + 1 per peer. The soft limit is raised (never
 * lowered) to what both need, up to the hard limit. Returns 0, or -1 after a
 * message naming the limit when the hard limit is below what the launcher
 * itself needs (nothing started yet). Idempotent: called again with a larger
 * job, it raises again. */
int launch_nofile(int ranks, int conns);

/* Whether this host can run `ranks` ranks of mlxdist at once (each about 3
 * tasks: its main thread, the stream's worker, the watchdog): the system's
 * kernel.pid_max and kernel.threads-max less the tasks already running, the
 * cgroup's pids.max less its pids.current, and (not as root) RLIMIT_NPROC.
 * Returns 0, or -1 after a message naming the first limit too small and how
 * to raise it (nothing started yet). A limit it cannot read is not checked. */
int launch_procs(int ranks);

/* Route SIGCHLD, SIGINT, SIGTERM and SIGHUP to a signalfd (returned, -1 on error). */
int launch_block_signals(void);

typedef struct launch_spawn {
  char** argv;          /* NULL-terminated */
  const char** set_env; /* "K=V" strings, applied in order after MLX_RANK (local ranks) */
  int n_env;
  /* Across hosts (all NULL for a job on this host): */
  char** const* rank_argv;       /* rank r's own argv (an ssh command for a remote rank) */
  const char* const* rank_host;  /* rank r's host: messages, and "[r host] " with host_prefix */
  const char* const* rank_stdin; /* non-NULL for an ssh rank: written to its stdin, a pipe
                                     held open until the job stops (its end stops the rank) */
  bool host_prefix;
  /* The start-up bound: when started(ctx) is still false start_timeout
   * seconds after the start, the job is stopped (0: none). */
  bool (*started)(void* ctx);
  void* started_ctx;
  double start_timeout;
  /* Checked every LAUNCH_RDV_CHECK_S while the job runs (NULL: none): true
   * stops the job (the rendezvous failed and said why). Its ctx: started_ctx. */
  bool (*failed)(void* ctx);
} launch_spawn;

/* What every child of one job is spawned with, made once in the launcher (not per child
 * with setenv): the environment with sp's variables applied, a slot for MLX_RANK that the
 * launcher fills in before each rank's spawn, the attributes, and the gate. */
typedef struct launch_spawn_env {
  char** envp;      /* environ, then MLX_RANK's slot, MLXDIST_DUMP_SIGNAL, sp->set_env (last wins),
                    MLXDIST_LAUNCH_GATE */
  int rank_slot;    /* envp's MLX_RANK (-1: none, or sp->set_env sets it) */
  int gate;         /* the gate's read end, not close-on-exec (-1: none): every local rank has it */
  char gate_kv[64]; /* "MLXDIST_LAUNCH_GATE=FD:INODE" */
  char rank_kv[32]; /* "MLX_RANK=r", envp[rank_slot] while rank r is spawned */
  posix_spawnattr_t attr; /* its own process group, default signals, the launcher's old mask */
  bool attr_ok;
} launch_spawn_env;

/* The environment and attributes of sp's local children (ranks: the ranks', with MLX_RANK's
 * slot and the gate se->gate when >= 0): -1 with errno. The strings are borrowed (environ,
 * sp->set_env, literals, se's own), only the array is the caller's (launch_spawn_env_free). A
 * MLXDIST_LAUNCH_GATE in the launcher's own environment (a launcher run by a rank) is not
 * passed on: only this launcher's gate is. */
int launch_spawn_env_make(launch_spawn_env* se, const launch_spawn* sp, bool ranks);
/* Free what launch_spawn_env_make made (after a failure too; a zeroed one holds nothing). */
void launch_spawn_env_free(launch_spawn_env* se);
/* The child's pipes as its stdout, stderr (and stdin), and for a rank over ssh the gate
 * closed (it is for local ranks); then posix_spawnp of the program: the rank's ssh command,
 * or sp->argv with the prepared environment and MLX_RANK (rank >= 0) in its slot. Returns 0
 * with *pid, or the error (the program's: it cannot run, or the system's: no process). */
int launch_spawn_child(const launch_spawn* sp, launch_spawn_env* se, int rank, int out_fd,
                       int err_fd, int in_fd, pid_t* pid);
/* Whether posix_spawn's error e is the program's (it cannot run: say so, exit 127/126 as a
 * shell does) rather than the system's (no process could be made). */
bool launch_spawn_program_error(int e);
/* The launcher's message and exit status for a child whose program cannot run (error e). */
int launch_spawn_cannot_run(const launch_spawn* sp, int rank, int e);

/* ---- supervise.c ---- */

/* Start n ranks of sp, rank r with MLX_RANK=r and its output prefixed "[r] ",
 * and supervise them: the first rank to fail stops the others; timeout (0:
 * none) stops them all. Returns the launcher's exit status. */
int launch_ranks(const launch_spawn* sp, int n, int sfd, double timeout);
/* Run one child (mpirun) under the same supervision, its output as is. */
int launch_one(const launch_spawn* sp, int sfd, double timeout);

/* ---- rendezvous.c (contract C1; protocol: src/net/rendezvous_wire.h) ---- */

typedef struct launch_rdv launch_rdv;
/* Listen on bind_ip ("10.0.0.1", "127.0.0.1", "::1"; never 0.0.0.0), on port 0 or the first free
 * port of port_range ("A-B", NULL: any), for the n ranks of a job whose token is token_hex (32
 * hex). rank_host[r] names rank r's host for messages (may be NULL). Serves the all-gather from
 * its own thread: ends when all n ranks got the result, or after timeout_s with one message per
 * missing rank ("[launch] rank 3 (host 10.0.0.3) did not reach the rendezvous within 30 s") and
 * the connected ranks told to fail. A peer that fails the authentication or sends garbage is
 * dropped with a message and does not count. Writes "ip:port" (for MLXDIST_RENDEZVOUS) to
 * addr_out. Returns NULL after a message. */
launch_rdv* launch_rdv_start(int n, const char* token_hex, const char* bind_ip,
                             const char* port_range, double timeout_s, const char* const* rank_host,
                             char* addr_out, size_t addr_len);
/* Whether every rank got the result (true), is still pending or failed (false). The server
 * keeps serving after that until launch_rdv_stop: a rank that initialises again (init after
 * clear_backends) rendezvouses again; so stop it when the job ends, not when it is done. */
bool launch_rdv_done(const launch_rdv* r);
/* Whether the job's rendezvous failed (a rank missing at timeout_s, or ranks that disagree), its
 * messages printed and the connected ranks told why (their replies sent, or a second's bound
 * for that passed): the launcher should stop the job. (An addition to contract C1.) */
bool launch_rdv_failed(const launch_rdv* r);
/* Stop serving (if still), join the thread (bounded: 1 s), close, free. NULL: no-op. */
void launch_rdv_stop(launch_rdv* r);

#endif

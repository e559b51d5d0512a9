/* The scale program (issue 25, item 5; docs/scale.md, scripts/scale.sh): what
 * one rank of a big job costs, run under mlxdist-launch -n N. Public API only.
 *
 * Phases, each timed on this rank: a strict ring init; one all_sum of 4 bytes
 * (an int32: rank + 1, the sum checked); one small all_gather (two int32 per
 * rank: r and 3r + 1, every rank's checked); one ring neighbour exchange (send
 * 8 bytes to rank + 1, receive from rank - 1, checked). Then what the rank
 * holds: open fds (/proc/self/fd), threads and VmRSS (/proc/self/status), its
 * connected TCP sockets (its own fds, asked with getsockopt: no /proc/net/tcp,
 * which grows as N^2), and the /dev/shm it maps (virtual bytes, from
 * /proc/self/maps). Two 4-byte all_sums as a barrier bracket the moment rank 0
 * samples the job's /dev/shm use (statvfs: what tmpfs holds, unlinked but
 * mapped segments included, less what it held before rank 0's init), so every
 * rank still holds its resources then.
 *
 * Output, one line per rank on stdout (scripts/scale.sh parses it):
 *   scale rank R n N start_ms S init_ms I sum_ms A gather_ms G ring_ms X
 *         fds F threads T rss_kb K tcp C shm_map_kb M main_ms W
 *         init_cpu_ms P sum_cpu_ms Q ops_cpu_ms O init_flt F flt L init_vcsw V
 *         init_ivcsw U ops_vcsw Y ops_ivcsw Z ok
 * (*_cpu_ms: this process's CPU time in init, in the all_sum, in all three ops;
 * init_flt: its minor page faults in init, flt: from its start to the line;
 * *_vcsw / *_ivcsw: its voluntary / involuntary context switches in init and
 * in the three ops, getrusage: how often it slept or was preempted)
 * (start_ms: from SCALE_T0_NS, CLOCK_REALTIME ns set by the script, to main;
 * -1 without it; main_ms: main to the line), and from rank 0:
 *   scale job n N shm_used_kb U tcp_inuse S tcp_mem_kb B
 * (the host's TCP sockets in use and the kernel memory their buffers hold,
 * /proc/net/sockstat, sampled with /dev/shm; other jobs on the host count too)
 * A failed check prints "scale rank R FAILED: ..." on stderr and exits 1; an
 * API failure exits 2 after the library's message. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "mlx/c/array.h"
#include "mlx/c/distributed.h"
#include "mlx/c/distributed_group.h"
#include "mlx/c/stream.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* This process's CPU time (user + system, every thread), ms: unlike wall times, what a phase
 * costs stays near the same on a loaded machine. */
static double cpu_ms(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
         (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-3;
}

/* This process's minor page faults so far (every thread): what it touched of fresh memory. */
static long minflt(void) {
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) != 0 ? -1 : ru.ru_minflt;
}

/* This process's voluntary and involuntary context switches (every thread). */
static void csw(long* vol, long* invol) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) {
    *vol = *invol = -1;
    return;
  }
  *vol = ru.ru_nvcsw;
  *invol = ru.ru_nivcsw;
}

static int rank_g = -1;

static int fail(const char* what) {
  fprintf(stderr, "scale rank %d FAILED: %s\n", rank_g, what);
  return 1;
}

/* The bytes /dev/shm (tmpfs) holds now; -1 if unknown. */
static long long shm_used_kb(void) {
  struct statvfs sv;
  if (statvfs("/dev/shm", &sv) != 0) return -1;
  return (long long)((sv.f_blocks - sv.f_bfree) * sv.f_frsize / 1024);
}

/* "Key:   value kB" of /proc/self/status. */
static long status_field(const char* key) {
  FILE* f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long v = -1;
  size_t kl = strlen(key);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
      v = strtol(line + kl + 1, NULL, 10);
      break;
    }
  fclose(f);
  return v;
}

/* Open fds and, among them, connected TCP sockets (IPv4 or IPv6 streams, not listening). */
static void count_fds(int* fds, int* tcp) {
  *fds = *tcp = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return;
  int self = dirfd(d);
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    int fd = atoi(e->d_name);
    if (fd == self) continue;
    (*fds)++;
    int dom = 0, type = 0, acc = 0;
    socklen_t l1 = sizeof dom, l2 = sizeof type, l3 = sizeof acc;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &l1) != 0) continue;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l2) != 0) continue;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l3) != 0) continue;
    if ((dom == AF_INET || dom == AF_INET6) && type == SOCK_STREAM && !acc) (*tcp)++;
  }
  closedir(d);
}

/* The virtual bytes of this process's mappings of /dev/shm files. */
static long long shm_mapped_kb(void) {
  FILE* f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[1024];
  long long kb = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo = 0, hi = 0;
    if (!strstr(line, " /dev/shm/") || sscanf(line, "%lx-%lx", &lo, &hi) != 2) continue;
    kb += (long long)((hi - lo) / 1024);
  }
  fclose(f);
  return kb;
}

/* /proc/net/sockstat's TCP line: sockets in use and the pages their buffers hold. */
static void tcp_sockstat(long* inuse, long* mem_kb) {
  *inuse = *mem_kb = -1;
  FILE* f = fopen("/proc/net/sockstat", "r");
  if (!f) return;
  char line[256];
  while (fgets(line, sizeof line, f)) {
    long a = 0, o = 0, tw = 0, al = 0, m = 0;
    if (sscanf(line, "TCP: inuse %ld orphan %ld tw %ld alloc %ld mem %ld", &a, &o, &tw, &al, &m) ==
        5) {
      *inuse = a;
      *mem_kb = m * (sysconf(_SC_PAGESIZE) / 1024);
    }
  }
  fclose(f);
}

/* One all_sum of an int32 (v); its result in *out. 0, or 2 after the library's message. */
static int sum_i32(int32_t v, int32_t* out, mlx_distributed_group g, mlx_stream s) {
  int shape[1] = {1};
  mlx_array x = mlx_array_new_data(&v, shape, 1, MLX_INT32);
  mlx_array r = mlx_array_new();
  int rc = 2;
  if (mlx_distributed_all_sum(&r, x, g, s) == 0 && mlx_array_eval(r) == 0) {
    const int32_t* p = mlx_array_data_int32(r);
    if (p) {
      *out = p[0];
      rc = 0;
    }
  }
  mlx_array_free(r);
  mlx_array_free(x);
  return rc;
}

int main(void) {
  double t_main = now_ms();
  long long start_ms = -1;
  const char* t0 = getenv("SCALE_T0_NS");
  if (t0 && *t0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long nowns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    start_ms = (nowns - atoll(t0)) / 1000000;
  }
  const char* er = getenv("MLX_RANK");
  long long shm0 = er && atoi(er) == 0 ? shm_used_kb() : -1;

  mlx_distributed_group g = mlx_distributed_group_new();
  mlx_stream s = mlx_stream_new();
  long f0 = minflt();
  long v0, i0, v1, i1, v3, i3;
  csw(&v0, &i0);
  double t = now_ms(), c0 = cpu_ms();
  if (mlx_distributed_init(&g, true, "ring") != 0) return 2;
  double init_ms = now_ms() - t, c1 = cpu_ms();
  long f1 = minflt();
  csw(&v1, &i1);
  int rank = mlx_distributed_group_rank(g), n = mlx_distributed_group_size(g);
  rank_g = rank;
  char why[160];

  /* all_sum, 4 bytes */
  t = now_ms();
  int32_t sum = 0;
  if (sum_i32(rank + 1, &sum, g, s) != 0) return 2;
  double sum_ms = now_ms() - t, c2 = cpu_ms();
  int64_t want = (int64_t)n * (n + 1) / 2;
  if (sum != want) {
    snprintf(why, sizeof why, "all_sum gave %d, expected %lld", (int)sum, (long long)want);
    return fail(why);
  }

  /* all_gather, 8 bytes per rank */
  t = now_ms();
  int32_t mine[2] = {rank, 3 * rank + 1};
  int shape[1] = {2};
  mlx_array x = mlx_array_new_data(mine, shape, 1, MLX_INT32);
  mlx_array r = mlx_array_new();
  if (mlx_distributed_all_gather(&r, x, g, s) != 0 || mlx_array_eval(r) != 0) return 2;
  double gather_ms = now_ms() - t;
  const int32_t* all = mlx_array_data_int32(r);
  if (!all || mlx_array_size(r) != (size_t)(2 * n)) return fail("all_gather: wrong size");
  for (int i = 0; i < n; i++)
    if (all[2 * i] != i || all[2 * i + 1] != 3 * i + 1) {
      snprintf(why, sizeof why, "all_gather: rank %d's entry is %d,%d, expected %d,%d", i,
               all[2 * i], all[2 * i + 1], i, 3 * i + 1);
      return fail(why);
    }
  mlx_array_free(r);
  mlx_array_free(x);

  /* the ring exchange: 8 bytes to rank + 1, from rank - 1 */
  t = now_ms();
  int to = (rank + 1) % n, from = (rank + n - 1) % n;
  int32_t out[2] = {rank, -rank - 7};
  x = mlx_array_new_data(out, shape, 1, MLX_INT32);
  mlx_array sent = mlx_array_new(), got = mlx_array_new();
  if (mlx_distributed_send(&sent, x, to, g, s) != 0) return 2;
  if (mlx_distributed_recv(&got, shape, 1, MLX_INT32, from, g, s) != 0) return 2;
  if (mlx_array_eval(sent) != 0 || mlx_array_eval(got) != 0) return 2;
  double ring_ms = now_ms() - t;
  const int32_t* in = mlx_array_data_int32(got);
  if (!in || in[0] != from || in[1] != -from - 7) {
    snprintf(why, sizeof why, "ring exchange: got %d,%d from rank %d", in ? in[0] : -1,
             in ? in[1] : -1, from);
    return fail(why);
  }
  mlx_array_free(sent);
  mlx_array_free(got);
  mlx_array_free(x);

  double c3 = cpu_ms();
  csw(&v3, &i3);
  /* what this rank holds after its ops */
  int fds = 0, tcp = 0;
  count_fds(&fds, &tcp);
  long threads = status_field("Threads"), rss = status_field("VmRSS");
  long long mapped = shm_mapped_kb();

  /* barrier, rank 0 samples /dev/shm, barrier */
  int32_t b = 0;
  if (sum_i32(1, &b, g, s) != 0) return 2;
  if (b != n) return fail("barrier all_sum");
  long long shm_kb = -1;
  long tcp_inuse = -1, tcp_mem_kb = -1;
  if (rank == 0) {
    long long u = shm_used_kb();
    shm_kb = u >= 0 && shm0 >= 0 ? u - shm0 : -1;
    tcp_sockstat(&tcp_inuse, &tcp_mem_kb);
  }
  if (sum_i32(1, &b, g, s) != 0) return 2;
  if (b != n) return fail("barrier all_sum");

  printf(
      "scale rank %d n %d start_ms %lld init_ms %.1f sum_ms %.2f gather_ms %.2f ring_ms %.2f "
      "fds %d threads %ld rss_kb %ld tcp %d shm_map_kb %lld main_ms %.1f init_cpu_ms %.2f "
      "sum_cpu_ms %.3f ops_cpu_ms %.3f init_flt %ld flt %ld init_vcsw %ld init_ivcsw %ld "
      "ops_vcsw %ld ops_ivcsw %ld ok\n",
      rank, n, start_ms, init_ms, sum_ms, gather_ms, ring_ms, fds, threads, rss, tcp, mapped,
      now_ms() - t_main, c1 - c0, c2 - c1, c3 - c1, f1 - f0, minflt(), v1 - v0, i1 - i0, v3 - v1,
      i3 - i1);
  if (rank == 0)
    printf("scale job n %d shm_used_kb %lld tcp_inuse %ld tcp_mem_kb %ld\n", n, shm_kb, tcp_inuse,
           tcp_mem_kb);
  fflush(stdout);
  mlx_distributed_group_free(g);
  mlx_stream_free(s);
  return 0;
}

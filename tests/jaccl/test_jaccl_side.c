/* jaccl's side channel (backends/jaccl/jaccl_side.h) between real processes
 * over real sockets, outside any RDMA: the entry point a rank of the backend
 * runs before its verbs transport, driven by jaccl_side.sh.
 *
 *   test_jaccl_side port            print a free TCP port of 127.0.0.1
 *   test_jaccl_side rank ROUNDS     one rank: the configuration from the
 *                                   environment (MLX_RANK, MLX_IBV_DEVICES,
 *                                   MLX_JACCL_COORDINATOR), open the star, run
 *                                   ROUNDS all-gathers of different sizes
 *                                   (0 bytes, 1 byte, ~200 KiB, ...), check
 *                                   every byte, print "ok" (exit 0), else the
 *                                   error and "failed N ms after the star
 *                                   began to open" (exit 1): the time in this
 *                                   process from the open to the failure (the
 *                                   process's start, its configuration and its
 *                                   exit, slow under the sanitizers on a busy
 *                                   host, not counted)
 *   test_jaccl_side bad-up          a rank that opens the star rightfully (it
 *                                   has the token) and then sends a frame with
 *                                   another rank's number in it
 *   test_jaccl_side bad-len         ... a frame with another length
 *   test_jaccl_side bad-down        rank 0 answering the first all-gather
 *                                   with a frame of another round
 * The bad ones print what their peers should report and sleep until killed
 * (at most 20 s). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/jaccl/jaccl_config.h"
#include "backends/jaccl/jaccl_side.h"
#include "util/bytes.h"
#include "util/clock.h"

static unsigned char pattern(int rank, int round, size_t i) {
  return (unsigned char)(rank * 131 + round * 17 + (int)(i % 251));
}

static size_t round_bytes(int round) {
  static const size_t sizes[] = {8, 0, 1, 200003, 64};
  return sizes[round % 5];
}

static double g_start; /* mlxd_now() as the star began to open (0: not yet) */

static int fail(const mlxd_status* st) {
  mlxd_status copy = *st;
  mlxd_status_render(&copy, "jaccl");
  printf("error: %s\n", copy.msg);
  if (g_start > 0)
    printf("failed %.0f ms after the star began to open\n", (mlxd_now() - g_start) * 1000);
  fflush(stdout);
  return 1;
}

static int open_side(mlxd_jaccl_config* cfg, mlxd_jaccl_side* sc, mlxd_status* st) {
  mlxd_net_auth auth;
  if (mlxd_jaccl_config_load(false, cfg, st)) return st->code;
  if (mlxd_jaccl_side_auth(cfg, &auth, st)) return st->code;
  g_start = mlxd_now();
  int rc = mlxd_jaccl_side_open(cfg, &auth, sc, st);
  mlxd_net_auth_clear(&auth);
  return rc;
}

static int run_rank(int rounds) {
  mlxd_status st = {0};
  mlxd_jaccl_config cfg;
  mlxd_jaccl_side sc;
  if (open_side(&cfg, &sc, &st)) return fail(&st);
  for (int k = 0; k < rounds; k++) {
    size_t n = round_bytes(k);
    unsigned char* src = malloc(n + 1);
    unsigned char* dst = malloc(n * (size_t)cfg.size + 1);
    for (size_t i = 0; i < n; i++) src[i] = pattern(cfg.rank, k, i);
    if (mlxd_jaccl_side_allgather(&sc, src, dst, n, &st)) return fail(&st);
    for (int r = 0; r < cfg.size; r++)
      for (size_t i = 0; i < n; i++)
        if (dst[(size_t)r * n + i] != pattern(r, k, i)) {
          printf("error: all-gather %d: rank %d's byte %zu is wrong\n", k, r, i);
          return 1;
        }
    free(src);
    free(dst);
  }
  mlxd_jaccl_side_close(&sc);
  mlxd_jaccl_config_free(&cfg);
  printf("ok: rank %d of %d, %d all-gathers\n", cfg.rank, cfg.size, rounds);
  return 0;
}

static void put_hdr(unsigned char* h, uint32_t magic, uint32_t round, uint32_t who, uint64_t n) {
  memset(h, 0, MLXD_JACCL_SIDE_HDR);
  mlxd_put32(h, magic);
  mlxd_put16(h + 4, 1);
  mlxd_put32(h + 8, round);
  mlxd_put32(h + 12, who);
  mlxd_put64(h + 16, n);
}

static int run_bad(const char* how) {
  mlxd_status st = {0};
  mlxd_jaccl_config cfg;
  mlxd_jaccl_side sc;
  if (open_side(&cfg, &sc, &st)) return fail(&st);
  unsigned char h[MLXD_JACCL_SIDE_HDR + 8] = {0};
  int fd = sc.rank == 0 ? sc.fds[1] : sc.fds[0];
  int fl = 0;
  (void)fl;
  if (strcmp(how, "bad-up") == 0)
    put_hdr(h, 0x4D584A55u, 0, (uint32_t)(cfg.rank + 1) % (uint32_t)cfg.size, 8);
  else if (strcmp(how, "bad-len") == 0)
    put_hdr(h, 0x4D584A55u, 0, (uint32_t)cfg.rank, 1u << 20);
  else { /* bad-down: wait for rank 1's frame, answer with round 7 */
    unsigned char in[MLXD_JACCL_SIDE_HDR + 8];
    size_t got = 0;
    for (int i = 0; i < 200 && got < sizeof in; i++) {
      ssize_t k = recv(fd, in + got, sizeof in - got, 0);
      if (k > 0)
        got += (size_t)k;
      else
        usleep(10000);
    }
    put_hdr(h, 0x4D584A44u, 7, (uint32_t)cfg.size, 8);
  }
  if (send(fd, h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h) {
    printf("error: cannot send the bad frame\n");
    return 1;
  }
  printf("sent %s\n", how);
  fflush(stdout);
  sleep(20);
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 2 && strcmp(argv[1], "port") == 0) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr*)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr*)&a, &len) != 0)
      return 1;
    printf("%u\n", ntohs(a.sin_port));
    close(fd);
    return 0;
  }
  if (argc >= 3 && strcmp(argv[1], "rank") == 0) return run_rank(atoi(argv[2]));
  if (argc >= 2 && strncmp(argv[1], "bad-", 4) == 0) return run_bad(argv[1]);
  fprintf(stderr, "usage: test_jaccl_side port | rank ROUNDS | bad-up | bad-len | bad-down\n");
  return 2;
}

/* A rank program for test_launch_hosts.sh (mlxdist-launch across hosts
 * through a stand-in ssh); public API only. Modes (argv[1]):
 *   sum          init the ring group (strict), one all_sum of rank+1 and
 *                check it, print "rank R/N addr A: all_sum ok";
 *   token        look through /proc/<pid>/cmdline of every process for the
 *                job token (and the --secret's contents): print and exit 1
 *                if a command line holds one, else print "token not on any
 *                command line"; then one all_sum (so all ranks are alive
 *                while the others look);
 *   die R MARK   rank R dies of SIGKILL after 1 s, the others sleep 60 s
 *                (MARK: a word for pgrep to find every process of the job);
 *   hang MARK    every rank sleeps 60 s;
 *   listen       listen on a free port of 127.0.0.1, print "port P", sleep 30 s
 *                (a port some socket uses, for the jaccl launcher's probe);
 *   jaccl        a strict init of "jaccl" (MLX's variables from the launcher):
 *                print "jaccl init ok" and exit 0, or exit 3 after the
 *                library's error message (the default handler prints it). */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mlx/c/array.h"
#include "mlx/c/distributed.h"
#include "mlx/c/distributed_group.h"
#include "mlx/c/stream.h"

static int all_sum_check(void) {
  mlx_distributed_group g = mlx_distributed_group_new();
  mlx_stream s = mlx_stream_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) {
    fprintf(stderr, "hosts_rank: init failed\n");
    return 3;
  }
  int rank = mlx_distributed_group_rank(g), size = mlx_distributed_group_size(g);
  float v[4];
  for (int i = 0; i < 4; i++) v[i] = (float)(rank + 1) * (float)(i + 1);
  int shape[1] = {4};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_FLOAT32);
  mlx_array r = mlx_array_new();
  if (mlx_distributed_all_sum(&r, x, g, s) != 0 || mlx_array_eval(r) != 0) {
    fprintf(stderr, "hosts_rank: all_sum failed\n");
    return 3;
  }
  const float* got = mlx_array_data_float32(r);
  float tri = (float)size * (float)(size + 1) / 2;
  for (int i = 0; i < 4; i++)
    if (!got || got[i] != tri * (float)(i + 1)) {
      fprintf(stderr, "hosts_rank: rank %d: all_sum[%d] = %g, expected %g\n", rank, i,
              got ? got[i] : -1.0, tri * (float)(i + 1));
      return 4;
    }
  const char* addr = getenv("MLXDIST_RING_ADDR");
  printf("rank %d/%d addr %s: all_sum ok\n", rank, size, addr ? addr : "-");
  mlx_array_free(r);
  mlx_array_free(x);
  mlx_distributed_group_free(g);
  mlx_stream_free(s);
  return 0;
}

/* Whether any process's command line holds needle (n bytes). */
static int cmdline_holding(const char* needle, size_t n) {
  DIR* d = opendir("/proc");
  if (!d) return -1;
  struct dirent* e;
  int found = 0;
  while ((e = readdir(d)) != NULL && !found) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[300], buf[65536];
    snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
    FILE* f = fopen(path, "r");
    if (!f) continue;
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    for (size_t i = 0; i + n <= len && !found; i++)
      if (memcmp(buf + i, needle, n) == 0) found = atoi(e->d_name);
  }
  closedir(d);
  return found;
}

static int token_check(void) {
  const char* t = getenv("MLXDIST_JOB_TOKEN");
  if (!t || strlen(t) != 32) {
    fprintf(stderr, "hosts_rank: no job token\n");
    return 5;
  }
  char secret[256] = "";
  const char* sf = getenv("MLXDIST_SECRET_FILE");
  FILE* f = sf ? fopen(sf, "r") : NULL;
  if (f) {
    if (!fgets(secret, sizeof secret, f)) secret[0] = '\0';
    fclose(f);
    secret[strcspn(secret, "\n")] = '\0';
  }
  int pid = cmdline_holding(t, strlen(t));
  int spid = secret[0] ? cmdline_holding(secret, strlen(secret)) : 0;
  if (pid || spid) {
    printf("the %s is on the command line of pid %d\n", pid ? "token" : "secret", pid ? pid : spid);
    return 1;
  }
  printf("token not on any command line%s\n", secret[0] ? " (nor the secret)" : "");
  fflush(stdout);
  return all_sum_check();
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (strcmp(mode, "sum") == 0) return all_sum_check();
  if (strcmp(mode, "token") == 0) return token_check();
  if (strcmp(mode, "listen") == 0) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr*)&sa, sizeof sa) != 0 || listen(fd, 1) != 0 ||
        getsockname(fd, (struct sockaddr*)&sa, &len) != 0) {
      perror("hosts_rank: listen");
      return 1;
    }
    printf("port %d\n", ntohs(sa.sin_port));
    fflush(stdout);
    sleep(30);
    return 0;
  }
  if (strcmp(mode, "jaccl") == 0) {
    mlx_distributed_group g = mlx_distributed_group_new();
    if (mlx_distributed_init(&g, true, "jaccl") != 0) return 3;
    printf("jaccl init ok: rank %d of %d\n", mlx_distributed_group_rank(g),
           mlx_distributed_group_size(g));
    mlx_distributed_group_free(g);
    return 0;
  }
  const char* r = getenv("MLX_RANK");
  if (strcmp(mode, "die") == 0 && argc > 2) {
    if (r && atoi(r) == atoi(argv[2])) {
      sleep(1);
      raise(SIGKILL);
    }
    sleep(60);
    return 0;
  }
  if (strcmp(mode, "hang") == 0) {
    sleep(60);
    return 0;
  }
  fprintf(stderr, "usage: hosts_rank sum|token|jaccl|listen|die R MARK|hang MARK\n");
  return 2;
}

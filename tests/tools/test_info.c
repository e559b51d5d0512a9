/* mlxdist-info: --env lists every tunable with its default, --markdown is a
 * table with one row per tunable, the summary names the backends, the RDMA
 * devices (or why there are none) and the shm single-copy threshold with what
 * chose it, and bad
 * arguments exit 2. Expected names/defaults come from the tunable getters of
 * the library (not from the tool's own copy of the list). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "testutil.h"
#include "util/tunables.h"

static char out[1 << 16];

/* Run a shell command, capture stdout (stderr folded in), return the exit status. */
static int capture(const char* cmd) {
  FILE* p = popen(cmd, "r");
  T_ASSERT(p != NULL);
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int main(int argc, char** argv) {
  T_ASSERT(argc == 2);
  char cmd[4096];
  const char* tool = argv[1];

  snprintf(cmd, sizeof cmd, "env -u MLXDIST_TIMEOUT '%s' --env", tool);
  T_EQ_INT(capture(cmd), 0);
  T_ASSERT(strstr(out, "MLXDIST_TIMEOUT") != NULL);
  for (int t = 0; t < MLXD_T_COUNT; t++) {
    char want[512];
    const char* def = mlxd_tunable_default((mlxd_tunable)t);
    snprintf(want, sizeof want, "%s (default: %s)", mlxd_tunable_env_name((mlxd_tunable)t),
             def[0] ? def : "(empty)");
    if (!strstr(out, want)) T_FAIL("--env output lacks '%s':\n%s", want, out);
    /* the first words of the description are printed */
    char doc[24];
    snprintf(doc, sizeof doc, "%s", mlxd_tunable_doc((mlxd_tunable)t));
    if (!strstr(out, doc)) T_FAIL("--env output lacks the description '%s...'", doc);
  }

  /* a value set in the environment is shown */
  snprintf(cmd, sizeof cmd, "MLXDIST_TIMEOUT=7.5 '%s' --env", tool);
  T_EQ_INT(capture(cmd), 0);
  T_ASSERT(strstr(out, "currently set to: 7.5") != NULL);
  T_ASSERT(strstr(out, "INVALID") == NULL);
  /* every variable shows what it accepts; a bad value is flagged */
  T_ASSERT(strstr(out, "MLXDIST_TRANSPORT (default: auto)\n    expected: auto, tcp or shm\n"));
  snprintf(cmd, sizeof cmd, "MLXDIST_TIMEOUT=-1 '%s' --env", tool);
  T_EQ_INT(capture(cmd), 0);
  T_ASSERT(strstr(out,
                  "INVALID: MLXDIST_TIMEOUT='-1' is out of range; expected seconds, a number "
                  "from 0.001 to 86400") != NULL);

  /* a name mlxdist does not know is flagged with the nearest known one; none without one */
  T_ASSERT(strstr(out, "UNKNOWN") == NULL);
  snprintf(cmd, sizeof cmd, "MLXDIST_TIMEUOT=5 '%s' --env", tool);
  T_EQ_INT(capture(cmd), 0);
  T_ASSERT(strstr(out,
                  "UNKNOWN (ignored; an init error under MLXDIST_STRICT_ENV=1):\n    "
                  "MLXDIST_TIMEUOT is not a variable mlxdist knows (did you mean "
                  "MLXDIST_TIMEOUT?)\n") != NULL);

  snprintf(cmd, sizeof cmd, "'%s' --env --markdown", tool);
  T_EQ_INT(capture(cmd), 0);
  const char* head = "| Variable | Default | Expected | Description |\n|---|---|---|---|\n";
  T_ASSERT(strncmp(out, head, strlen(head)) == 0);
  int rows = 0;
  for (char* p = out; (p = strstr(p, "\n| `MLXDIST_")) != NULL; p++) rows++;
  T_EQ_INT(rows, MLXD_T_COUNT);
  T_ASSERT(strstr(out, "| `MLXDIST_TIMEOUT` | `60` | seconds, a number from 0.001 to 86400 |") !=
           NULL);

  snprintf(cmd, sizeof cmd, "'%s'", tool);
  T_EQ_INT(capture(cmd), 0);
  T_ASSERT(strstr(out, "mlxdist 0.1.0") != NULL);
  T_ASSERT(strstr(out, "  ring ") != NULL && strstr(out, "  mpi ") != NULL);

  /* the RDMA devices jaccl would use, or why there are none: with the library this machine
   * has (no device or no kernel support on a test machine), and with none at all */
  if (!strstr(out, "rdma devices (jaccl, through ")) { /* a machine with devices lists them */
    T_ASSERT(strstr(out, "rdma devices (jaccl): none: no ") != NULL);
    T_ASSERT(strstr(out, "  jaccl  not available: [jaccl] no ") != NULL);
  }
  snprintf(cmd, sizeof cmd, "MLXDIST_IBVERBS_LIB=/nonexistent/libibverbs.so.1 '%s'", tool);
  T_EQ_INT(capture(cmd), 0);
  if (!strstr(out,
              "rdma devices (jaccl): none: no libibverbs: cannot load "
              "/nonexistent/libibverbs.so.1") ||
      !strstr(out, "  jaccl  not available: [jaccl] no libibverbs"))
    T_FAIL("no library: %s", out);
  snprintf(cmd, sizeof cmd, "MLXDIST_IBVERBS_LIB=libm.so.6 '%s'", tool);
  T_EQ_INT(capture(cmd), 0);
  if (!strstr(out,
              "rdma devices (jaccl): none: libm.so.6 is not a usable libibverbs: it has no "
              "ibv_get_device_list"))
    T_FAIL("not libibverbs: %s", out);

  /* the shm single-copy threshold and what chose it: the variable (skips the calibration), or
   * unset, this boot's calibration (fresh, or its cache); the crowded host's constant */
  snprintf(cmd, sizeof cmd, "MLXDIST_SHM_CMA_BYTES=0 '%s'", tool);
  T_EQ_INT(capture(cmd), 0);
  if (!strstr(out, "\nshm single copy: off on every host (environment: MLXDIST_SHM_CMA_BYTES=0)\n"))
    T_FAIL("MLXDIST_SHM_CMA_BYTES=0: %s", out);
  snprintf(cmd, sizeof cmd, "MLXDIST_SHM_CMA_BYTES=65536 '%s'", tool);
  T_EQ_INT(capture(cmd), 0);
  if (!strstr(out,
              "\nshm single copy: from 65536 bytes on every host (environment: "
              "MLXDIST_SHM_CMA_BYTES=65536)\n"))
    T_FAIL("MLXDIST_SHM_CMA_BYTES=65536: %s", out);
  for (int run = 0; run < 2; run++) {
    snprintf(cmd, sizeof cmd, "env -u MLXDIST_SHM_CMA_BYTES '%s'", tool);
    T_EQ_INT(capture(cmd), 0);
    const char* l = strstr(out, "\nshm single copy: ");
    if (!l || !strstr(l, "shm single copy: collectives ") ||
        !(strstr(l, " where the host is not crowded (calibration cached for this boot in ") ||
          strstr(l, " where the host is not crowded (fresh calibration in ") ||
          strstr(l, " where the host is not crowded (calibration: ")))
      T_FAIL("MLXDIST_SHM_CMA_BYTES unset: %s", out);
    if (!strstr(l,
                "; point to point off (the lanes) where not crowded; 33554432 bytes on a crowded "
                "host (crowded rule)\n"))
      T_FAIL("the crowded rule: %s", out);
    /* a fresh calibration that was kept is what the next process reads */
    if (run == 0 && !strstr(l, "(fresh calibration in ")) break;
    if (run == 0 && !strstr(l, ", cached in /dev/shm/")) break;
    if (run == 1 && !strstr(l, "(calibration cached for this boot in /dev/shm/.mlxdist-cma-"))
      T_FAIL("the second run did not read the first one's cache: %s", out);
  }

  snprintf(cmd, sizeof cmd, "'%s' --bogus 2>&1", tool);
  T_EQ_INT(capture(cmd), 2);
  T_ASSERT(strstr(out, "[info]") && strstr(out, "--bogus"));
  printf("test_info: all passed\n");
  return 0;
}

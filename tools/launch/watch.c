/* mlxdist-launch: what the supervisor knows about each rank, from its stderr
 * lines and /proc (docs/troubleshooting.md):
 *  - the operation records the ranks print (core/oprec.h: the first line
 *    "[mlxdist] record rank R/N pid P host H (why): <note>; colls C"),
 *    shown side by side in one table with the rank that is behind marked;
 *  - each rank's first error line, for the failure summary (the first rank
 *    to fail, its message, then how many failed or were stopped after it);
 *  - whether a rank is stopped (state T or t in /proc/<pid>/stat) and
 *    whether it catches SIGUSR1 (SigCgt in /proc/<pid>/status), so that the
 *    launcher only asks ranks that print their record on that signal. */
#include <ctype.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"
#include "util/clock.h"

static const char* this_host(void) {
  static char h[64];
  if (!h[0] && (gethostname(h, sizeof h) != 0 || !h[0])) snprintf(h, sizeof h, "localhost");
  h[sizeof h - 1] = 0;
  return h;
}

static void copy_line(char* dst, size_t n, const char* src, size_t len) {
  if (len >= n) len = n - 1;
  memcpy(dst, src, len);
  dst[len] = 0;
  for (char* p = dst; *p; p++)
    if ((unsigned char)*p < ' ') *p = ' ';
}

/* A line that says something failed (not the ranks' records and warnings). */
static bool is_error_line(const char* s) {
  if (strncmp(s, "[mlxdist]", 9) == 0) return false;
  return strcasestr(s, "error") || strstr(s, "failed") || strstr(s, "lost connection") ||
         strstr(s, "timed out") || strstr(s, "no sign of life");
}

void launch_view_line(launch_view* v, const char* line, size_t len) {
  while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
  char buf[LAUNCH_VIEW_LINE];
  copy_line(buf, sizeof buf, line, len);
  int rank = 0, size = 0;
  long pid = 0;
  char host[64], why[32];
  int used = 0;
  if (sscanf(buf, "[mlxdist] record rank %d/%d pid %ld host %63s (%31[^)]): %n", &rank, &size, &pid,
             host, why, &used) == 5 &&
      used > 0) {
    const char* note = buf + used;
    const char* c = strstr(note, "; colls ");
    size_t nl = c ? (size_t)(c - note) : strlen(note);
    copy_line(v->note, sizeof v->note, note, nl);
    v->colls = c ? strtoull(c + 8, NULL, 10) : 0;
    snprintf(v->host, sizeof v->host, "%s", host);
    snprintf(v->why, sizeof v->why, "%s", why);
    v->has_record = true;
    v->record_at = mlxd_now();
    return;
  }
  if (!v->first_err[0] && is_error_line(buf))
    snprintf(v->first_err, sizeof v->first_err, "%s", buf);
  if (strncmp(buf, "[mlxdist]", 9) != 0 && buf[0])
    snprintf(v->last_line, sizeof v->last_line, "%s", buf);
}

char launch_proc_state(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC); /* not stdio: no buffer to allocate per rank */
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  /* "pid (comm) S ...": comm may hold spaces and parentheses; the state
   * follows the last ')'. */
  char* p = strrchr(buf, ')');
  if (!p || p[1] != ' ') return 0;
  return p[2];
}

bool launch_catches_sigusr1(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
  FILE* f = fopen(path, "r");
  if (!f) return false;
  bool yes = false;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "SigCgt:", 7) == 0) {
      unsigned long long m = strtoull(line + 7, NULL, 16);
      yes = (m >> (SIGUSR1 - 1)) & 1;
      break;
    }
  fclose(f);
  return yes;
}

/* The note's parts: "in all_sum #17 for 3.2 s" -> state "in", op "all_sum
 * #17", for "3.2 s"; "after all_sum #16, 61.0 s ago" -> "after", ..., "61.0 s
 * ago"; "idle" -> "idle". */
static void split_note(const char* note, char* state, char* op, char* dur) {
  char st[16] = "", name[32] = "";
  unsigned long long seq = 0;
  double t = 0;
  snprintf(state, 16, "%s", note);
  op[0] = dur[0] = 0;
  if (sscanf(note, "%15s %31s #%llu for %lf s", st, name, &seq, &t) == 4) {
    snprintf(dur, 24, "%.1f s", t);
  } else if (sscanf(note, "%15s %31s #%llu, %lf s ago", st, name, &seq, &t) == 4) {
    snprintf(dur, 24, "%.1f s ago", t);
  } else {
    return;
  }
  snprintf(state, 16, "%s", st);
  snprintf(op, 48, "%s #%llu", name, seq);
}

/* One row, without trailing blanks. */
static void row(const char* rank, const char* host, const char* op, const char* state,
                const char* dur, const char* mark) {
  char line[LAUNCH_VIEW_LINE];
  snprintf(line, sizeof line, "  %-5s %-16s %-20s %-7s %-12s %s", rank, host, op, state, dur, mark);
  size_t n = strlen(line);
  while (n > 0 && line[n - 1] == ' ') line[--n] = 0;
  launch_msg("%s", line);
}

void launch_view_table(const launch_view* v, int n, const char* title) {
  unsigned long long lo = ~0ull, hi = 0;
  int with = 0;
  for (int i = 0; i < n; i++) {
    if (!v[i].has_record) continue;
    with++;
    if (v[i].colls < lo) lo = v[i].colls;
    if (v[i].colls > hi) hi = v[i].colls;
  }
  launch_msg("%s", title);
  row("rank", "host", "last op", "state", "for", "");
  for (int i = 0; i < n; i++) {
    const launch_view* r = &v[i];
    char mark[96] = "";
    if (r->stopped)
      snprintf(mark, sizeof mark, "<- stopped (state T)");
    else if (!r->has_record)
      snprintf(mark, sizeof mark, "<- no record (not answering, or not using mlxdist yet)");
    else if (with > 1 && r->colls < hi)
      snprintf(mark, sizeof mark, "<- behind: %llu collective%s behind the others", hi - r->colls,
               hi - r->colls == 1 ? "" : "s");
    char num[16];
    snprintf(num, sizeof num, "%d", i);
    if (!r->has_record) {
      row(num, this_host(), "-", "-", "-", mark);
      continue;
    }
    char state[16], op[48], dur[24];
    split_note(r->note, state, op, dur);
    row(num, r->host, op[0] ? op : "-", state, dur[0] ? dur : "-", mark);
  }
  if (with == n && n > 1 && lo == hi)
    launch_msg("  (every rank has entered %llu collective%s: none is behind in collectives)", hi,
               hi == 1 ? "" : "s");
}

void launch_view_summary(const launch_view* v, int n, int first, const char* how, const int* codes,
                         const bool* by_us) {
  launch_msg("first failure: rank %d (%s): %s", first,
             v[first].has_record ? v[first].host : this_host(), how);
  const char* msg = v[first].first_err[0] ? v[first].first_err : v[first].last_line;
  if (msg[0]) launch_msg("  its message: %s", msg);
  int failed = 0, stopped = 0, other = -1;
  for (int i = 0; i < n; i++) {
    if (i == first || codes[i] == 0) continue;
    if (v[i].first_err[0] || !by_us[i]) {
      failed++;
      if (other < 0 && v[i].first_err[0]) other = i;
    } else {
      stopped++;
    }
  }
  if (failed > 0) {
    if (other >= 0)
      launch_msg("%d other rank%s failed after it (rank %d: %s)", failed, failed == 1 ? "" : "s",
                 other, v[other].first_err);
    else
      launch_msg("%d other rank%s failed after it", failed, failed == 1 ? "" : "s");
  }
  if (stopped > 0)
    launch_msg("%d other rank%s stopped by the launcher", stopped,
               stopped == 1 ? " was" : "s were");
}

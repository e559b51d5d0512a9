/* mlxdist-launch: its messages, "[launch] ..." on stderr (launch.h). A file of its own
 * because the rendezvous server (rendezvous.c), which its test program drives alone,
 * speaks through it too. */
#include <stdarg.h>
#include <stdio.h>

#include "launch.h"

/* The line is formatted first and written with one call, so that a line of the
 * rendezvous thread and one of the main thread do not interleave. */
void launch_vmsg(const char* fmt, va_list ap) {
  char line[2048];
  vsnprintf(line, sizeof line, fmt, ap);
  fprintf(stderr, "[launch] %s\n", line);
}

void launch_msg(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  launch_vmsg(fmt, ap);
  va_end(ap);
  fflush(stderr);
}

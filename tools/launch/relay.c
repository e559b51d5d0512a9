/* mlxdist-launch: a child's output relayed line by line with its "[rank] "
 * prefix, so that lines of different ranks never interleave mid-line. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>

#include "launch.h"

/* writev all of iov; a slow reader is waited for, a gone one drops the rest. */
static void write_all(int fd, struct iovec* iov, int n) {
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

/* One line in a single writev, so that it reaches the terminal in one piece. */
static void emit_line(const launch_relay* r, const char* line, size_t len, bool add_newline) {
  if (r->swallow && !*r->swallowed && len == strlen(r->swallow) &&
      memcmp(line, r->swallow, len) == 0) {
    *r->swallowed = true;
    return;
  }
  struct iovec iov[3];
  int n = 0;
  if (r->prefix && *r->prefix) iov[n++] = (struct iovec){(void*)r->prefix, strlen(r->prefix)};
  iov[n++] = (struct iovec){(void*)line, len};
  if (add_newline) iov[n++] = (struct iovec){(void*)"\n", 1};
  write_all(r->out_fd, iov, n);
  if (r->on_line) r->on_line(r->ctx, line, len);
}

/* Print every complete line in r->buf (and everything when flush_all). */
static void print_lines(launch_relay* r, bool flush_all) {
  if (r->len == 0) return;
  size_t start = 0;
  for (;;) {
    char* nl = memchr(r->buf + start, '\n', r->len - start);
    if (!nl) break;
    size_t end = (size_t)(nl - r->buf) + 1;
    emit_line(r, r->buf + start, end - start, false);
    start = end;
  }
  if (r->len - start >= LAUNCH_MAX_LINE || (flush_all && r->len > start)) {
    emit_line(r, r->buf + start, r->len - start, true);
    start = r->len;
  }
  memmove(r->buf, r->buf + start, r->len - start);
  r->len -= start;
}

static void close_relay(launch_relay* r) {
  print_lines(r, true);
  if (r->epfd > 0) epoll_ctl(r->epfd, EPOLL_CTL_DEL, r->fd, NULL);
  close(r->fd);
  r->fd = -1;
}

void launch_relay_read(launch_relay* r) {
  if (r->fd < 0) return;
  if (r->cap - r->len < 16384) {
    size_t nc = r->cap ? r->cap * 2 : 32768;
    char* nb = realloc(r->buf, nc);
    if (!nb) {
      print_lines(r, true); /* make room by printing the partial line as one */
      return;
    }
    r->buf = nb;
    r->cap = nc;
  }
  ssize_t got = read(r->fd, r->buf + r->len, r->cap - r->len);
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (got <= 0) {
    close_relay(r);
    return;
  }
  r->len += (size_t)got;
  print_lines(r, false);
}

void launch_relay_finish(launch_relay* r) {
  if (r->fd >= 0) close_relay(r);
  free(r->buf);
  r->buf = NULL;
  r->len = r->cap = 0;
}

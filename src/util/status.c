/* mlxd_status helpers: fill a status (plain or structured) and render it. */
#include <stdio.h>
#include <string.h>

#include "util/status.h"

int mlxd_vfail(mlxd_status* st, int code, const char* fmt, va_list ap) {
  if (code == 0) code = MLXD_EINVAL; /* a failure always carries a non-zero code */
  if (!st) return code;
  *st = (mlxd_status){.code = code, .rendered = true};
  if (!fmt) return code;
  int n = vsnprintf(st->msg, sizeof st->msg, fmt, ap);
  if (n < 0) snprintf(st->msg, sizeof st->msg, "(unformattable message: %s)", fmt);
  return code;
}

int mlxd_fail(mlxd_status* st, int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = mlxd_vfail(st, code, fmt, ap);
  va_end(ap);
  return r;
}

int mlxd_fail_at(mlxd_status* st, int code, mlxd_layer layer, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = mlxd_vfail(st, code, fmt, ap);
  va_end(ap);
  if (st) {
    st->layer = (int)layer;
    st->rendered = layer == MLXD_LAYER_NONE;
  }
  return r;
}

void mlxd_status_set_peer(mlxd_status* st, int peer, const char* addr) {
  if (!st) return;
  st->has_peer = true;
  st->peer = peer;
  snprintf(st->peer_addr, sizeof st->peer_addr, "%s", addr ? addr : "");
}

void mlxd_status_set_sys(mlxd_status* st, const char* syscall, int err) {
  if (!st) return;
  st->syscall = syscall;
  st->sys_errno = err;
}

void mlxd_status_set_op(mlxd_status* st, const char* op, uint64_t seq) {
  if (!st) return;
  st->op = op;
  st->seq = seq;
}

void mlxd_status_set_reporter(mlxd_status* st, int reporter) {
  if (!st) return;
  st->has_reporter = true;
  st->reporter = reporter;
}

void mlxd_status_set_self(mlxd_status* st, int self) {
  if (!st) return;
  st->has_self = true;
  st->self = self;
}

/* Append printf-style text at *len, never past cap (the result stays NUL-terminated). */
static void append(char* buf, size_t cap, size_t* len, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char* buf, size_t cap, size_t* len, const char* fmt, ...) {
  if (*len + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
  va_end(ap);
  if (n > 0) *len = (size_t)n >= cap - *len ? cap - 1 : *len + (size_t)n;
}

void mlxd_status_render(mlxd_status* st, const char* tag) {
  if (!st || st->rendered || st->layer == MLXD_LAYER_NONE) return;
  char out[MLXD_MSG_MAX];
  size_t len = 0;
  out[0] = '\0';
  if (tag && *tag) append(out, sizeof out, &len, "[%s] ", tag);
  if (st->op) append(out, sizeof out, &len, "%s #%llu", st->op, (unsigned long long)st->seq);
  if (st->has_self) append(out, sizeof out, &len, "%srank %d", st->op ? " on " : "", st->self);
  if (st->op || st->has_self) append(out, sizeof out, &len, ": ");
  append(out, sizeof out, &len, "%s", st->msg[0] ? st->msg : "operation failed");
  const char* sep = " (";
  if (st->peer_addr[0]) {
    append(out, sizeof out, &len, "%s%s", sep, st->peer_addr);
    sep = "; ";
  }
  if (st->syscall || st->sys_errno) {
    append(out, sizeof out, &len, "%s%s%s%s", sep, st->syscall ? st->syscall : "",
           st->syscall ? ": " : "", st->sys_errno ? strerror(st->sys_errno) : "failed");
    sep = "; ";
  }
  if (st->has_reporter) {
    append(out, sizeof out, &len, "%sreported by rank %d", sep, st->reporter);
    sep = "; ";
  }
  if (sep[0] == ';') append(out, sizeof out, &len, ")");
  memcpy(st->msg, out, sizeof out);
  st->rendered = true;
}

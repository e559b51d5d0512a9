/* A file a user named, read whole and bounded (user_file.h). */
#include "util/user_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

int mlxd_user_file_read(const char* path, const char* subject, size_t limit, char** text,
                        size_t* len, mlxd_status* st) {
  *text = NULL;
  *len = 0;
  /* O_NONBLOCK: opening a FIFO without a writer does not wait (it is refused below) */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  struct stat sb;
  if (fd < 0) {
    int e = errno;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
      return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "%s is %s (expected a regular file)", subject, file_kind(sb.st_mode));
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP, "cannot open %s", subject);
    mlxd_status_set_sys(st, "open", e);
    return st->code;
  }
  int rc = 0;
  char* buf = NULL;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP, "cannot read %s", subject);
    mlxd_status_set_sys(st, "fstat", e);
    goto done;
  }
  if (!S_ISREG(sb.st_mode)) {
    rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP, "%s is %s (expected a regular file)",
                      subject, file_kind(sb.st_mode));
    goto done;
  }
  if (sb.st_size > (off_t)limit) {
    rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                      "%s is %lld bytes (expected at most %zu)", subject, (long long)sb.st_size,
                      limit);
    goto done;
  }
  /* the size may be wrong (a file that grows, /proc): never read more than limit + 1 */
  size_t cap = (size_t)sb.st_size + 2, n = 0;
  if (cap < 4096) cap = 4096;
  buf = malloc(cap);
  while (buf) {
    if (n + 1 == cap) {
      if (cap > limit + 1) break;
      size_t nc = cap * 2 > limit + 2 ? limit + 2 : cap * 2;
      char* nb = realloc(buf, nc);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap = nc;
    }
    ssize_t r = read(fd, buf + n, cap - n - 1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP, "cannot read %s", subject);
      mlxd_status_set_sys(st, "read", e);
      goto done;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  if (!buf) {
    rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory reading %s", subject);
    goto done;
  }
  if (n > limit) {
    rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                      "%s is more than %zu bytes (expected at most %zu)", subject, limit, limit);
    goto done;
  }
  buf[n] = '\0';
  *text = buf;
  *len = n;
  buf = NULL;
done:
  free(buf);
  close(fd);
  return rc;
}

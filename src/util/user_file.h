/* Private: a file whose path a user gave (the ring's hostfile, jaccl's device
 * matrix), read whole and bounded: net/hostfile.c and
 * backends/jaccl/jaccl_config.c. */
#ifndef MLXD_USER_FILE_H
#define MLXD_USER_FILE_H

#include <stddef.h>

#include "util/status.h"

/* Reads the regular file at path into *text (NUL-terminated, the caller
 * frees it) and *len. Opens with O_NONBLOCK, so a FIFO without a writer is
 * refused, never waited on; a directory, FIFO, device or socket is named; at
 * most limit bytes, checked before the read and during it (a file that
 * grows past its size, /proc). On failure *text is NULL and st is filled
 * (layer bootstrap) with subject in it ("hostfile 'x'", "the device matrix
 * 'x' (MLX_IBV_DEVICES)"): "cannot open <subject>" (with the system error),
 * "<subject> is a FIFO (named pipe) (expected a regular file)", "<subject>
 * is N bytes (expected at most L)", "<subject> is more than L bytes ...",
 * "cannot read <subject>", "out of memory reading <subject>". */
int mlxd_user_file_read(const char* path, const char* subject, size_t limit, char** text,
                        size_t* len, mlxd_status* st);

#endif

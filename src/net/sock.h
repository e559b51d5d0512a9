/* Private to src/net: socket options and limits shared by the listeners
 * (listen.c), the mesh (mesh*.c) and the fd limits (fdlimit.c). */
#ifndef MLXD_NET_SOCK_H
#define MLXD_NET_SOCK_H

#include <stdbool.h>
#include <stddef.h>

#define LISTEN_BACKLOG 64 /* bounded: a flood fills it, not memory; accepted at once anyway */
#define MAX_PENDING 64    /* incoming handshakes in progress at once: at least this many... */
#define PENDING_CAP 4096  /* ...and one per connection of the group up to this many */

/* listen.c */
void mlxd_net_sock_buffers(int fd);
void mlxd_net_sock_nodelay(int fd);
int mlxd_net_sock_nonblock(int fd, bool on);

/* fdlimit.c: the open-file limit, for the messages of a failed socket() or
 * accept(); whether an errno is a shortage of descriptors or buffers. */
void mlxd_net_nofile_text(char* buf, size_t n);
bool mlxd_net_short_of_fds(int e);

#endif

/* What the trust tests share: clocks, child processes, and the intruder's side
 * of a connection (dial a rank's port, keep the socket open, send bytes). */
#ifndef MLXD_TEST_INTRUDER_H
#define MLXD_TEST_INTRUDER_H

#include <stddef.h>
#include <sys/types.h>

double now_s(void);
void sleep_s(double s);
/* The text of a file (at most 1 MiB; empty when it cannot be read). Free it. */
char* read_text(const char* path);
/* Exit status of child p (128 + signal when killed); -1 after limit s (it is killed then). */
int wait_child(pid_t p, double limit);

/* A connection to 127.0.0.1:port (retried for up to 2 s while the port is not open yet). */
int dial(int port);
/* Keep fd open until close_kept() (at most 1024). */
void keep(int fd);
void close_kept(void);
void send_all(int fd, const void* b, size_t n);
/* Two kept connections to port: one sends an HTTP request, one 300 bytes of junk. */
void send_garbage(int port);
/* The inodes of this process's sockets (from /proc/self/fd), at most max: their number. */
int own_socket_inodes(long* out, int max);

#endif

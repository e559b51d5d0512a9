/* Private: big-endian integers in wire records (handshakes, address records). */
#ifndef MLXD_BYTES_H
#define MLXD_BYTES_H

#include <stdint.h>

static inline void mlxd_put16(unsigned char* p, unsigned v) {
  p[0] = (unsigned char)(v >> 8);
  p[1] = (unsigned char)v;
}
static inline unsigned mlxd_get16(const unsigned char* p) { return ((unsigned)p[0] << 8) | p[1]; }
static inline void mlxd_put32(unsigned char* p, uint32_t v) {
  mlxd_put16(p, v >> 16);
  mlxd_put16(p + 2, v & 0xFFFF);
}
static inline uint32_t mlxd_get32(const unsigned char* p) {
  return ((uint32_t)mlxd_get16(p) << 16) | mlxd_get16(p + 2);
}

static inline void mlxd_put64(unsigned char* p, uint64_t v) {
  mlxd_put32(p, (uint32_t)(v >> 32));
  mlxd_put32(p + 4, (uint32_t)v);
}
static inline uint64_t mlxd_get64(const unsigned char* p) {
  return ((uint64_t)mlxd_get32(p) << 32) | mlxd_get32(p + 4);
}

#endif

/* Inputs and reference results for the algorithm tests, computed here with
 * scalar code independent of the library's kernels (src/reduce).
 * Element i of rank p's input is a hash of (dtype, p, i, salt); "exact"
 * inputs are small integers, so every summation order gives the same bits
 * and results compare bit for bit; inexact ones are arbitrary floats. */
#ifndef MLXDIST_TEST_ALGO_REFERENCE_H
#define MLXDIST_TEST_ALGO_REFERENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { R_NDTYPES = 14, R_NOPS = 3 }; /* mlx_dtype 0..13; mlxd_reduce_op sum, max, min */

size_t r_esize(int dt);
const char* r_dt_name(int dt);
const char* r_op_name(int op);
bool r_is_float(int dt);

/* buf[0..count) = rank p's elements first..first+count. */
void r_fill(int dt, int p, size_t first, size_t count, bool exact, uint64_t salt, void* buf);
/* out[0..count) = OP over ranks 0..n-1 (in rank order) of elements first..first+count. */
void r_reduce(int op, int dt, int n, size_t first, size_t count, bool exact, uint64_t salt,
              void* out);
/* Element as a double (part 1: imaginary part of complex64). */
double r_as_double(int dt, const void* p, int part);
/* Element as text ("-3", "0x7f", "(1.5, -2)"). */
void r_format(int dt, const void* p, char* buf, size_t n);

#endif

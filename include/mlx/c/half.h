/* mlxdist: 16-bit floating point types, as in mlx-c's half.h.
 *
 * HAS_FLOAT16 / float16_t are defined where the compiler has a native
 * half-precision type (x86-64 GCC >= 12, aarch64). HAS_BFLOAT16 /
 * bfloat16_t where it has a native bfloat16 type. Without them the 16-bit
 * arrays are still usable: read their raw bits with the uint16 accessors. */
#ifndef MLX_HALF_H
#define MLX_HALF_H

#if defined(__aarch64__) || defined(__ARM_FEATURE_FP16_VECTOR_ARITHMETIC)
#define HAS_FLOAT16
__extension__ typedef __fp16 float16_t;
#elif defined(__FLT16_MAX__)
#define HAS_FLOAT16
__extension__ typedef _Float16 float16_t;
#endif

#if defined(__BFLT16_MAX__) || \
    (defined(__aarch64__) && defined(__ARM_FEATURE_BF16))
#define HAS_BFLOAT16
__extension__ typedef __bf16 bfloat16_t;
#endif

#endif /* MLX_HALF_H */

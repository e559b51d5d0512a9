/* mlxdist: arrays (the subset of mlx-c's array.h a distributed program needs).
 *
 * An array is a reference-counted, immutable, row-major block of host memory
 * (64-byte aligned when mlxdist allocates it) with a dtype and a shape.
 * Arrays produced by distributed ops may be pending: reading their data,
 * items or calling mlx_array_eval waits for the work that produces them. */
#ifndef MLX_ARRAY_H
#define MLX_ARRAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mlx/c/export.h"
#include "mlx/c/half.h"
#include "mlx/c/string.h"

#ifdef __cplusplus
extern "C" {
#endif

/** An array handle. ctx == NULL is the empty handle. */
typedef struct mlx_array_ {
  void* ctx;
} mlx_array;

/** Element types, with mlx-c's values (0..13). */
typedef enum mlx_dtype_ {
  MLX_BOOL,
  MLX_UINT8,
  MLX_UINT16,
  MLX_UINT32,
  MLX_UINT64,
  MLX_INT8,
  MLX_INT16,
  MLX_INT32,
  MLX_INT64,
  MLX_FLOAT16,
  MLX_FLOAT32,
  MLX_FLOAT64,
  MLX_BFLOAT16,
  MLX_COMPLEX64,
} mlx_dtype;

/** Single-precision complex, two floats (real, imaginary). */
typedef float _Complex mlx_complex64_t;

/** Bytes per element of dtype; 0 for an unknown dtype. */
MLXDIST_API size_t mlx_dtype_size(mlx_dtype dtype);

/** A readable rendering: "array([1, 2, 3], dtype=int32)". Waits for a pending array. */
MLXDIST_API int mlx_array_tostring(mlx_string* str, const mlx_array arr);

/** An empty handle. */
MLXDIST_API mlx_array mlx_array_new(void);
/** Release one reference; the memory goes with the last one. Freeing an empty handle is fine. */
MLXDIST_API int mlx_array_free(mlx_array arr);

/* Scalars (0-d arrays). */
MLXDIST_API mlx_array mlx_array_new_bool(bool val);
MLXDIST_API mlx_array mlx_array_new_int(int val);
MLXDIST_API mlx_array mlx_array_new_float32(float val);
MLXDIST_API mlx_array mlx_array_new_float(float val);
MLXDIST_API mlx_array mlx_array_new_float64(double val);
MLXDIST_API mlx_array mlx_array_new_double(double val);
MLXDIST_API mlx_array mlx_array_new_complex(float real_val, float imag_val);

/**
 * A new array holding a copy of data, laid out row-major with the given
 * shape (dim entries, none negative). data may be NULL only when the shape
 * has no elements. An unknown dtype, a negative dimension or a NULL data
 * pointer is an error (empty handle returned).
 */
MLXDIST_API mlx_array mlx_array_new_data(
    const void* data,
    const int* shape,
    int dim,
    mlx_dtype dtype);
/** Like mlx_array_new_data but without a copy: dtor(data) runs once when the last reference goes. */
MLXDIST_API mlx_array mlx_array_new_data_managed(
    void* data,
    const int* shape,
    int dim,
    mlx_dtype dtype,
    void (*dtor)(void*));
/** Like mlx_array_new_data_managed but dtor(payload) runs instead. */
MLXDIST_API mlx_array mlx_array_new_data_managed_payload(
    void* data,
    const int* shape,
    int dim,
    mlx_dtype dtype,
    void* payload,
    void (*dtor)(void*));

/** Make *arr refer to what src refers to (releasing what *arr held). */
MLXDIST_API int mlx_array_set(mlx_array* arr, const mlx_array src);
MLXDIST_API int mlx_array_set_bool(mlx_array* arr, bool val);
MLXDIST_API int mlx_array_set_int(mlx_array* arr, int val);
MLXDIST_API int mlx_array_set_float32(mlx_array* arr, float val);
MLXDIST_API int mlx_array_set_float(mlx_array* arr, float val);
MLXDIST_API int mlx_array_set_float64(mlx_array* arr, double val);
MLXDIST_API int mlx_array_set_double(mlx_array* arr, double val);
MLXDIST_API int mlx_array_set_complex(
    mlx_array* arr,
    float real_val,
    float imag_val);
/** Replace *arr with a new array holding a copy of data (as mlx_array_new_data). */
MLXDIST_API int mlx_array_set_data(
    mlx_array* arr,
    const void* data,
    const int* shape,
    int dim,
    mlx_dtype dtype);

/* Metadata (0 / NULL for an empty handle). These never wait. */
MLXDIST_API size_t mlx_array_itemsize(const mlx_array arr);
MLXDIST_API size_t mlx_array_size(const mlx_array arr);
MLXDIST_API size_t mlx_array_nbytes(const mlx_array arr);
MLXDIST_API size_t mlx_array_ndim(const mlx_array arr);
MLXDIST_API const int* mlx_array_shape(const mlx_array arr);
MLXDIST_API const size_t* mlx_array_strides(const mlx_array arr);
/** Size of axis dim (negative counts from the end); an error and 0 if out of range. */
MLXDIST_API int mlx_array_dim(const mlx_array arr, int dim);
MLXDIST_API mlx_dtype mlx_array_dtype(const mlx_array arr);

/** Wait until the array is computed. Non-zero (and the failure's message) if the work that produces it failed. */
MLXDIST_API int mlx_array_eval(mlx_array arr);

/*
 * item: the single element (the array must have exactly one element).
 * data: a pointer to the elements (waits for a pending array).
 * The buffer is reinterpreted when the C type's size equals the dtype's size
 * (so bfloat16 bits can be read with the uint16 accessors); a size mismatch,
 * an empty handle or a failed array is an error (non-zero / NULL).
 */
MLXDIST_API int mlx_array_item_bool(bool* res, const mlx_array arr);
MLXDIST_API int mlx_array_item_uint8(uint8_t* res, const mlx_array arr);
MLXDIST_API int mlx_array_item_uint16(uint16_t* res, const mlx_array arr);
MLXDIST_API int mlx_array_item_uint32(uint32_t* res, const mlx_array arr);
MLXDIST_API int mlx_array_item_uint64(uint64_t* res, const mlx_array arr);
MLXDIST_API int mlx_array_item_int8(int8_t* res, const mlx_array arr);
MLXDIST_API int mlx_array_item_int16(int16_t* res, const mlx_array arr);
MLXDIST_API int mlx_array_item_int32(int32_t* res, const mlx_array arr);
MLXDIST_API int mlx_array_item_int64(int64_t* res, const mlx_array arr);
MLXDIST_API int mlx_array_item_float32(float* res, const mlx_array arr);
MLXDIST_API int mlx_array_item_float64(double* res, const mlx_array arr);
MLXDIST_API int mlx_array_item_complex64(
    mlx_complex64_t* res,
    const mlx_array arr);
#ifdef HAS_FLOAT16
MLXDIST_API int mlx_array_item_float16(float16_t* res, const mlx_array arr);
#endif
#ifdef HAS_BFLOAT16
MLXDIST_API int mlx_array_item_bfloat16(bfloat16_t* res, const mlx_array arr);
#endif

MLXDIST_API const bool* mlx_array_data_bool(const mlx_array arr);
MLXDIST_API const uint8_t* mlx_array_data_uint8(const mlx_array arr);
MLXDIST_API const uint16_t* mlx_array_data_uint16(const mlx_array arr);
MLXDIST_API const uint32_t* mlx_array_data_uint32(const mlx_array arr);
MLXDIST_API const uint64_t* mlx_array_data_uint64(const mlx_array arr);
MLXDIST_API const int8_t* mlx_array_data_int8(const mlx_array arr);
MLXDIST_API const int16_t* mlx_array_data_int16(const mlx_array arr);
MLXDIST_API const int32_t* mlx_array_data_int32(const mlx_array arr);
MLXDIST_API const int64_t* mlx_array_data_int64(const mlx_array arr);
MLXDIST_API const float* mlx_array_data_float32(const mlx_array arr);
MLXDIST_API const double* mlx_array_data_float64(const mlx_array arr);
MLXDIST_API const mlx_complex64_t* mlx_array_data_complex64(
    const mlx_array arr);
#ifdef HAS_FLOAT16
MLXDIST_API const float16_t* mlx_array_data_float16(const mlx_array arr);
#endif
#ifdef HAS_BFLOAT16
MLXDIST_API const bfloat16_t* mlx_array_data_bfloat16(const mlx_array arr);
#endif

#ifdef __cplusplus
}
#endif
#endif /* MLX_ARRAY_H */

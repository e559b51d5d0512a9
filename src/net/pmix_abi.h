/* Private: the part of the PMIx client ABI that mlxdist uses, declared by
 * hand so that the library builds without PMIx's headers (libpmix is opened
 * at run time, net/pmix.c). Every struct, constant and key here
 * is checked against the real <pmix.h> where it is installed (Debian's
 * libpmix-dev) by the test config_pmix_abi (tests/config/test_pmix_abi.c).
 *
 * The layout has been the same from PMIx 3 to PMIx 5 (the standard's v3+):
 * pmix_proc_t is a 256-byte namespace and a 32-bit rank; pmix_value_t a
 * 16-bit type tag and a union whose largest member (pmix_envar_t: two
 * pointers and a char) makes it 24 bytes; pmix_info_t a 512-byte key, a
 * 32-bit flags word and a value. */
#ifndef MLXD_PMIX_ABI_H
#define MLXD_PMIX_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MLXD_PMIX_MAX_NSLEN 255
#define MLXD_PMIX_MAX_KEYLEN 511

typedef int mlxd_pmix_status;
typedef uint32_t mlxd_pmix_rank;
typedef uint16_t mlxd_pmix_data_type;
typedef uint8_t mlxd_pmix_scope;

#define MLXD_PMIX_SUCCESS 0
#define MLXD_PMIX_ERR_TIMEOUT (-24)
#define MLXD_PMIX_ERR_NOT_FOUND (-46)
#define MLXD_PMIX_OPERATION_SUCCEEDED (-157) /* an _nb call completed at once, no callback */
#define MLXD_PMIX_RANK_WILDCARD (UINT32_MAX - 1)
#define MLXD_PMIX_GLOBAL 3 /* pmix_scope_t: share with every process of the job */

/* pmix_data_type_t values */
#define MLXD_PMIX_BOOL 1
#define MLXD_PMIX_STRING 3
#define MLXD_PMIX_SIZE 4
#define MLXD_PMIX_INT 6
#define MLXD_PMIX_UINT16 13
#define MLXD_PMIX_UINT32 14
#define MLXD_PMIX_BYTE_OBJECT 27
#define MLXD_PMIX_PROC_RANK 40

/* keys (attribute names) */
#define MLXD_PMIX_KEY_JOB_SIZE "pmix.job.size"     /* uint32: processes in the job */
#define MLXD_PMIX_KEY_LOCAL_RANK "pmix.lrank"      /* uint16: rank on this node in the job */
#define MLXD_PMIX_KEY_LOCAL_SIZE "pmix.local.size" /* uint32: processes of the job on this node */
#define MLXD_PMIX_KEY_COLLECT_DATA "pmix.collect"  /* bool: a fence collects the data put */
#define MLXD_PMIX_KEY_TIMEOUT "pmix.timeout"       /* int: seconds before an op times out */

typedef struct mlxd_pmix_proc {
  char nspace[MLXD_PMIX_MAX_NSLEN + 1];
  mlxd_pmix_rank rank;
} mlxd_pmix_proc;

typedef struct mlxd_pmix_byte_object {
  char* bytes;
  size_t size;
} mlxd_pmix_byte_object;

typedef struct mlxd_pmix_value {
  mlxd_pmix_data_type type;
  union {
    bool flag;
    char* string;
    size_t size;
    int integer;
    uint16_t uint16;
    uint32_t uint32;
    mlxd_pmix_rank rank;
    mlxd_pmix_byte_object bo;
    struct { /* pmix_envar_t: the union's largest member, kept for its size */
      char* envar;
      char* value;
      char separator;
    } envar;
  } data;
} mlxd_pmix_value;

typedef struct mlxd_pmix_info {
  char key[MLXD_PMIX_MAX_KEYLEN + 1];
  uint32_t flags; /* pmix_info_directives_t */
  mlxd_pmix_value value;
} mlxd_pmix_info;

/* the callbacks of the non-blocking calls */
typedef void (*mlxd_pmix_op_cbfunc)(mlxd_pmix_status status, void* cbdata);
typedef void (*mlxd_pmix_value_cbfunc)(mlxd_pmix_status status, mlxd_pmix_value* kv, void* cbdata);

/* The entry points, with PMIx's names and signatures. */
typedef mlxd_pmix_status (*mlxd_pmix_init_fn)(mlxd_pmix_proc* proc, mlxd_pmix_info info[],
                                              size_t ninfo);
typedef mlxd_pmix_status (*mlxd_pmix_finalize_fn)(const mlxd_pmix_info info[], size_t ninfo);
typedef mlxd_pmix_status (*mlxd_pmix_put_fn)(mlxd_pmix_scope scope, const char key[],
                                             mlxd_pmix_value* val);
typedef mlxd_pmix_status (*mlxd_pmix_commit_fn)(void);
typedef mlxd_pmix_status (*mlxd_pmix_fence_nb_fn)(const mlxd_pmix_proc procs[], size_t nprocs,
                                                  const mlxd_pmix_info info[], size_t ninfo,
                                                  mlxd_pmix_op_cbfunc cbfunc, void* cbdata);
typedef mlxd_pmix_status (*mlxd_pmix_get_nb_fn)(const mlxd_pmix_proc* proc, const char key[],
                                                const mlxd_pmix_info info[], size_t ninfo,
                                                mlxd_pmix_value_cbfunc cbfunc, void* cbdata);
typedef const char* (*mlxd_pmix_error_string_fn)(mlxd_pmix_status status);
typedef const char* (*mlxd_pmix_get_version_fn)(void);

#endif

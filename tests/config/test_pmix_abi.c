/* The PMIx ABI that net/pmix_abi.h declares by hand, checked
 * against the real <pmix.h> (built only where CMake finds it: Debian's
 * libpmix-dev; the library never includes it): every struct of the same size
 * and alignment, every member used at the same offset and of the same size,
 * every constant and key the same, every entry point's type the same. A
 * mismatch fails the build of this test. */
#include <pmix.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "net/pmix_abi.h"

#define SAME(ours, theirs, field)                                                    \
  _Static_assert(offsetof(ours, field) == offsetof(theirs, field), #field " moved"); \
  _Static_assert(sizeof(((ours*)0)->field) == sizeof(((theirs*)0)->field), #field " resized")
#define SAME_STRUCT(ours, theirs)                                  \
  _Static_assert(sizeof(ours) == sizeof(theirs), #theirs " size"); \
  _Static_assert(_Alignof(ours) == _Alignof(theirs), #theirs " alignment")
#define SAME_VALUE(ours, theirs) _Static_assert((long long)(ours) == (long long)(theirs), #theirs)

SAME_VALUE(MLXD_PMIX_MAX_NSLEN, PMIX_MAX_NSLEN);
SAME_VALUE(MLXD_PMIX_MAX_KEYLEN, PMIX_MAX_KEYLEN);
_Static_assert(sizeof(mlxd_pmix_status) == sizeof(pmix_status_t), "pmix_status_t");
_Static_assert(sizeof(mlxd_pmix_rank) == sizeof(pmix_rank_t), "pmix_rank_t");
_Static_assert(sizeof(mlxd_pmix_data_type) == sizeof(pmix_data_type_t), "pmix_data_type_t");
_Static_assert(sizeof(mlxd_pmix_scope) == sizeof(pmix_scope_t), "pmix_scope_t");
_Static_assert(sizeof(uint32_t) == sizeof(pmix_info_directives_t), "pmix_info_directives_t");

SAME_VALUE(MLXD_PMIX_SUCCESS, PMIX_SUCCESS);
SAME_VALUE(MLXD_PMIX_ERR_TIMEOUT, PMIX_ERR_TIMEOUT);
SAME_VALUE(MLXD_PMIX_ERR_NOT_FOUND, PMIX_ERR_NOT_FOUND);
SAME_VALUE(MLXD_PMIX_OPERATION_SUCCEEDED, PMIX_OPERATION_SUCCEEDED);
SAME_VALUE(MLXD_PMIX_RANK_WILDCARD, PMIX_RANK_WILDCARD);
SAME_VALUE(MLXD_PMIX_GLOBAL, PMIX_GLOBAL);
SAME_VALUE(MLXD_PMIX_BOOL, PMIX_BOOL);
SAME_VALUE(MLXD_PMIX_STRING, PMIX_STRING);
SAME_VALUE(MLXD_PMIX_SIZE, PMIX_SIZE);
SAME_VALUE(MLXD_PMIX_INT, PMIX_INT);
SAME_VALUE(MLXD_PMIX_UINT16, PMIX_UINT16);
SAME_VALUE(MLXD_PMIX_UINT32, PMIX_UINT32);
SAME_VALUE(MLXD_PMIX_BYTE_OBJECT, PMIX_BYTE_OBJECT);
SAME_VALUE(MLXD_PMIX_PROC_RANK, PMIX_PROC_RANK);

SAME(mlxd_pmix_proc, pmix_proc_t, nspace);
SAME(mlxd_pmix_proc, pmix_proc_t, rank);
SAME_STRUCT(mlxd_pmix_proc, pmix_proc_t);
SAME(mlxd_pmix_byte_object, pmix_byte_object_t, bytes);
SAME(mlxd_pmix_byte_object, pmix_byte_object_t, size);
SAME_STRUCT(mlxd_pmix_byte_object, pmix_byte_object_t);
SAME(mlxd_pmix_value, pmix_value_t, type);
SAME(mlxd_pmix_value, pmix_value_t, data);
SAME(mlxd_pmix_value, pmix_value_t, data.flag);
SAME(mlxd_pmix_value, pmix_value_t, data.string);
SAME(mlxd_pmix_value, pmix_value_t, data.size);
SAME(mlxd_pmix_value, pmix_value_t, data.integer);
SAME(mlxd_pmix_value, pmix_value_t, data.uint16);
SAME(mlxd_pmix_value, pmix_value_t, data.uint32);
SAME(mlxd_pmix_value, pmix_value_t, data.rank);
SAME(mlxd_pmix_value, pmix_value_t, data.bo);
SAME(mlxd_pmix_value, pmix_value_t, data.bo.bytes);
SAME(mlxd_pmix_value, pmix_value_t, data.bo.size);
SAME(mlxd_pmix_value, pmix_value_t, data.envar);
SAME_STRUCT(mlxd_pmix_value, pmix_value_t);
SAME(mlxd_pmix_info, pmix_info_t, key);
SAME(mlxd_pmix_info, pmix_info_t, flags);
SAME(mlxd_pmix_info, pmix_info_t, value);
SAME_STRUCT(mlxd_pmix_info, pmix_info_t);

/* the entry points: each of PMIx's declarations has exactly the signature our pointer type
 * has, written here in PMIx's own types (which the asserts above show are ours) */
#define SAME_FN(fn, ...) _Static_assert(_Generic(&fn, __VA_ARGS__ : 1, default : 0), #fn)
SAME_FN(PMIx_Init, pmix_status_t (*)(pmix_proc_t*, pmix_info_t[], size_t));
SAME_FN(PMIx_Finalize, pmix_status_t (*)(const pmix_info_t[], size_t));
SAME_FN(PMIx_Put, pmix_status_t (*)(pmix_scope_t, const char[], pmix_value_t*));
SAME_FN(PMIx_Commit, pmix_status_t (*)(void));
SAME_FN(PMIx_Fence_nb, pmix_status_t (*)(const pmix_proc_t[], size_t, const pmix_info_t[], size_t,
                                         void (*)(pmix_status_t, void*), void*));
SAME_FN(PMIx_Get_nb,
        pmix_status_t (*)(const pmix_proc_t*, const char[], const pmix_info_t[], size_t,
                          void (*)(pmix_status_t, pmix_value_t*, void*), void*));
SAME_FN(PMIx_Error_string, const char* (*)(pmix_status_t));
SAME_FN(PMIx_Get_version, const char* (*)(void));

int main(void) {
  /* the keys are strings: compared at run time */
  struct {
    const char *ours, *theirs;
  } keys[] = {
      {MLXD_PMIX_KEY_JOB_SIZE, PMIX_JOB_SIZE},     {MLXD_PMIX_KEY_LOCAL_RANK, PMIX_LOCAL_RANK},
      {MLXD_PMIX_KEY_LOCAL_SIZE, PMIX_LOCAL_SIZE}, {MLXD_PMIX_KEY_COLLECT_DATA, PMIX_COLLECT_DATA},
      {MLXD_PMIX_KEY_TIMEOUT, PMIX_TIMEOUT},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (strcmp(keys[i].ours, keys[i].theirs) != 0) {
      printf("key %s: <pmix.h> says %s\n", keys[i].ours, keys[i].theirs);
      bad = 1;
    }
  printf("pmix_abi: %s (PMIx %ld.%ld.%ld headers)\n",
         bad ? "MISMATCH" : "the hand-declared ABI matches", PMIX_VERSION_MAJOR, PMIX_VERSION_MINOR,
         PMIX_VERSION_RELEASE);
  return bad;
}

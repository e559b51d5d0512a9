/* The PMIx server of the test cluster, checked without mlxdist (tests/slurm/slurm.sh starts
 * one per task with `srun --mpi=pmix`): when this fails, the cluster is at fault, not the
 * library's PMIx bootstrap.
 *
 *   pmix_probe
 *
 * PMIx_Init; the job size and this process's local rank, local size and node id from the
 * server; PMIx_Put of a record that only this rank can know (its rank, its hostname, its
 * pid), Commit, a Fence that collects the data, and PMIx_Get of every rank's record, each
 * checked field by field; PMIX_RANK must equal SLURM_PROCID. Prints one line
 * "pmix_probe: rank R of N on HOST (local rank L of M): every record right" and exits 0;
 * any failure prints what was wrong and exits 1. */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KEY "mlxdist.probe"

static pmix_proc_t self;

static int fail(const char* what, pmix_status_t rc) {
  fprintf(stderr, "pmix_probe: rank %d: %s: %s\n", (int)self.rank, what, PMIx_Error_string(rc));
  return 1;
}

/* A uint32 job or node attribute of this process (PMIX_RANK_WILDCARD: job-level keys). */
static int get_u32(const char* key, pmix_rank_t rank, uint32_t* out) {
  pmix_proc_t p;
  PMIX_LOAD_PROCID(&p, self.nspace, rank);
  pmix_value_t* v = NULL;
  pmix_status_t rc = PMIx_Get(&p, key, NULL, 0, &v);
  if (rc != PMIX_SUCCESS) return fail(key, rc);
  int bad = 0;
  if (v->type == PMIX_UINT32)
    *out = v->data.uint32;
  else if (v->type == PMIX_UINT16)
    *out = v->data.uint16;
  else
    bad = 1;
  if (bad) fprintf(stderr, "pmix_probe: rank %d: %s has type %d\n", (int)self.rank, key, v->type);
  PMIX_VALUE_RELEASE(v);
  return bad;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  pmix_status_t rc = PMIx_Init(&self, NULL, 0);
  if (rc != PMIX_SUCCESS) {
    fprintf(stderr, "pmix_probe: PMIx_Init: %s (is this a PMIx job: srun --mpi=pmix?)\n",
            PMIx_Error_string(rc));
    return 1;
  }
  uint32_t size = 0, lrank = 0, lsize = 0;
  if (get_u32(PMIX_JOB_SIZE, PMIX_RANK_WILDCARD, &size) ||
      get_u32(PMIX_LOCAL_SIZE, PMIX_RANK_WILDCARD, &lsize) ||
      get_u32(PMIX_LOCAL_RANK, self.rank, &lrank))
    return 1;
  const char* procid = getenv("SLURM_PROCID");
  if (!procid || atoi(procid) != (int)self.rank) {
    fprintf(stderr, "pmix_probe: PMIx rank %d but SLURM_PROCID %s\n", (int)self.rank,
            procid ? procid : "(unset)");
    return 1;
  }

  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "?");
  char rec[400];
  snprintf(rec, sizeof rec, "rank=%d host=%s pid=%d", (int)self.rank, host, (int)getpid());
  pmix_value_t val;
  PMIX_VALUE_LOAD(&val, rec, PMIX_STRING);
  if ((rc = PMIx_Put(PMIX_GLOBAL, KEY, &val)) != PMIX_SUCCESS) return fail("PMIx_Put", rc);
  PMIX_VALUE_DESTRUCT(&val);
  if ((rc = PMIx_Commit()) != PMIX_SUCCESS) return fail("PMIx_Commit", rc);

  pmix_proc_t all;
  PMIX_LOAD_PROCID(&all, self.nspace, PMIX_RANK_WILDCARD);
  pmix_info_t collect;
  bool yes = true;
  PMIX_INFO_LOAD(&collect, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
  rc = PMIx_Fence(&all, 1, &collect, 1);
  PMIX_INFO_DESTRUCT(&collect);
  if (rc != PMIX_SUCCESS) return fail("PMIx_Fence", rc);

  for (uint32_t r = 0; r < size; r++) {
    pmix_proc_t p;
    PMIX_LOAD_PROCID(&p, self.nspace, r);
    pmix_value_t* v = NULL;
    if ((rc = PMIx_Get(&p, KEY, NULL, 0, &v)) != PMIX_SUCCESS) {
      fprintf(stderr, "pmix_probe: rank %d: PMIx_Get of rank %u's record: %s\n", (int)self.rank, r,
              PMIx_Error_string(rc));
      return 1;
    }
    int got_rank = -1, got_pid = 0;
    char got_host[256] = {0};
    if (v->type != PMIX_STRING || !v->data.string ||
        sscanf(v->data.string, "rank=%d host=%255s pid=%d", &got_rank, got_host, &got_pid) != 3 ||
        got_rank != (int)r || got_pid <= 0) {
      fprintf(stderr, "pmix_probe: rank %d: rank %u's record is wrong: '%s'\n", (int)self.rank, r,
              v->type == PMIX_STRING && v->data.string ? v->data.string : "(not a string)");
      return 1;
    }
    if (r == self.rank && (strcmp(got_host, host) != 0 || got_pid != (int)getpid())) {
      fprintf(stderr, "pmix_probe: rank %d: its own record came back as '%s'\n", (int)self.rank,
              v->data.string);
      return 1;
    }
    PMIX_VALUE_RELEASE(v);
  }
  printf("pmix_probe: rank %d of %u on %s (local rank %u of %u): every record right\n",
         (int)self.rank, size, host, lrank, lsize);
  rc = PMIx_Finalize(NULL, 0);
  if (rc != PMIX_SUCCESS) return fail("PMIx_Finalize", rc);
  return 0;
}

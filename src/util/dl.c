/* Run-time library loading (dl.h). */
#include "util/dl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* dlsym hands functions back as void*; POSIX has them the same size. */
_Static_assert(sizeof(void*) == sizeof(void (*)(void)), "a function pointer fits a void*");

/* Append "; " (unless first) and s to err, truncating at err_n. */
static void add(char* err, size_t err_n, const char* s) {
  size_t l = strlen(err);
  if (l + 1 >= err_n) return;
  snprintf(err + l, err_n - l, "%s%s", l ? "; " : "", s);
}

void* mlxd_dl_open(const char* const* names, size_t nnames, const mlxd_dl_sym* syms, size_t nsyms,
                   const char** used, char* err, size_t err_n) {
  if (err_n) err[0] = '\0';
  void* h = NULL;
  const char* name = NULL;
  for (size_t i = 0; i < nnames && !h; i++) {
    h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) {
      name = names[i];
    } else {
      const char* d = dlerror();
      char one[400];
      /* dlerror's text names the file; a missing text still names it */
      snprintf(one, sizeof one, "%s", d ? d : names[i]);
      if (err_n) add(err, err_n, one);
    }
  }
  if (!h) {
    if (err_n && !nnames) snprintf(err, err_n, "no library to load");
    return NULL;
  }
  (void)dlerror(); /* clear any earlier text, so what follows a failed dlsym is its own */
  for (size_t i = 0; i < nsyms; i++) {
    void* p = dlsym(h, syms[i].name);
    if (!p) {
      const char* d = dlerror();
      if (err_n)
        snprintf(err, err_n, "%s has no %s (%s)", name, syms[i].name, d ? d : "dlsym failed");
      dlclose(h);
      return NULL;
    }
    memcpy(syms[i].slot, &p, sizeof p);
  }
  if (used) *used = name;
  return h;
}

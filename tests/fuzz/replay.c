/* Runs a fuzz target over files, without libFuzzer: `fuzz_<name>_replay DIR|FILE...`.
 * Every regular file under the given directories (one level) is passed to
 * LLVMFuzzerTestOneInput once. Built with every normal build, so the committed
 * corpus (seeds and every input that once crashed) is a regression test; a
 * crash or sanitizer report fails the test. Exit 0 after at least one input. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#define REPLAY_MAX_INPUT (16u << 20)

static int run_file(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return -1;
  }
  uint8_t* buf = malloc(REPLAY_MAX_INPUT);
  size_t n = buf ? fread(buf, 1, REPLAY_MAX_INPUT, f) : 0;
  fclose(f);
  if (!buf) return -1;
  /* A copy of exactly n bytes, so ASan sees reads past the input's end. */
  uint8_t* exact = malloc(n ? n : 1);
  if (!exact) {
    free(buf);
    return -1;
  }
  memcpy(exact, buf, n);
  free(buf);
  LLVMFuzzerTestOneInput(exact, n);
  free(exact);
  return 0;
}

int main(int argc, char** argv) {
  int inputs = 0;
  for (int i = 1; i < argc; i++) {
    struct stat sb;
    if (stat(argv[i], &sb) != 0) {
      fprintf(stderr, "replay: no such file or directory: %s\n", argv[i]);
      return 2;
    }
    if (!S_ISDIR(sb.st_mode)) {
      if (run_file(argv[i]) != 0) return 2;
      inputs++;
      continue;
    }
    DIR* d = opendir(argv[i]);
    if (!d) return 2;
    struct dirent* e;
    while ((e = readdir(d))) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
      if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
      if (run_file(path) != 0) {
        closedir(d);
        return 2;
      }
      inputs++;
    }
    closedir(d);
  }
  printf("replay: %d input%s, no crash\n", inputs, inputs == 1 ? "" : "s");
  return inputs > 0 ? 0 : 2;
}

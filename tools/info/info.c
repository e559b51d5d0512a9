/* mlxdist-info: the library version, the available backends, and every
 * MLXDIST_* tunable (name, default, description) from src/util/tunables.h. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlx/c/distributed_group.h"
#include "mlx/c/string.h"
#include "mlx/c/version.h"
#include "util/tunables.h"

typedef struct mlxd_info_tunable {
  const char* name;
  const char* def;
  const char* doc;
} mlxd_info_tunable;

static const mlxd_info_tunable mlxd_info_tunables[] = {
#define MLXD_INFO_ROW(id, env, def, doc) {env, def, doc},
    MLXD_TUNABLES(MLXD_INFO_ROW)
#undef MLXD_INFO_ROW
};
#define MLXD_INFO_N (sizeof mlxd_info_tunables / sizeof mlxd_info_tunables[0])

static void mlxd_info_usage(FILE* f) {
  fputs("Usage: mlxdist-info [--env [--markdown]]\n"
        "\n"
        "  (no option)        print the library version and which backends are available\n"
        "  --env              print every MLXDIST_* environment variable: name, default,\n"
        "                     description, and the current value when it is set\n"
        "  --env --markdown   the same as a markdown table (docs/environment.md)\n"
        "  -h, --help         print this help\n",
        f);
}

/* Print s for a markdown table cell: '|' escaped. */
static void mlxd_md_cell(const char* s) {
  for (; *s; s++) {
    if (*s == '|') fputc('\\', stdout);
    fputc(*s, stdout);
  }
}

static void mlxd_print_env(bool markdown) {
  if (markdown) {
    puts("| Variable | Default | Description |");
    puts("|---|---|---|");
    for (size_t i = 0; i < MLXD_INFO_N; i++) {
      const mlxd_info_tunable* t = &mlxd_info_tunables[i];
      printf("| `%s` | ", t->name);
      if (t->def[0]) {
        fputc('`', stdout);
        mlxd_md_cell(t->def);
        fputc('`', stdout);
      } else {
        fputs("*(empty)*", stdout);
      }
      fputs(" | ", stdout);
      mlxd_md_cell(t->doc);
      puts(" |");
    }
    return;
  }
  for (size_t i = 0; i < MLXD_INFO_N; i++) {
    const mlxd_info_tunable* t = &mlxd_info_tunables[i];
    printf("%s (default: %s)\n    %s\n", t->name, t->def[0] ? t->def : "(empty)", t->doc);
    const char* cur = getenv(t->name);
    if (cur && *cur) printf("    currently set to: %s\n", cur);
  }
}

static int mlxd_print_summary(void) {
  mlx_string v = mlx_string_new();
  const char* ver = NULL;
  if (mlx_version(&v) == 0) ver = mlx_string_data(v);
  printf("mlxdist %s (mlx-c compatible distributed API)\n",
         ver && *ver ? ver : MLXDIST_VERSION_STRING);
  mlx_string_free(v);
  puts("backends:");
  static const char* const names[] = {"ring", "mpi", "nccl", "jaccl", "any"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    printf("  %-6s %s\n", names[i],
           mlx_distributed_is_available(names[i]) ? "available" : "not available");
  printf("environment: %zu MLXDIST_* variables (mlxdist-info --env)\n", MLXD_INFO_N);
  return 0;
}

int main(int argc, char** argv) {
  bool env = false, markdown = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--env") == 0) {
      env = true;
    } else if (strcmp(argv[i], "--markdown") == 0) {
      markdown = true;
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      mlxd_info_usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "[info] unknown argument '%s'; expected --env, --markdown or --help.\n",
              argv[i]);
      mlxd_info_usage(stderr);
      return 2;
    }
  }
  if (markdown && !env) {
    fputs("[info] --markdown only applies to --env; run 'mlxdist-info --env --markdown'.\n",
          stderr);
    return 2;
  }
  if (env) {
    mlxd_print_env(markdown);
    return 0;
  }
  return mlxd_print_summary();
}

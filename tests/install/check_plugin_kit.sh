#!/usr/bin/env bash
# The plugin author's kit, as someone outside this tree gets it: install mlxdist into a
# temporary prefix, build the example backend plugin (examples/plugin/uds.c) from a copy of
# its directory against the INSTALLED files only, once through CMake's find_package
# (mlxdist::plugin_abi) and once through pkg-config (mlxdist-plugin), then run real processes
# that init the "uds" backend by name and check every op's results (tests/install/
# plugin_ranks.c), and check that a strict init reports what is wrong.
#   usage: check_plugin_kit.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "check_plugin_kit: FAIL: $*" >&2; exit 1; }
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name 'libmlxdist.so' | head -n1)")
export PKG_CONFIG_PATH=$libdir/pkgconfig
export LD_LIBRARY_PATH=$libdir
unset MLX_RANK MLX_HOSTFILE MLX_WORLD_SIZE MLX_UDS_DIR MLXDIST_RENDEZVOUS MLXDIST_PLUGIN_PATH

# 1. The headers are installed, frozen (byte for byte the tree's), and self-contained.
for v in 1 2 3; do
  h=$prefix/include/mlx/c/plugin/plugin_v$v.h
  [ -f "$h" ] || fail "no installed $h"
  cmp -s "$h" "$src/include/mlx/c/plugin/plugin_v$v.h" || fail "$h differs from the tree's"
  # shellcheck disable=SC2046
  echo "#include <mlx/c/plugin/plugin_v$v.h>" |
    gcc -std=c99 -pedantic -Wall -Wextra -Werror -fsyntax-only -x c - \
      $(pkg-config --cflags mlxdist-plugin) || fail "plugin_v$v.h does not compile alone"
done
[ -z "$(find "$prefix/include" -name '.*')" ] || fail "hidden files installed: $(find "$prefix/include" -name '.*')"
[ -z "$(pkg-config --libs mlxdist-plugin)" ] ||
  fail "mlxdist-plugin.pc names libraries (a plugin must not link libmlxdist): $(pkg-config --libs mlxdist-plugin)"
[ "$(realpath "$(pkg-config --variable=plugindir mlxdist-plugin)")" = "$(realpath "$libdir")" ] ||
  fail "mlxdist-plugin.pc's plugindir is not the installed libdir"

# 2. The example, copied out of the tree, built with CMake against the installed package.
cp -r "$src/examples/plugin" "$work/uds-src"
cmake -S "$work/uds-src" -B "$work/uds-cmake" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_FLAGS="-Wall -Wextra -Wpedantic -Werror" >"$work/cmake.log" 2>&1 ||
  { cat "$work/cmake.log"; fail "find_package(mlxdist) + mlxdist::plugin_abi did not configure"; }
cmake --build "$work/uds-cmake" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log"; fail "the example plugin did not build through CMake"; }
grep -q "$prefix/include" "$work/uds-cmake/CMakeFiles/mlxdist-uds.dir/flags.make" ||
  fail "the CMake build did not take its headers from the installed prefix"

# 3. The same through pkg-config, with both compilers.
mkdir -p "$work/uds-pc"
for cc in gcc clang; do
  command -v $cc >/dev/null || continue
  # shellcheck disable=SC2046
  $cc -std=c17 -Wall -Wextra -Wpedantic -Werror -fPIC -shared -fvisibility=hidden \
    "$work/uds-src/uds.c" -o "$work/uds-pc/libmlxdist-uds.so" -pthread \
    $(pkg-config --cflags --libs mlxdist-plugin) || fail "the example plugin did not build with $cc"
done
for so in "$work/uds-cmake/libmlxdist-uds.so" "$work/uds-pc/libmlxdist-uds.so"; do
  exported=$(nm -D --defined-only "$so" | awk '{print $NF}')
  [ "$exported" = mlxdist_plugin_v3 ] || fail "$so exports more than mlxdist_plugin_v3: $exported"
  ! nm -D --undefined-only "$so" | awk '{print $NF}' | grep -qE '^_?mlxd?_' ||
    fail "$so needs libmlxdist symbols"
done

# 4. The test program, built against the installed library.
# shellcheck disable=SC2046
gcc -std=c17 -Wall -Wextra -Werror "$src/tests/install/plugin_ranks.c" -o "$work/plugin_ranks" \
  $(pkg-config --cflags --libs mlxdist)

run_ranks() {
  bash "$src/tests/install/uds_ranks.sh" "$work/plugin_ranks" "$2" "$1" "$3" ||
    fail "$1 ranks of plugin_ranks $3 with the plugin of $2"
}

# 5. Real groups: 3 ranks on the CMake build, 2 on the pkg-config build.
run_ranks 3 "$work/uds-cmake" ops
run_ranks 2 "$work/uds-pc" ops

# 6. Errors: unconfigured, a rank alone (bounded), a peer lost mid-job, no such plugin.
out=$(MLXDIST_PLUGIN_PATH=$work/uds-pc MLX_RANK=0 MLX_WORLD_SIZE=2 timeout 30 \
  "$work/plugin_ranks" unconf 2>&1) || { echo "$out"; fail "unconfigured strict init"; }
echo "  $out"
out=$(MLXDIST_PLUGIN_PATH=$work/uds-pc MLX_RANK=1 MLX_WORLD_SIZE=2 MLX_UDS_DIR=$work \
  MLXDIST_TIMEOUT=2 timeout 30 "$work/plugin_ranks" alone 2>&1) ||
  { echo "$out"; fail "a rank alone"; }
echo "  $out"
run_ranks 2 "$work/uds-pc" die
out=$(MLXDIST_PLUGIN_PATH=$work/uds-pc timeout 30 "$work/plugin_ranks" unknown nosuch 2>&1) ||
  { echo "$out"; fail "an unknown plugin name"; }
echo "  $out"
echo "check_plugin_kit: headers installed and frozen; the example plugin built out of the tree" \
  "(find_package, pkg-config) and ran 3 and 2 real ranks; strict init errors are clear"

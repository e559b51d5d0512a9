#!/usr/bin/env bash
# Install the built tree into a temporary prefix, then build two consumers
# against the INSTALLED files only: a C99 program through pkg-config (run
# under valgrind when available) and a CMake project through
# find_package(mlxdist).   usage: check_install.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name 'libmlxdist.so' | head -n1)")
export PKG_CONFIG_PATH=$libdir/pkgconfig
export LD_LIBRARY_PATH=$libdir
# The consumer must not find the launcher's variables.
unset MLX_RANK MLX_HOSTFILE MLX_WORLD_SIZE

fail() {
  echo "install check: $*" >&2
  exit 1
}
# pkg-config as a user sees it: the public headers and the library need nothing of cJSON or
# OpenSSL at build or link time (both are loaded at run time), so mlxdist.pc requires no other
# package: it resolves with only its own directory searched (no libcjson.pc, as on a host with
# the runtime packages only), and neither --cflags nor --static --libs names cjson or ssl.
for args in "--cflags" "--libs" "--cflags --libs" "--static --cflags --libs"; do
  # shellcheck disable=SC2086
  out=$(PKG_CONFIG_LIBDIR=$libdir/pkgconfig pkg-config $args mlxdist) ||
    fail "pkg-config $args mlxdist fails without other packages' .pc files"
  case $out in
    *cjson* | *ssl* | *crypto*) fail "pkg-config $args mlxdist names a run-time dependency: $out" ;;
  esac
done
# shellcheck disable=SC2046
ccflags=$(PKG_CONFIG_LIBDIR=$libdir/pkgconfig pkg-config --cflags mlxdist)
# the installed headers include nothing of cJSON or OpenSSL
# shellcheck disable=SC2086
hdrs=$(gcc -std=c99 -E -H $ccflags "$src/tests/install/consumer.c" 2>&1 >/dev/null | sed -n 's/^\.* //p')
echo "$hdrs" | grep -q 'mlx/c/mlx.h' || fail "the consumer did not include the installed mlx/c/mlx.h"
! echo "$hdrs" | grep -Ei 'cjson|openssl' || fail "the installed headers include cJSON or OpenSSL"
! grep -rqi cjson "$libdir/cmake/mlxdist" || fail "the installed CMake package names cJSON"

for cc in gcc clang; do
  command -v $cc >/dev/null || continue
  # shellcheck disable=SC2046
  $cc -std=c99 -pedantic -Wall -Wextra -Werror "$src/tests/install/consumer.c" \
    -o "$work/consumer-$cc" $(pkg-config --cflags --libs mlxdist)
done
"$work/consumer-gcc"
if command -v valgrind >/dev/null && [ "${MLXDIST_SKIP_VALGRIND:-0}" != 1 ]; then
  valgrind --quiet --error-exitcode=3 --leak-check=full --show-leak-kinds=definite,indirect,possible \
    --errors-for-leak-kinds=definite,indirect,possible "$work/consumer-gcc"
fi

# Static linking through pkg-config --static, with no other package's .pc file in reach: the
# program needs no libcjson (nor libssl, libcrypto) to link or to start.
# shellcheck disable=SC2046
gcc -std=c99 -pedantic -Wall -Wextra -Werror "$src/tests/install/consumer.c" \
  -o "$work/consumer-static" -Wl,-Bstatic -lmlxdist -Wl,-Bdynamic \
  $(PKG_CONFIG_LIBDIR=$libdir/pkgconfig pkg-config --cflags --libs --static mlxdist | sed 's/-lmlxdist//')
"$work/consumer-static"
! readelf -d "$work/consumer-static" | grep NEEDED | grep -Ei 'cjson|ssl|crypto|mlxdist' ||
  fail "the static consumer needs a shared library it should not"

mkdir -p "$work/cmake-consumer"
cat > "$work/cmake-consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer C)
find_package(mlxdist REQUIRED)
add_executable(consumer consumer.c)
target_link_libraries(consumer PRIVATE mlxdist::mlxdist)
add_executable(consumer-static consumer.c)
target_link_libraries(consumer-static PRIVATE mlxdist::mlxdist_static)
CM
cp "$src/tests/install/consumer.c" "$work/cmake-consumer/"
cmake -S "$work/cmake-consumer" -B "$work/cmake-consumer/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake-consumer/build" >/dev/null
"$work/cmake-consumer/build/consumer"
"$work/cmake-consumer/build/consumer-static"
echo "install check: pkg-config (no cJSON; gcc, clang, static), valgrind and find_package (shared, static) consumers passed"

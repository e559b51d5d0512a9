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

# Static linking through pkg-config --static.
# shellcheck disable=SC2046
gcc -std=c99 -pedantic -Wall -Wextra -Werror "$src/tests/install/consumer.c" \
  -o "$work/consumer-static" -Wl,-Bstatic -lmlxdist -Wl,-Bdynamic \
  $(pkg-config --cflags --libs --static mlxdist | sed 's/-lmlxdist//')
"$work/consumer-static"

mkdir -p "$work/cmake-consumer"
cat > "$work/cmake-consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer C)
find_package(mlxdist REQUIRED)
add_executable(consumer consumer.c)
target_link_libraries(consumer PRIVATE mlxdist::mlxdist)
CM
cp "$src/tests/install/consumer.c" "$work/cmake-consumer/"
cmake -S "$work/cmake-consumer" -B "$work/cmake-consumer/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake-consumer/build" >/dev/null
"$work/cmake-consumer/build/consumer"
echo "install check: pkg-config (gcc, clang, static), valgrind and find_package consumers passed"

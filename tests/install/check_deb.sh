#!/usr/bin/env bash
# The Debian package, as a user on another host gets it: build it with CPack from this build
# tree, install it with `dpkg -i` into a clean root (its own dpkg database, nothing else
# installed there), then use only what the package put there: its man pages render, a program
# builds against its headers through pkg-config and through CMake's find_package, and its own
# mlxdist-launch starts two ranks of that program, which sum over the ring and find the mpi
# plugin next to the library. Finally `dpkg -r` removes every file it installed.
#   usage: check_deb.sh SOURCE_DIR BUILD_DIR
# Skipped (77) without dpkg/dpkg-deb/cpack.
set -euo pipefail
src=$1
build=$2
for tool in dpkg dpkg-deb cpack gzip; do
  command -v $tool >/dev/null || { echo "check_deb: SKIPPED: $tool is not installed"; exit 77; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "check_deb: FAIL: $*" >&2; exit 1; }

# 1. The package (the same thing `cmake --build BUILD --target package` makes).
(cd "$work" && cpack --config "$build/CPackConfig.cmake" -B "$work/pkg" >"$work/cpack.log" 2>&1) ||
  { cat "$work/cpack.log"; fail "cpack could not build the package"; }
deb=$(find "$work/pkg" -maxdepth 1 -name 'mlxdist_*.deb' | head -n1)
[ -n "$deb" ] || fail "cpack wrote no mlxdist_*.deb (see above)"
dpkg-deb --field "$deb" Package Version Depends

# 2. A clean root with an empty dpkg database. The package's run-time dependencies (libc,
# cJSON, OpenSSL) are the host's, so dpkg is told not to look for them in this root.
root=$work/root
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/triggers"
: >"$root/var/lib/dpkg/status"
force=(--force-depends)
[ "$(id -u)" = 0 ] || force+=(--force-not-root --force-bad-path)
dpkg --root="$root" "${force[@]}" -i "$deb" >"$work/dpkg.log" 2>&1 ||
  { cat "$work/dpkg.log"; fail "dpkg -i failed"; }
status=$(dpkg --root="$root" -s mlxdist)
grep -q '^Status: install ok installed' <<<"$status" ||
  fail "dpkg does not list mlxdist as installed in the clean root"

libdir=$(dirname "$(find "$root/usr" -name libmlxdist.so | head -n1)")
[ -f "$libdir/libmlxdist.so" ] || fail "the package has no libmlxdist.so"
for f in usr/bin/mlxdist-launch usr/bin/mlxdist-bench usr/bin/mlxdist-info \
         usr/include/mlx/c/distributed.h usr/include/mlx/c/plugin/plugin_v1.h \
         usr/include/mlx/c/plugin/plugin_v2.h usr/include/mlx/c/plugin/plugin_v3.h; do
  [ -e "$root/$f" ] || fail "the package has no /$f"
done
[ -f "$libdir/pkgconfig/mlxdist.pc" ] || fail "the package has no mlxdist.pc"
[ -f "$libdir/pkgconfig/mlxdist-plugin.pc" ] || fail "the package has no mlxdist-plugin.pc"
[ -f "$libdir/cmake/mlxdist/mlxdistConfig.cmake" ] || fail "the package has no CMake package"
if [ -f "$build/libmlxdist-mpi.so" ]; then
  [ -f "$libdir/libmlxdist-mpi.so" ] || fail "the build has the mpi plugin but the package does not"
fi

# 3. Man pages: compressed, and they render without a warning.
for page in mlxdist-launch mlxdist-bench mlxdist-info; do
  man1=$root/usr/share/man/man1/$page.1.gz
  [ -f "$man1" ] || fail "the package has no man page for $page"
  gzip -t "$man1" || fail "$man1 is not a valid gzip file"
  if command -v groff >/dev/null; then
    warn=$(gzip -dc "$man1" | groff -man -ww -z 2>&1) || true
    [ -z "$warn" ] || fail "man page of $page: $warn"
    # (the whole page first: grep -q would stop reading early, and with pipefail
    # groff's SIGPIPE would fail the check)
    text=$(gzip -dc "$man1" | groff -man -Tutf8 2>/dev/null)
    grep -q "$page" <<<"$text" || fail "man page of $page does not render its name"
  fi
done

# 4. Build the example against the installed files only.
export PKG_CONFIG_PATH=$libdir/pkgconfig
unset MLX_RANK MLX_HOSTFILE MLX_WORLD_SIZE MLXDIST_RENDEZVOUS
# shellcheck disable=SC2046
gcc -std=c17 -Wall -Wextra -Werror "$src/examples/hello.c" -o "$work/hello" \
  $(pkg-config --cflags --libs mlxdist)
inc=$(pkg-config --cflags-only-I mlxdist | tr ' ' '\n' | sed -n 's/^-I//p' | head -n1)
[ "$(realpath "$inc")" = "$(realpath "$root/usr/include")" ] ||
  fail "pkg-config's include path is not the clean root's: $(pkg-config --cflags mlxdist)"
mkdir -p "$work/cm"
cp "$src/examples/hello.c" "$work/cm/"
cat >"$work/cm/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(hello C)
find_package(mlxdist REQUIRED)
add_executable(hello hello.c)
target_link_libraries(hello PRIVATE mlxdist::mlxdist)
CM
cmake -S "$work/cm" -B "$work/cm/build" -DCMAKE_PREFIX_PATH="$root/usr" >/dev/null ||
  fail "find_package(mlxdist) did not find the installed package"
cmake --build "$work/cm/build" >/dev/null || fail "the CMake consumer did not build"

# 5. Run it with the package's own launcher: two ranks, each prints the sum 0+1.
export LD_LIBRARY_PATH=$libdir
out=$(timeout 60 "$root/usr/bin/mlxdist-launch" -n 2 -- "$work/cm/build/hello" 2>&1) ||
  { echo "$out"; fail "the installed launcher could not run two ranks of the example"; }
echo "$out"
[ "$(grep -c 'sum of ranks = 1$' <<<"$out")" = 2 ] || fail "both ranks must print 'sum of ranks = 1'"
deps=$(ldd "$work/hello")
grep -q "$libdir/libmlxdist.so" <<<"$deps" ||
  fail "the example did not load the installed libmlxdist.so"
info=$("$root/usr/bin/mlxdist-info") || fail "the installed mlxdist-info does not run"
sed -n 1,8p <<<"$info"
# The mpi plugin is found next to the installed libmlxdist.so (the loader's second rule), as on
# a host where the package is installed for real.
if [ -f "$libdir/libmlxdist-mpi.so" ]; then
  cat >"$work/avail.c" <<'C'
#include <mlx/c/mlx.h>
#include <stdio.h>
int main(void) {
  bool mpi = mlx_distributed_is_available("mpi");
  printf("mpi available: %s\n", mpi ? "yes" : "no");
  return mpi ? 0 : 1;
}
C
  # shellcheck disable=SC2046
  gcc -std=c17 -Wall -Werror "$work/avail.c" -o "$work/avail" $(pkg-config --cflags --libs mlxdist)
  MLXDIST_PLUGIN_PATH= "$work/avail" || fail "the installed library does not find the installed mpi plugin"
fi

# 5b. A plugin author's kit: the example backend plugin builds against the package's ABI
# headers through pkg-config (mlxdist-plugin) and find_package (mlxdist::plugin_abi), and the
# installed library loads it by name.
mkdir -p "$work/uds-pc"
# shellcheck disable=SC2046
gcc -std=c17 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden "$src/examples/plugin/uds.c" \
  -o "$work/uds-pc/libmlxdist-uds.so" -pthread $(pkg-config --cflags --libs mlxdist-plugin) ||
  fail "the example plugin did not build through mlxdist-plugin.pc"
cp -r "$src/examples/plugin" "$work/uds-src"
cmake -S "$work/uds-src" -B "$work/uds-cm" -DCMAKE_PREFIX_PATH="$root/usr" >/dev/null ||
  fail "find_package(mlxdist) did not give mlxdist::plugin_abi"
cmake --build "$work/uds-cm" >/dev/null || fail "the example plugin did not build through CMake"
cat >"$work/avail_uds.c" <<'C'
#include <mlx/c/mlx.h>
#include <stdio.h>
int main(void) {
  bool ok = mlx_distributed_is_available("uds");
  printf("uds available: %s\n", ok ? "yes" : "no");
  return ok ? 0 : 1;
}
C
# shellcheck disable=SC2046
gcc -std=c17 -Wall -Werror "$work/avail_uds.c" -o "$work/avail_uds" $(pkg-config --cflags --libs mlxdist)
for d in "$work/uds-pc" "$work/uds-cm"; do
  MLXDIST_PLUGIN_PATH=$d "$work/avail_uds" || fail "the installed library does not load $d/libmlxdist-uds.so"
done

# 6. Removal leaves nothing of the package behind.
dpkg --root="$root" "${force[@]}" -r mlxdist >"$work/dpkg-r.log" 2>&1 ||
  { cat "$work/dpkg-r.log"; fail "dpkg -r failed"; }
left=""
[ ! -d "$root/usr" ] || left=$(find "$root/usr" -type f -o -type l | head -n 5)
[ -z "$left" ] || fail "files left after dpkg -r: $left"
echo "check_deb: package built, installed into a clean root, used and removed"

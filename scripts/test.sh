#!/usr/bin/env bash
# The whole test suite: check the formatting (clang-format), then build and run
# every test three times — a normal build (warnings are errors, gcc),
# AddressSanitizer + UndefinedBehaviorSanitizer, and ThreadSanitizer — plus a
# warnings-as-errors build with clang, the mpi plugin's tests against MPICH
# (Open MPI is the default everywhere else) and a short run of every fuzz
# target (MLXDIST_FUZZ_SECONDS each, default 15).
#   usage: scripts/test.sh [--setup]
# --setup (or MLXDIST_SETUP=1) first installs the Debian packages the tests need
# (scripts/setup-debian.sh, as root or through sudo); without it the script
# installs nothing, so a fresh machine needs it once.
# MLXDIST_TEST_QUICK=1 runs only the normal build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
setup=${MLXDIST_SETUP:-0}
for arg in "$@"; do
  case $arg in
    --setup) setup=1 ;;
    -h | --help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "scripts/test.sh: unknown argument '$arg' (expected --setup or --help)" >&2; exit 2 ;;
  esac
done
if [ "$setup" = 1 ]; then
  bash "$root/scripts/setup-debian.sh"
fi
jobs=$(nproc)
out=${MLXDIST_TEST_BUILD_ROOT:-$root}

configure_build() {
  local dir=$1
  shift
  cmake -S "$root" -B "$out/$dir" -DMLXDIST_WERROR=ON "$@" >/dev/null
  cmake --build "$out/$dir" -j"$jobs" 2>&1 | grep -v '^\[' || true
  # grep swallows the build's status: check the build really finished.
  cmake --build "$out/$dir" -j"$jobs" >/dev/null
}
run_ctest() {
  local dir=$1
  shift
  (cd "$out/$dir" && ctest --output-on-failure --timeout 600 "$@")
}

echo "== format (clang-format, .clang-format) =="
# Every tracked C file as clang-format leaves it; a diff names the file and line.
if command -v clang-format >/dev/null && git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$root" && git ls-files -z '*.c' '*.h' | xargs -0 clang-format --dry-run --Werror)
else
  echo "format check skipped: needs clang-format and a git checkout"
fi

echo "== build + tests (gcc, -Werror) =="
configure_build build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo
run_ctest build-test
[ "${MLXDIST_TEST_QUICK:-0}" = 1 ] && exit 0

echo "== clang build (-Werror) =="
CC=clang configure_build build-clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMLXDIST_BUILD_TESTS=ON

echo "== the mpi plugin against MPICH (mpicc.mpich, mpiexec.mpich) =="
if command -v mpicc.mpich >/dev/null && command -v mpiexec.mpich >/dev/null; then
  configure_build build-mpich -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMPI_C_COMPILER="$(command -v mpicc.mpich)" -DMPIEXEC_EXECUTABLE="$(command -v mpiexec.mpich)"
  run_ctest build-mpich -L mpi -R '^(mpi_|distributed_plugin_mpi)' -E '^mpi_a2a_big'
else
  echo "MPICH stage skipped: mpicc.mpich / mpiexec.mpich not installed (scripts/setup-debian.sh)"
fi

echo "== fuzz targets (libFuzzer + ASan/UBSan, ${MLXDIST_FUZZ_SECONDS:-15} s each) =="
# A short run in CI; scripts/fuzz.sh 600 is the long run (docs/security.md).
FUZZ_BUILD="$out/build-fuzz" bash "$root/scripts/fuzz.sh" "${MLXDIST_FUZZ_SECONDS:-15}"

echo "== tests under AddressSanitizer + UndefinedBehaviorSanitizer =="
configure_build build-asan -DCMAKE_BUILD_TYPE=Debug -DMLXDIST_SANITIZE=address,undefined
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# multihost (sshd in network namespaces, tests/multihost), slurm (a Slurm cluster in network
# namespaces, tests/slurm), vm (a soft-RoCE VM under qemu, tests/vm) and scale (jobs of 64 and
# more ranks, tests/scale and tests/ring) run in the gcc build only. Label asan_skip: tests that
# run no code another test in this run does not (each says why, next to its add_test).
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  run_ctest build-asan -LE 'install|mpi|multihost|slurm|vm|scale|asan_skip'
# Open MPI unloads its components (dlclose) in MPI_Finalize, so LeakSanitizer
# cannot tell whose their leftover allocations are (it reports "unknown
# module" frames). The MPI tests run with every ASan/UBSan check but leak
# detection; mlxdist's own leaks are checked by the other tests and valgrind.
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 run_ctest build-asan -L mpi -LE asan_skip

echo "== tests under ThreadSanitizer =="
configure_build build-tsan -DCMAKE_BUILD_TYPE=Debug -DMLXDIST_SANITIZE=thread
# The conformance program checks its largest size (1 Mi elements) for four dtypes instead of
# all 14 here (MLXDIST_TEST_LIGHT): the references cost ~10x under TSan, and the data races
# TSan looks for do not depend on the element type; the other builds check every dtype.
# Label tsan_skip: tests whose threads other tests here run too (TSan sees the threads of one
# process, not the ranks of a job: a bigger shape of the same program adds no thread), or
# whose check does not depend on the build; each says why next to its add_test.
MLXDIST_TEST_LIGHT=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  run_ctest build-tsan -LE 'install|mpi|multihost|slurm|vm|scale|tsan_skip'
echo "== all test runs passed =="

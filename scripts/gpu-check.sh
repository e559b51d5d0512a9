#!/usr/bin/env bash
# The GPU check of the nccl backend (issue 24, docs/nccl.md), for a machine
# with an NVIDIA GPU, the CUDA runtime and NCCL (headers and libraries):
# configures a build with the nccl plugin, builds it, then runs
#   nccl_gpu_provider  the core's GPU provider and GPU streams (managed memory,
#                      copies, stream sync, devices and their errors)
#   nccl_gpu_plugin    one-rank NCCL communicators through the plugin's table: every
#                      op and dtype against the CPU result, the dtypes NCCL lacks
#                      refused, split, an init whose peer never comes (timeout, abort)
#   nccl_gpu_tworank   two ranks through the API: one GPU: NCCL's refusal of two ranks
#                      on one GPU, reported within a bound; two or more GPUs: all_sum on
#                      the null stream (the GPU stream), a CPU stream refused,
#                      clear_backends with a live communicator
#   nccl_*             the GPU-less tests too (the exchange over sockets)
# and exits non-zero on any failure. Bounded: ~8 minutes in all.
# Without a GPU it builds nothing and exits 77 (skipped), saying why.
#   usage: scripts/gpu-check.sh [BUILD_DIR]     (default: build-gpu)
#   env:   CUDA_HOME / NCCL_HOME: where the headers are, when not /usr/local/cuda
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
start=$(date +%s)

have_gpu() {
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    return 0
  fi
  ls /dev/nvidia[0-9]* >/dev/null 2>&1
}
if ! have_gpu; then
  echo "gpu-check: SKIP: no NVIDIA GPU here (nvidia-smi -L lists none, no /dev/nvidia<N>)"
  exit 77
fi
nvidia-smi -L 2>/dev/null || true

echo "== configure ($build)"
if ! timeout 120 cmake -S "$root" -B "$build" -DMLXDIST_WERROR=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build.configure.log" 2>&1; then
  cat "$build.configure.log"
  echo "gpu-check: FAIL: configure failed"
  exit 1
fi
if ! grep -q "building the nccl backend plugin" "$build.configure.log"; then
  grep -i "nccl\|cuda" "$build.configure.log"
  echo "gpu-check: FAIL: the CUDA runtime or NCCL headers were not found (set CUDA_HOME/NCCL_HOME)"
  exit 1
fi
grep "nccl" "$build.configure.log"

echo "== build"
if ! timeout 300 cmake --build "$build" -j"$(nproc)" \
    --target mlxdist mlxdist-nccl mlxdist-info test_nccl_gpu test_nccl_exchange \
    test_nccl_none >"$build.build.log" 2>&1; then
  tail -40 "$build.build.log"
  echo "gpu-check: FAIL: build failed"
  exit 1
fi

echo "== mlxdist-info"
MLXDIST_PLUGIN_PATH="$build" timeout 30 "$build/tools/mlxdist-info" | sed -n '1,12p'

echo "== tests"
left=$((480 - ($(date +%s) - start)))
if [ "$left" -lt 60 ]; then
  echo "gpu-check: FAIL: the build left only ${left}s of the 8 minutes for the tests"
  exit 1
fi
cd "$build" || exit 1
# Every nccl test; the GPU ones must RUN here (a skip is a failure on a GPU machine).
timeout "$left" ctest -L nccl --output-on-failure --timeout 180 | tee "$build.ctest.log"
rc=${PIPESTATUS[0]}
if grep -E "nccl_gpu_[a-z]+ .*(Skipped|Not Run)" "$build.ctest.log"; then
  echo "gpu-check: FAIL: a GPU test was skipped on a machine with a GPU (see its output)"
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  echo "gpu-check: FAIL (ctest exit $rc)"
  exit 1
fi
echo "gpu-check: PASS in $(($(date +%s) - start)) s"

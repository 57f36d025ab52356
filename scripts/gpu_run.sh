#!/usr/bin/env bash
# Builds weightsync on the GPU machine and runs the GPU tests and/or the GPU benchmark there
# (docs/gpu.md). The machine has CUDA, NCCL and torch but no package registry: the Debian
# packages the build needs travel in .devdeps/ (scripts/fetch_devdeps.sh) and are unpacked here.
#   scripts/gpu_run.sh build|test|bench|all     logs go to $OUT (default /tmp/ws-gpu)
#   scripts/gpu_run.sh build TARGET...           only these CMake targets (faster)
#   scripts/gpu_run.sh test NAME...              only these test binaries (e.g. gpu_convert_test)
#   scripts/gpu_run.sh bench [gpu_update.py flags, e.g. --skip-torch --skip-staged]
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/ws-gpu}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PREFIX=/tmp/ws-deps/usr
if [ -d .devdeps ] && [ ! -d "$PREFIX" ]; then
  for f in .devdeps/*.deb; do dpkg -x "$f" /tmp/ws-deps; done
fi
export LD_LIBRARY_PATH="$PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
BUILD=${BUILD:-build-gpu}

build() {
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  { nvidia-smi -L; nvcc --version | tail -1; cmake --version | head -1; g++ --version | head -1; } \
    > "$OUT/env.txt" 2>&1
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DWS_CUDA=ON \
    -DCMAKE_PREFIX_PATH="$PREFIX" -DOPENSSL_ROOT_DIR="$PREFIX" > "$OUT/configure.log" 2>&1 &&
  cmake --build "$BUILD" -j"$(nproc)" "${targets[@]}" > "$OUT/build.log" 2>&1
  local rc=$?
  tail -30 "$OUT/build.log"
  return $rc
}

gpu_tests() {
  local rc=0 list=()
  if [ $# -gt 0 ]; then
    for n in "$@"; do list+=("$BUILD/tests/$n"); done
  else
    list=("$BUILD"/tests/gpu_*_test "$BUILD"/tests/cuda_*_test)
  fi
  for t in "${list[@]}"; do
    [ -x "$t" ] || continue
    echo "== $t"
    timeout 300 "$t" --gtest_brief=1 > "$OUT/$(basename "$t").log" 2>&1
    local r=$?
    tail -4 "$OUT/$(basename "$t").log"
    [ $r -eq 0 ] || rc=1
  done
  return $rc
}

bench() {
  python3 bench/gpu_update.py --build "$BUILD" --json "$OUT/gpu_update.json" "$@" \
    2> "$OUT/bench_stderr.log" | tee "$OUT/gpu_update_table.txt"
}

case "$what" in
  build) shift; build "$@" ;;
  test) shift; gpu_tests "$@" ;;
  bench) shift; bench "$@" ;;
  all) build && gpu_tests; bench ;;
esac

#!/usr/bin/env bash
# The Python package on the GPU machine: builds it with the GPU data plane, runs the GPU tests
# (pytest -m gpu), the GPU example and, on request, the Python GPU benchmark. docs/python.md,
# "Install and test on a GPU machine"; docs/gpu.md, "From Python".
#
#   scripts/python_gpu_test.sh [all]              build, test, example (default)
#   scripts/python_gpu_test.sh build              pip install into $SITE only
#   scripts/python_gpu_test.sh test [pytest args] build, then pytest -m gpu python/tests
#   scripts/python_gpu_test.sh example [args]     build, then examples/torch_gpu_rl/run.py
#   scripts/python_gpu_test.sh bench-build        the C++ bench binary only (build-gpu/bench/
#                                                 ws_gpu_update, the bench's `cpp` row)
#   scripts/python_gpu_test.sh bench [args]       build, then bench/python_gpu_update.py (builds
#                                                 ws_gpu_update too if it is missing)
#   WHEEL=.whl/weightsync-…-cp312-…whl scripts/python_gpu_test.sh test
#                                                 the same with a built wheel (make wheel; carry
#                                                 .whl) installed instead of building from source:
#                                                 the portable wheel's GPU run (issue 17)
#   scripts/python_gpu_test.sh regions [args]     build, then bench/regions_update.py --device
#                                                 cuda (FSDP-4 into TP-2 on one GPU, regions vs
#                                                 gathering; default --scale 1 --steps 5)
# Each command builds first (incremental: build-py/ keeps the CMake build; SKIP_BUILD=1 skips it),
# so a fresh machine needs nothing else. Expected times on the H200 machine (estimates until the
# first run): build 2-3 min from scratch, tests about 5 min, example 1-2 min, bench-build 2-3 min,
# bench 5-8 min: run them as separate commands (SKIP_BUILD=1 after the first) where one command
# may take at most 10 minutes.
#
# The machine has CUDA, torch, CuPy, JAX and transformers in its Python (python3; $PYTHON
# overrides) but no package registry: the Debian -dev packages the build needs travel in .devdeps/
# (scripts/fetch_devdeps.sh; carry it) and are unpacked under /tmp/ws-deps, as scripts/gpu_run.sh
# does; pytest, if the interpreter lacks it, comes from .devdeps/wheels/. The package is installed
# with `pip install --target $SITE` (default /tmp/site) and used through PYTHONPATH.
#   OUT   logs and results (default /tmp/ws-gpu)     JOBS  compile jobs (default: nproc)
#   TEST_TIMEOUT, EXAMPLE_TIMEOUT, BENCH_TIMEOUT  seconds (default 540, 300, 570)
# Every Python process runs with faulthandler on (PYTHONFAULTHANDLER=1) and under `timeout`,
# which sends SIGABRT first (faulthandler then prints every thread's stack) and SIGKILL 15 s
# later.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
[ $# -gt 0 ] && shift
OUT=${OUT:-/tmp/ws-gpu}
SITE=${SITE:-/tmp/site}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
PREFIX=/tmp/ws-deps/usr
if [ -d .devdeps ] && [ ! -d "$PREFIX" ]; then
  for f in .devdeps/*.deb; do dpkg -x "$f" /tmp/ws-deps; done
fi
export LD_LIBRARY_PATH="$PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
say() { echo "python_gpu_test: $*"; }
# timeout with a stack dump: SIGABRT lets faulthandler print every thread, SIGKILL follows.
bounded() { local s=$1; shift; timeout --signal=ABRT --kill-after=15 "$s" "$@"; }

# A built wheel instead of a source build (WHEEL=path): installed with no dependencies and no
# index into $SITE, and the tests must import it from there (never python/weightsync).
install_wheel() {
  say "installing $WHEEL into $SITE (log: $OUT/build.log)"
  "$PYTHON" -m pip install --no-deps --no-index --upgrade --target "$SITE" "$WHEEL" \
    > "$OUT/build.log" 2>&1 || { tail -5 "$OUT/build.log"; return 1; }
  local from
  from=$("$PYTHON" -c 'import weightsync, os; print(os.path.dirname(weightsync.__file__))') ||
    return 1
  case "$from" in
    "$SITE"/*) say "weightsync imports from $from" ;;
    *) say "weightsync imports from $from, not the wheel in $SITE"; return 1 ;;
  esac
  "$PYTHON" -c 'import weightsync; print(weightsync.cuda_status())' | tee -a "$OUT/env.txt"
}

build() {
  if [ -n "${WHEEL:-}" ]; then install_wheel; return $?; fi
  {
    nvidia-smi -L; nvcc --version | tail -1; cmake --version | head -1; "${CXX:-g++}" --version |
      head -1; "$PYTHON" --version
    "$PYTHON" -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
    "$PYTHON" -c 'import cupy; print("cupy", cupy.__version__)'
    "$PYTHON" -c 'import jax; print("jax", jax.__version__, jax.devices())'
    "$PYTHON" -c 'import transformers; print("transformers", transformers.__version__)'
  } > "$OUT/env.txt" 2>&1
  # The build dependencies (scikit-build-core, nanobind) are in the interpreter: no isolation, no
  # downloads. --upgrade replaces an earlier build in $SITE (pip --target keeps it otherwise).
  say "building into $SITE (log: $OUT/build.log)"
  CMAKE_BUILD_PARALLEL_LEVEL=$JOBS "$PYTHON" -m pip install --no-build-isolation --no-deps \
    --upgrade --target "$SITE" -Ccmake.define.CMAKE_PREFIX_PATH="$PREFIX" \
    -Ccmake.define.OPENSSL_ROOT_DIR="$PREFIX" -Ccmake.define.WS_CUDA=AUTO . \
    > "$OUT/build.log" 2>&1
  local rc=$?
  tail -5 "$OUT/build.log"
  [ $rc -eq 0 ] || return $rc
  "$PYTHON" -c 'import weightsync; print(weightsync.cuda_status())' | tee -a "$OUT/env.txt"
}

ensure_built() {
  if [ "${SKIP_BUILD:-0}" = 1 ]; then "$PYTHON" -c 'import weightsync' || build; else build; fi
}

ensure_pytest() {
  "$PYTHON" -c 'import pytest' 2>/dev/null && return 0
  shopt -s nullglob
  local wheels=(.devdeps/wheels/*.whl)
  [ ${#wheels[@]} -gt 0 ] || { say "no pytest here and no .devdeps/wheels/"; return 3; }
  "$PYTHON" -m pip install -q --no-index --no-deps --target "$SITE" "${wheels[@]}"
}

gpu_tests() {
  ensure_built || return $?
  ensure_pytest || return $?
  say "pytest -m gpu (log: $OUT/pytest_gpu.log)"
  bounded "${TEST_TIMEOUT:-540}" "$PYTHON" -m pytest python/tests -m gpu -v -rs \
    -p no:cacheprovider --junitxml="$OUT/pytest_gpu.xml" "$@" > "$OUT/pytest_gpu.log" 2>&1
  local rc=$?
  tail -40 "$OUT/pytest_gpu.log"
  say "pytest rc=$rc (124/134: timed out, stacks in the log)"
  return $rc
}

example() {
  ensure_built || return $?
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  local args=("$@")
  if [ ${#args[@]} -eq 0 ]; then
    args=(--steps 5)
    [ "$gpus" -ge 2 ] && args+=(--trainer-device cuda:0 --engine-device cuda:1)
  fi
  say "examples/torch_gpu_rl/run.py ${args[*]} (log: $OUT/example.log)"
  bounded "${EXAMPLE_TIMEOUT:-300}" "$PYTHON" examples/torch_gpu_rl/run.py "${args[@]}" \
    > "$OUT/example.log" 2>&1
  local rc=$?
  tail -25 "$OUT/example.log"
  say "example rc=$rc"
  return $rc
}

BUILD=${BUILD:-build-gpu}
bench_build() {
  say "building $BUILD/bench/ws_gpu_update (log: $OUT/bench_build.log)"
  { cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DWS_CUDA=ON -DWS_BUILD_TESTS=OFF \
      -DCMAKE_PREFIX_PATH="$PREFIX" -DOPENSSL_ROOT_DIR="$PREFIX" &&
    cmake --build "$BUILD" -j"$JOBS" --target ws_gpu_update; } > "$OUT/bench_build.log" 2>&1
  local rc=$?
  tail -3 "$OUT/bench_build.log"
  return $rc
}

bench() {
  ensure_built || return $?
  local build=$BUILD
  [ -x "$build/bench/ws_gpu_update" ] || bench_build || return $?
  say "bench/python_gpu_update.py (log: $OUT/python_gpu_update.log)"
  bounded "${BENCH_TIMEOUT:-570}" "$PYTHON" bench/python_gpu_update.py --build "$build" \
    --json "$OUT/python_gpu_update.json" "$@" 2> "$OUT/python_gpu_update.log" |
    tee "$OUT/python_gpu_update_table.txt"
  local rc=${PIPESTATUS[0]}
  say "bench rc=$rc"
  return $rc
}

regions() {
  ensure_built || return $?
  say "bench/regions_update.py --device cuda (log: $OUT/regions_update.log)"
  bounded "${BENCH_TIMEOUT:-570}" "$PYTHON" bench/regions_update.py --device cuda --scale 1 \
    --steps 5 --json "$OUT/regions_update.json" "$@" 2> "$OUT/regions_update.log" |
    tee "$OUT/regions_update_table.txt"
  local rc=${PIPESTATUS[0]}
  say "regions rc=$rc"
  return $rc
}

case "$what" in
  build) build ;;
  regions) regions "$@" ;;
  test) gpu_tests "$@" ;;
  example) example "$@" ;;
  bench-build) bench_build ;;
  bench) bench "$@" ;;
  all)
    build || exit $?
    rc=0
    gpu_tests || rc=1
    example || rc=1
    exit $rc
    ;;
  *) say "unknown command '$what' (build|test|example|bench-build|bench|regions|all)"; exit 2 ;;
esac

#!/usr/bin/env bash
# Sanitizer CI jobs: the whole C++ test suite under ASan+UBSan (build-asan/) and under TSan
# (build-tsan/), each preceded by its canaries: deliberately broken programs built with the same
# flags that MUST fail with the sanitizer's report, so a job that cannot fail is caught.
#
#   scripts/ci_sanitizers.sh [asan|tsan|all]      (default all; asan = address,undefined)
#
# Environment:
#   JOBS          build and ctest parallelism (default 2)
#   ASAN_BUILD    build directory of the address,undefined job (default build-asan)
#   TSAN_BUILD    build directory of the thread job (default build-tsan)
#   ASAN_CXX      compiler of the address,undefined job: clang++ (default) or g++
#   CTEST_ARGS    extra ctest arguments, e.g. "-R Wire" to run a subset
#
# Every sanitizer report of every process (tests, helper processes they spawn, forked children)
# goes to <build>/sanitizer-logs/ (log_path), and the job fails if any report is found there, even
# when the test that caused it passed (a helper dying of an ASan abort can look like an expected
# "publisher died" to a fault test). Suppressions, if ever needed, live in .ci/sanitizers/ with a
# reason per entry. See docs/ci.md.
set -euo pipefail
# One compound command: bash reads all of it before running, so editing this file during a long
# run cannot change what the run does.
{
cd "$(dirname "$0")/.."

JOBS=${JOBS:-2}
ASAN_BUILD=${ASAN_BUILD:-build-asan}
TSAN_BUILD=${TSAN_BUILD:-build-tsan}
CTEST_ARGS=${CTEST_ARGS:-}
which=${1:-all}
case "$which" in asan|tsan|all) ;; *) echo "usage: $0 [asan|tsan|all]" >&2; exit 2 ;; esac

# The ASan+UBSan build compiles with clang (ASAN_CXX): GCC's UBSan instrumentation makes each file
# compile 2-3x as long as a plain one, clang's far less (the library 152 s -> 95 s, tests about a
# third less; docs/ci.md), and clang's sanitizers are the reference ones. The plain and TSan builds
# stay on GCC, so CI compiles everything with both compilers.
ASAN_CXX=${ASAN_CXX:-clang++}
case "$which" in
  asan|all) if [ "$ASAN_CXX" = clang++ ]; then bash scripts/install_deps.sh clang libclang-rt-dev
            else bash scripts/install_deps.sh; fi ;;
  *) bash scripts/install_deps.sh ;;
esac

log() { echo "ci_sanitizers: $*"; }
fail() { echo "ci_sanitizers: FAIL: $*" >&2; exit 1; }

# Runtime options. UBSan halts on the first report (the build also has -fno-sanitize-recover).
# ASan: leaks on, plus the checks that are off by default but cheap for this suite.
ASAN_BASE="detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1"
ASAN_BASE+=":strict_init_order=1"
# The CUDA driver maps memory inside ASan's shadow gap; without this, any binary that touches a GPU
# dies at its first CUDA call (a known ASan/CUDA interaction, not a weakened check of our code).
ASAN_BASE+=":protect_shadow_gap=0"
UBSAN_BASE="halt_on_error=1:print_stacktrace=1"
TSAN_BASE="halt_on_error=0:second_deadlock_stack=1:history_size=4"
for f in asan lsan ubsan tsan; do
  if [ -f ".ci/sanitizers/$f.supp" ]; then
    case $f in
      asan) ASAN_BASE+=":suppressions=$PWD/.ci/sanitizers/asan.supp" ;;
      lsan) LSAN_SUPP="suppressions=$PWD/.ci/sanitizers/lsan.supp" ;;
      ubsan) UBSAN_BASE+=":suppressions=$PWD/.ci/sanitizers/ubsan.supp" ;;
      tsan) TSAN_BASE+=":suppressions=$PWD/.ci/sanitizers/tsan.supp" ;;
    esac
  fi
done
export LSAN_OPTIONS=${LSAN_SUPP:-}

# expect_failure NAME PATTERN CMD... : the canary must exit non-zero AND print PATTERN.
expect_failure() {
  local name=$1 pattern=$2
  shift 2
  local out rc
  out=$("$@" 2>&1) && rc=0 || rc=$?
  if [ "$rc" -ne 0 ] && grep -q -- "$pattern" <<<"$out"; then
    log "canary $name failed as it must (exit $rc, \"$pattern\")"
  else
    echo "$out" | tail -30 >&2
    fail "canary $name did not fail with \"$pattern\" (exit $rc): this sanitizer job proves nothing"
  fi
}

# check_logs DIR: fail if any process left a sanitizer report there.
check_logs() {
  local dir=$1 reports
  reports=$(find "$dir" -type f -size +0 2>/dev/null | sort)
  if [ -n "$reports" ]; then
    for r in $reports; do
      echo "---- $r" >&2
      head -80 "$r" >&2
    done
    fail "$(wc -l <<<"$reports") sanitizer report(s) under $dir (see above)"
  fi
}

# No CUDA sources (src/**/*.cu): on a machine without a GPU they only answer "no device", and nvcc
# spends about 25 s of each sanitizer build on them; every host .cc file still builds, and
# src/cuda's stubs answer Unavailable as CUDA does without a driver. compute-sanitizer
# checks the CUDA code on the GPU machine (docs/gpu.md).
CPU_ONLY="-DWS_CUDA=OFF"

run_ctest() {
  local build=$1
  # shellcheck disable=SC2086
  (cd "$build" && ${WRAP:-} ctest --output-on-failure -j"$JOBS" --timeout 900 $CTEST_ARGS)
}

asan_job() {
  WRAP=""
  local t0=$SECONDS logs="$PWD/$ASAN_BUILD/sanitizer-logs"
  local cc=${ASAN_CXX/clang++/clang}
  cc=${cc/g++/gcc}
  cmake -S . -B "$ASAN_BUILD" -DCMAKE_CXX_COMPILER="$ASAN_CXX" -DCMAKE_C_COMPILER="$cc" \
    -DWS_SANITIZE=address,undefined -DWS_BUILD_BENCH=OFF -DWS_BUILD_GPU_TESTS=OFF $CPU_ONLY >/dev/null
  cmake --build "$ASAN_BUILD" -j"$JOBS" --target ws_sanitizer_canaries
  export ASAN_OPTIONS=$ASAN_BASE UBSAN_OPTIONS=$UBSAN_BASE
  expect_failure asan_heap_overflow "AddressSanitizer: heap-buffer-overflow" \
    "$ASAN_BUILD/ws_canary_asan_heap_overflow"
  expect_failure lsan_leak "LeakSanitizer: detected memory leaks" "$ASAN_BUILD/ws_canary_lsan_leak"
  expect_failure ubsan_signed_overflow "runtime error: signed integer overflow" \
    "$ASAN_BUILD/ws_canary_ubsan_signed_overflow"
  cmake --build "$ASAN_BUILD" -j"$JOBS"
  local t1=$SECONDS
  rm -rf "$logs" && mkdir -p "$logs"
  export ASAN_OPTIONS="$ASAN_BASE:log_path=$logs/asan"
  export UBSAN_OPTIONS="$UBSAN_BASE:log_path=$logs/ubsan"
  run_ctest "$ASAN_BUILD" || { check_logs "$logs"; fail "tests failed under address,undefined"; }
  check_logs "$logs"
  log "asan+ubsan: build+canaries $((t1 - t0)) s, ctest $((SECONDS - t1)) s"
  unset ASAN_OPTIONS UBSAN_OPTIONS
}

tsan_job() {
  local t0=$SECONDS logs="$PWD/$TSAN_BUILD/sanitizer-logs"
  # Without the suites that start no thread (tests/plan, tests/wire, tests/delta; tests/CMakeLists.txt):
  # nothing there for TSan to see, and a guard fails them if that ever changes.
  cmake -S . -B "$TSAN_BUILD" -DWS_SANITIZE=thread -DWS_BUILD_BENCH=OFF \
    -DWS_BUILD_GPU_TESTS=OFF -DWS_BUILD_THREADLESS_TESTS=OFF $CPU_ONLY >/dev/null
  cmake --build "$TSAN_BUILD" -j"$JOBS" --target ws_sanitizer_canaries
  export TSAN_OPTIONS=$TSAN_BASE
  # TSan runs without address-space randomization (setarch -R; children inherit it):
  #  - TSan only accepts mappings inside its application ranges; the highest one is about 1.5 TiB.
  #    The publisher reserves 1 TiB of address space per arena (src/core/publisher.cc
  #    kDefaultReserve), and with a randomized mmap base that reservation falls below the range in
  #    a good share of runs: Publisher::Create fails with ENOMEM and tests fail at random.
  #  - some kernels (high vm.mmap_rnd_bits) make older TSan runtimes die with "unexpected memory
  #    mapping" unless randomization is off.
  WRAP="setarch $(uname -m) -R"
  if ! $WRAP true 2>/dev/null; then
    log "WARNING: '$WRAP' is not permitted here; running TSan with ASLR (expect arena ENOMEM flakes)"
    WRAP=""
  fi
  # shellcheck disable=SC2086
  expect_failure tsan_data_race "ThreadSanitizer: data race" $WRAP \
    "$TSAN_BUILD/ws_canary_tsan_data_race"
  # The build runs test binaries (gtest_discover_tests), so it needs the wrapper too.
  # shellcheck disable=SC2086
  ${WRAP} cmake --build "$TSAN_BUILD" -j"$JOBS"
  local t1=$SECONDS
  rm -rf "$logs" && mkdir -p "$logs"
  export TSAN_OPTIONS="$TSAN_BASE:log_path=$logs/tsan"
  run_ctest "$TSAN_BUILD" || { check_logs "$logs"; fail "tests failed under thread"; }
  check_logs "$logs"
  log "tsan: build+canaries $((t1 - t0)) s, ctest $((SECONDS - t1)) s"
  unset TSAN_OPTIONS
}

case "$which" in
  asan) asan_job ;;
  tsan) tsan_job ;;
  all) asan_job; tsan_job ;;
esac
log "OK ($which)"
exit
}

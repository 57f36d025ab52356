#!/usr/bin/env bash
# Static CI checks (docs/ci.md), each preceded by a canary that MUST fail, so a check that cannot
# fail is caught:
#   format          every C++ source and header is clang-format clean (.clang-format: Google base,
#                   100 columns); canary .ci/canaries/misformatted.cc
#   thread-safety   the library, tests and CLI parsed by clang -Wthread-safety -Werror: every
#                   WS_GUARDED_BY member touched with its mutex held (src/util/mutex.h); canary
#                   .ci/canaries/thread_safety_violation.cc
#
#   scripts/ci_static.sh [format|thread-safety|all]     (default all)
# Environment: JOBS (default 2), TSA_BUILD (default build-tsa).
set -euo pipefail
{
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
TSA_BUILD=${TSA_BUILD:-build-tsa}
which=${1:-all}
case "$which" in format|thread-safety|all) ;; *) echo "usage: $0 [format|thread-safety|all]" >&2; exit 2 ;; esac
log() { echo "ci_static: $*"; }
fail() { echo "ci_static: FAIL: $*" >&2; exit 1; }

bash scripts/install_deps.sh clang clang-format

if [ "$which" = format ] || [ "$which" = all ]; then
  if clang-format --dry-run --Werror .ci/canaries/misformatted.cc >/dev/null 2>&1; then
    fail "canary misformatted.cc passed the format check: the check proves nothing"
  fi
  log "canary misformatted.cc failed the format check as it must"
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' | grep -v '^\.ci/canaries/')
  if ! clang-format --dry-run --Werror "${files[@]}"; then
    fail "files above are not clang-format clean: run clang-format -i on them"
  fi
  log "format: ${#files[@]} files clean"
fi

if [ "$which" = thread-safety ] || [ "$which" = all ]; then
  flags="-Wthread-safety -Werror=thread-safety -Wno-unused-command-line-argument"
  out=$(clang++ -std=c++20 $flags -Isrc -Iinclude -fsyntax-only \
          .ci/canaries/thread_safety_violation.cc 2>&1) && rc=0 || rc=$?
  if [ "$rc" -eq 0 ] || ! grep -q "requires holding mutex" <<<"$out"; then
    echo "$out" | tail -20 >&2
    fail "canary thread_safety_violation.cc compiled: the thread-safety check proves nothing"
  fi
  log "canary thread_safety_violation.cc failed to compile as it must"
  # The analysis runs in clang's front end: every compile command of the configured build (library,
  # tests, CLI, benchmarks) runs with -fsyntax-only, as the canary above does. Objects, links and
  # the test binaries' listing would only cost time; build type None keeps -O and -g out.
  cmake -S . -B "$TSA_BUILD" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DWS_CUDA=OFF \
        -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
        >/dev/null
  python3 scripts/syntax_check.py "$TSA_BUILD" "$JOBS" || fail "thread-safety errors above"
  log "thread-safety: library, tests, CLI and benchmarks clean"
fi
exit
}

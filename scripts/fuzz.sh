#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang (coverage + ASan + UBSan) and runs each one for
# FUZZ_SECONDS. Fails if the build fails, if any target crashes, leaks, hangs, exceeds its memory
# limit or violates one of its properties, or if the canary target does NOT crash.
#
#   scripts/fuzz.sh [--regen-corpus] [--no-canary] [TARGET...]     (default: all four targets)
#
# Environment:
#   FUZZ_SECONDS   seconds per target (default 30)
#   FUZZ_BUILD     build directory (default build-fuzz); its corpus/<target>/ keeps what the
#                  fuzzer learned between local runs, artifacts/<target>/ holds crashing inputs
#   FUZZ_ARGS      extra libFuzzer flags, e.g. "-jobs=2 -workers=2" or "-use_value_profile=1"
#   JOBS           build parallelism (default 2)
#   CXX_FUZZ       compiler (default clang++)
#
# A crash leaves its input in $FUZZ_BUILD/artifacts/<target>/; reproduce with
#   $FUZZ_BUILD/<target> $FUZZ_BUILD/artifacts/<target>/crash-...
# See docs/ci.md.
set -euo pipefail
# One compound command: bash reads all of it before running, so editing this file during a long
# run cannot change what the run does.
{
cd "$(dirname "$0")/.."

FUZZ_SECONDS=${FUZZ_SECONDS:-30}
FUZZ_BUILD=${FUZZ_BUILD:-build-fuzz}
FUZZ_ARGS=${FUZZ_ARGS:-}
JOBS=${JOBS:-2}
CXX_FUZZ=${CXX_FUZZ:-clang++}
ALL_TARGETS=(frame_fuzz messages_fuzz handshake_fuzz delta_fuzz)

regen=0
canary=1
targets=()
for arg in "$@"; do
  case "$arg" in
    --regen-corpus) regen=1 ;;
    --no-canary) canary=0 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $arg" >&2; exit 2 ;;
    *) targets+=("$arg") ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")
if ! [[ "$FUZZ_SECONDS" =~ ^[0-9]+$ ]] || [ "$FUZZ_SECONDS" -lt 1 ]; then
  echo "fuzz.sh: FUZZ_SECONDS must be a positive integer, got '$FUZZ_SECONDS'" >&2
  exit 2
fi

# clang and its compiler-rt (libFuzzer, sanitizer runtimes) are only needed here, not by make test.
if [ "$CXX_FUZZ" = clang++ ]; then
  bash scripts/install_deps.sh clang libclang-rt-dev
else
  bash scripts/install_deps.sh
fi
if ! command -v "$CXX_FUZZ" >/dev/null; then
  echo "fuzz.sh: $CXX_FUZZ not found (libFuzzer needs clang; apt-get install clang)" >&2
  exit 1
fi

start=$SECONDS
cmake -S fuzz -B "$FUZZ_BUILD" -DCMAKE_CXX_COMPILER="$CXX_FUZZ" >/dev/null
cmake --build "$FUZZ_BUILD" -j"$JOBS"
echo "fuzz.sh: build took $((SECONDS - start)) s"

if [ "$regen" = 1 ]; then
  rm -rf fuzz/corpus
  "$FUZZ_BUILD/gen_corpus" fuzz/corpus
fi

# A sanitizer report ends the run with a stack trace; libFuzzer saves the input as an artifact.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

# run TARGET SECONDS → runs one target; sets rc, execs; log in $FUZZ_BUILD/logs/TARGET.log
run() {
  local t=$1 secs=$2
  local work="$FUZZ_BUILD/corpus/$t" art="$FUZZ_BUILD/artifacts/$t" log="$FUZZ_BUILD/logs/$t.log"
  mkdir -p "$work" "$art" "$(dirname "$log")"
  local seeds=()
  [ -d "fuzz/corpus/$t" ] && seeds=("fuzz/corpus/$t")
  # New inputs go to the first corpus directory (the build's), never into the checked-in seeds.
  # shellcheck disable=SC2086
  "$FUZZ_BUILD/$t" "$work" "${seeds[@]}" -max_total_time="$secs" -timeout=10 \
      -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 -artifact_prefix="$art/" \
      $FUZZ_ARGS >"$log" 2>&1 && rc=0 || rc=$?
  execs=$(awk '/stat::number_of_executed_units/ {n += $2} END {print n + 0}' "$log")
}

failed=()
if [ "$canary" = 1 ]; then
  # The canary must crash: otherwise the build is not instrumented or crashes go unnoticed.
  rm -rf "$FUZZ_BUILD/corpus/canary_fuzz" "$FUZZ_BUILD/artifacts/canary_fuzz"
  t0=$SECONDS
  run canary_fuzz 60
  if [ "$rc" -ne 0 ] && grep -q "ERROR: AddressSanitizer: heap-buffer-overflow" \
      "$FUZZ_BUILD/logs/canary_fuzz.log"; then
    echo "fuzz.sh: canary_fuzz crashed as it must (rc=$rc, $execs execs, $((SECONDS - t0)) s)"
  else
    echo "fuzz.sh: FAIL: canary_fuzz did not report its heap-buffer-overflow (rc=$rc)" >&2
    tail -40 "$FUZZ_BUILD/logs/canary_fuzz.log" >&2
    failed+=(canary_fuzz)
  fi
fi

summary=()
for t in "${targets[@]}"; do
  if [ ! -x "$FUZZ_BUILD/$t" ]; then
    echo "fuzz.sh: unknown target $t (have: ${ALL_TARGETS[*]})" >&2
    exit 2
  fi
  t0=$SECONDS
  echo "fuzz.sh: running $t for $FUZZ_SECONDS s"
  run "$t" "$FUZZ_SECONDS"
  corpus=$(find "$FUZZ_BUILD/corpus/$t" -type f | wc -l)
  line="$t: $((SECONDS - t0)) s, $execs execs, working corpus $corpus files, rc=$rc"
  summary+=("$line")
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    echo "fuzz.sh: FAIL: $line" >&2
    grep -E "ERROR:|runtime error:|fuzz property violated|SUMMARY:" "$FUZZ_BUILD/logs/$t.log" \
        | head -20 >&2 || true
    tail -60 "$FUZZ_BUILD/logs/$t.log" >&2
    for a in "$FUZZ_BUILD/artifacts/$t"/*; do
      [ -e "$a" ] && echo "fuzz.sh: reproduce: $FUZZ_BUILD/$t $a" >&2
    done
  fi
done

echo "fuzz.sh: summary (FUZZ_SECONDS=$FUZZ_SECONDS, total $((SECONDS - start)) s incl. build):"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: OK"
exit
}

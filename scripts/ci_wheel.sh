#!/usr/bin/env bash
# CI stage "wheel" (docs/ci.md): the portable wheels, tested the way a user gets them.
#   1. scripts/build_wheel.sh for every interpreter of WHEEL_PYTHONS found (default: 3.10 3.11
#      3.12 3.13; on PATH or through pyenv): .whl/weightsync-*-cp3XX-*-manylinux_*.whl
#   2. each into a fresh venv of its interpreter (the wheel and NumPy from PyPI, nothing else),
#      then scripts/wheel_smoke.py with the Debian libraries the wheels were built against hidden
#      (libxxhash, libcrypto, libssl bind-mounted over by /dev/null in a private mount namespace;
#      needs root and unshare, run unhidden with a note otherwise)
#   3. for python3's wheel: pytest python/tests but the tests marked slow, against the installed
#      wheel (never the source folder or the source build), in make test's .venv with the wheel
#      first on PYTHONPATH, or,
#      without a .venv, in a fresh venv with pytest, ml_dtypes, WHEEL_FRAMEWORKS (default: torch
#      transformers) and vLLM (scripts/install_vllm.sh; VLLM="" skips it)
# Prints how long each part took.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "ci_wheel: $*"; }
t0=$SECONDS
source <(sed -n '/^resolve_python() {/,/^}/p' scripts/build_wheel.sh)

pythons=()
for v in ${WHEEL_PYTHONS-3.10 3.11 3.12 3.13}; do
  if resolve_python "$v" >/dev/null; then pythons+=("$v"); else say "no Python $v: skipped"; fi
done
main=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
case " ${pythons[*]} " in *" $main "*) ;; *) pythons+=("$main") ;; esac
PYTHONS="${pythons[*]}" bash scripts/build_wheel.sh
t_build=$((SECONDS - t0))

want_cuda=()
[ "${WS_CUDA:-ON}" = ON ] && want_cuda=(--want-cuda)
hide=""
if [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null && unshare -m true 2>/dev/null; then
  for lib in libxxhash.so.0 libcrypto.so.3 libssl.so.3; do
    path=$(ldconfig -p | awk -v l="$lib" '$1 == l && !n++ {print $NF}')
    [ -n "$path" ] && hide+="mount --bind /dev/null $(readlink -f "$path"); "
  done
  say "smoke tests with the build's libraries hidden: $hide"
else
  say "not root or no unshare: smoke tests run with the Debian libraries visible"
fi
for v in "${pythons[@]}"; do
  venv=build-wheel/smoke-$v
  rm -rf "$venv"
  "$(resolve_python "$v")" -m venv "$venv"
  "$venv/bin/python" -m pip --disable-pip-version-check -q install \
    .whl/weightsync-*-cp"${v/./}"-*.whl
  if [ -n "$hide" ]; then
    unshare -m sh -c "$hide exec \"$venv/bin/python\" scripts/wheel_smoke.py ${want_cuda[*]}"
  else
    "$venv/bin/python" scripts/wheel_smoke.py "${want_cuda[@]}"
  fi
done
t_smoke=$((SECONDS - t0 - t_build))

# The test environment: make test's .venv already holds the test dependencies (torch,
# transformers, vLLM, ...); the wheel goes into a folder of its own, first on PYTHONPATH, so every
# import of weightsync (in the tests and in the processes they start) is the wheel's. Without a
# .venv (this script run alone), a fresh venv is made with those dependencies.
site=build-wheel/wheel-site
rm -rf "$site"
if [ -x .venv/bin/python ] && .venv/bin/python -c 'import pytest, xdist, ml_dtypes' 2>/dev/null; then
  PY=.venv/bin/python
  say "test environment: .venv (make test's) with the wheel in $site"
else
  venv=build-wheel/test-venv
  rm -rf "$venv"
  python3 -m venv "$venv"
  PY="$venv/bin/python"
  "$PY" -m pip --disable-pip-version-check -q install pytest pytest-xdist ml_dtypes
  for fw in ${WHEEL_FRAMEWORKS-torch transformers}; do
    "$PY" -m pip --disable-pip-version-check -q install "$fw" ||
      say "$fw not installed; its tests will skip"
  done
  bash scripts/install_vllm.sh "$PY" "${VLLM-0.33.0}"
fi
"$PY" -m pip --disable-pip-version-check -q install --no-deps --target "$site" \
  .whl/weightsync-*-cp"${main/./}"-*.whl
export PYTHONPATH="$PWD/$site${PYTHONPATH:+:$PYTHONPATH}"
from=$("$PY" -c 'import weightsync, os; print(os.path.dirname(weightsync.__file__))')
case "$from" in
  "$PWD/$site"/*) say "weightsync imports from the wheel: $from" ;;
  *) say "FAIL: weightsync imports from $from, not the wheel"; exit 1 ;;
esac
t_venv=$((SECONDS - t0 - t_build - t_smoke))
# From the repository root: python/weightsync (no extension) is not on sys.path there. Tests
# marked slow (pyproject.toml) are left out: seconds of behaviour each (an RSS slope over 100,000
# updates, killed and stalled publishers, the examples) that make test ran minutes ago on the same
# compiled objects (scripts/python_test.sh builds through ccache, the wheel's objects are its).
# On JOBS workers (pytest-xdist, as scripts/python_test.sh); the workers inherit PYTHONPATH.
"$PY" -m pytest python/tests -q -p no:cacheprovider -n "${JOBS:-2}" -m "not slow" "$@"
say "wheels ${t_build} s, smoke tests ${t_smoke} s, test venv ${t_venv} s," \
    "tests $((SECONDS - t0 - t_build - t_smoke - t_venv)) s, in all $((SECONDS - t0)) s"

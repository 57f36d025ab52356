#!/usr/bin/env bash
# Downloads (does not install) the Debian packages the GPU machine needs to build weightsync into
# .devdeps/, which travels with the working tree to that machine (it has no package registry):
# `carry` it in the device call, and scripts/gpu_run.sh (and scripts/python_gpu_test.sh) unpack it
# under /tmp/ws-deps. docs/gpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .devdeps
grep -qx '/.devdeps/' .git/info/exclude 2>/dev/null || {
  mkdir -p "$(git rev-parse --git-dir)/info"
  echo '/.devdeps/' >> "$(git rev-parse --git-dir)/info/exclude"
}
cd .devdeps
apt-get download libxxhash-dev libxxhash0 libasio-dev libgtest-dev googletest libssl-dev libssl3 \
  libcli11-dev nlohmann-json3-dev \
  >/dev/null
ls -1 *.deb
# pytest for scripts/python_gpu_test.sh, in case the GPU machine's Python lacks it: pure-Python
# wheels, installed there with --no-index into its --target folder.
PY=${PYTHON:-python3}
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --platform any \
  --platform manylinux2014_x86_64 -d wheels pytest ||
  echo "fetch_devdeps: pytest wheels not downloaded (scripts/python_gpu_test.sh then needs pytest)"
ls -1 wheels 2>/dev/null

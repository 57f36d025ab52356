#!/usr/bin/env bash
# Installs vLLM for python/tests/test_vllm.py into the venv of interpreter $1:
#   bash scripts/install_vllm.sh VENV/bin/python [VERSION]     (default 0.33.0; "" does nothing)
# The wheel without its dependencies (they pin torch and transformers to versions the other tests
# do not use), then the modules that importing its weight-transfer, model-loader and worker
# modules reaches (PLATFORM.md). Needs torch in that venv; does nothing without it, or when that
# version is there already. Never fails the caller: without vLLM those tests skip. ~40 s.
set -uo pipefail
PY=$1
VERSION=${2-0.33.0}
say() { echo "install_vllm: $*"; }
[ -n "$VERSION" ] || exit 0
"$PY" -c 'import torch' 2>/dev/null || { say "no torch in $PY: skipped"; exit 0; }
"$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm') != sys.argv[1])" \
  "$VERSION" 2>/dev/null && exit 0

IMPORT_DEPS=(psutil pyzmq urllib3 cbor2 aiohttp requests openai-harmony openai pybase64
  cachetools msgspec cloudpickle uvloop py-cpuinfo prometheus_client fastapi partial_json_parser
  einops xgrammar llguidance pillow)
# pip reports the pins it cannot honour (torch, transformers): deliberate, so its output is shown
# only when an install fails.
quietly() {
  local out
  out=$("$PY" -m pip --disable-pip-version-check -q install "$@" 2>&1) || {
    echo "$out" >&2
    return 1
  }
}
t0=$SECONDS
if quietly --no-deps "vllm==$VERSION" && quietly "${IMPORT_DEPS[@]}"; then
  say "vllm $VERSION (no deps) and its import dependencies installed in $((SECONDS - t0)) s"
else
  say "vllm $VERSION not installed; its tests will skip"
fi
exit 0

#!/usr/bin/env bash
# The nccl row of bench/gpu_update under NCCL tuning variables, one process per variant (NCCL reads
# its environment once). Tells which knob moves the 7B-like in-place update toward the peer-copy
# limit; the winner becomes the transport's default (docs/gpu.md). Run on the 2-GPU machine after
#   scripts/gpu_run.sh build ws_gpu_update
#   scripts/nccl_env_sweep.sh [STEPS [VARIANT...]]   (one line per variant; raw JSON in $OUT)
# A VARIANT is a list of VAR=value assignments ("" = the default environment); MODE=staged runs the
# staged transfer instead of in place; ONLY picks the bench rows (default nccl).
set -uo pipefail
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/ws-gpu}
STEPS=${1:-10}
shift $(( $# > 0 ? 1 : 0 ))
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 WEIGHTSYNC_LOG_LEVEL=warn
PREFIX=/tmp/ws-deps/usr
export LD_LIBRARY_PATH="$PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
variants=(
  ""
  "NCCL_MIN_NCHANNELS=32"
  "NCCL_MIN_NCHANNELS=32 NCCL_PROTO=Simple"
  "NCCL_ALGO=Ring NCCL_PROTO=Simple"
)
[ $# -gt 0 ] && variants=("$@")
# Measured on 2xH200 (2026-11-30), 7B-like model, in place. With grouped ncclSend/ncclRecv (the
# transport until then): default 42.7 ms; within 0.3% of it NCCL_MIN_P2P_NCHANNELS=32,
# NCCL_MIN_CTAS=32 NCCL_MAX_CTAS=32, NCCL_P2P_NVL_CHUNKSIZE=2097152, NCCL_PROTO=Simple,
# NCCL_P2P_READ_ENABLE=0; slower NCCL_P2P_READ_ENABLE=1 (47.0 ms) and NCCL_P2P_USE_CUDA_MEMCPY=1
# (205 ms). Grouped ncclBroadcast instead (now the transport's primitive): 41.8 ms against 43.1 ms
# for send/recv in the same run; the variants above moved it by under 0.4%.
for v in "${variants[@]}"; do
  line=$(env $v "$BUILD/bench/ws_gpu_update" --steps "$STEPS" --mode "${MODE:-in_place}" --only "${ONLY:-nccl}" 2>>"$OUT/nccl_sweep_stderr.log" |
         grep '^{' | tail -1)
  echo "{\"variant\": \"${v:-default}\", \"mode\": \"${MODE:-in_place}\", \"row\": $line}" >> "$OUT/nccl_sweep.jsonl"
  echo "${v:-default}: $(echo "$line" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read() or "{}"); print(r.get("steady_median_s", r.get("median_s")), r.get("steady_GBps", r.get("GBps")))' 2>/dev/null)"
done

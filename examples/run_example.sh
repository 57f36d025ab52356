#!/usr/bin/env bash
# Runs an example's trainer and engine side by side on one fresh endpoint:
#   bash examples/run_example.sh numpy            # runs here (.venv from scripts/python_test.sh)
#   bash examples/run_example.sh torch            # wherever torch is installed
# Environment: PYTHON (default: ../.venv/bin/python, else python3), STEPS (20), and for numpy
# STYLE=register|receive.
set -euo pipefail
cd "$(dirname "$0")"
KIND=${1:-numpy}
PY=${PYTHON:-../.venv/bin/python}
[ -x "$PY" ] || PY=python3
ENDPOINT=local://${KIND}-example-$$
STEPS=${STEPS:-20}
extra=()
[ "$KIND" = numpy ] && extra=(--style "${STYLE:-register}")
"$PY" "${KIND}_trainer.py" --endpoint "$ENDPOINT" --steps "$STEPS" --linger 1 &
trainer=$!
"$PY" "${KIND}_engine.py" --endpoint "$ENDPOINT" --steps "$STEPS" "${extra[@]}"
wait "$trainer"

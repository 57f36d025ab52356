#!/usr/bin/env bash
# Runs the NumPy trainer and engine side by side on one endpoint (needs `pip install .`, e.g. the
# .venv that scripts/python_test.sh builds):  .venv/bin/python -c 1 && bash examples/run_numpy_example.sh
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-../.venv/bin/python}
[ -x "$PY" ] || PY=python3
ENDPOINT=local://numpy-example-$$
STEPS=${STEPS:-20}
"$PY" numpy_trainer.py --endpoint "$ENDPOINT" --steps "$STEPS" &
trainer=$!
"$PY" numpy_engine.py --endpoint "$ENDPOINT" --steps "$STEPS" --style "${STYLE:-register}"
wait "$trainer"

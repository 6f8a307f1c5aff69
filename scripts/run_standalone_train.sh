#!/usr/bin/env bash
# Train on one process.
#   bash scripts/run_standalone_train.sh CONFIG [SECTION.KEY=VALUE ...]
#   e.g. bash scripts/run_standalone_train.sh configs/smoke.yaml train.epochs=2
# PYTHON selects the interpreter (default: python3 on PATH, which must have mindgr installed).
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: bash $0 CONFIG [SECTION.KEY=VALUE ...]" >&2
  exit 2
fi
CONFIG=$(realpath "$1"); shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
exec "${PYTHON:-python3}" -m mindgr train --config "$CONFIG" "$@"

#!/usr/bin/env bash
# Data parallel training on N processes of this machine, launched with msrun (mccl on CPU, HCCL on Ascend).
#   bash scripts/run_distribute_train.sh N CONFIG [SECTION.KEY=VALUE ...]
#   e.g. bash scripts/run_distribute_train.sh 2 configs/smoke.yaml parallel.threads=1
# Rank 0's progress is printed; every rank's log is in RUN_DIR/msrun/worker_<rank>.log.
# Continue a stopped job (with the same or another N) by adding --resume.
# PYTHON selects the interpreter (default: python3 on PATH); its bin directory is put first on PATH
# for the ranks, as msrun starts `python` from PATH.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash $0 NPROC CONFIG [SECTION.KEY=VALUE ...] [--resume]" >&2
  exit 2
fi
NPROC=$1
CONFIG=$(realpath "$2"); shift 2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
exec "${PYTHON:-python3}" -m mindgr train --nproc "$NPROC" --config "$CONFIG" "$@"

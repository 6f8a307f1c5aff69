#!/usr/bin/env bash
# Build the AscendC HSTU attention ops (HstuJaggedAttention, HstuJaggedAttentionGrad) into a custom
# op package with MindSpore's bundled compiler (mindspore/lib/plugin/ascend/custom_compiler/setup.py),
# and say how to make MindSpore find it.
#
#   scripts/build_ascend_ops.sh [--soc ascend910b] [--out DIR] [--install [PATH]]
#
# Needs: the CANN toolkit environment (source <CANN>/set_env.sh: ASCEND_HOME_PATH, ASCEND_OPP_PATH),
# MindSpore >= 2.3 in $PYTHON (default: python3), cmake >= 3.16, bash. Nothing is downloaded.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/mindgr/ops/ascend"
PYTHON="${PYTHON:-python3}"
SOC="ascend910b"
OUT="${MINDGR_ASCEND_BUILD_DIR:-$ROOT/build/ascend_ops}"
VENDOR="mindgr"
INSTALL=""

die() { echo "build_ascend_ops: error: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --soc) SOC="${2:?--soc needs a value}"; shift 2 ;;
    --out) OUT="${2:?--out needs a directory}"; shift 2 ;;
    --install)
      if [ $# -gt 1 ] && [ "${2#--}" = "$2" ]; then INSTALL="$2"; shift 2; else INSTALL="default"; shift; fi ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

# ---- prerequisites, each with the way out --------------------------------------------------------
CANN="${ASCEND_HOME_PATH:-}"
if [ -z "$CANN" ]; then
  die "ASCEND_HOME_PATH is not set: install the CANN toolkit and run 'source <CANN>/set_env.sh' (e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh)"
fi
[ -d "$CANN" ] || die "ASCEND_HOME_PATH=$CANN is not a directory: fix it or re-source <CANN>/set_env.sh"
if [ ! -d "$CANN/tools/op_project_templates/ascendc/customize" ] && \
   [ ! -d "$CANN/tools/msopgen/template/operator_demo_projects/ascendc_operator_sample" ]; then
  die "$CANN has no AscendC operator project template (tools/op_project_templates/ascendc or tools/msopgen/template): install the CANN *toolkit* package, not only the runtime"
fi
[ -n "${ASCEND_OPP_PATH:-}" ] || die "ASCEND_OPP_PATH is not set: run 'source <CANN>/set_env.sh'"
command -v cmake >/dev/null 2>&1 || die "cmake (>= 3.16) is not on PATH: install it (e.g. 'pip install cmake')"
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found: set PYTHON to the interpreter that has MindSpore"
MS_DIR="$("$PYTHON" -c 'import os, mindspore; print(os.path.dirname(mindspore.__file__))' 2>/dev/null)" \
  || die "MindSpore is not importable by $PYTHON: pip install mindspore (2.10) into it"
COMPILER="$MS_DIR/lib/plugin/ascend/custom_compiler/setup.py"
[ -f "$COMPILER" ] || die "MindSpore's custom op compiler is missing ($COMPILER): use a MindSpore wheel for Ascend (>= 2.3)"
for f in op_host/hstu_jagged_attention.cpp op_host/hstu_jagged_attention_grad.cpp \
         op_kernel/hstu_jagged_attention.cpp op_kernel/hstu_jagged_attention_grad.cpp; do
  [ -f "$SRC/$f" ] || die "source $SRC/$f is missing"
done

# ---- build ----------------------------------------------------------------------------------------
# setup.py copies custom_compiler/ into a CustomProject next to itself and writes build.log to the
# current directory, so work on a private copy of the compiler directory.
rm -rf "$OUT"
mkdir -p "$OUT"
cp -r "$MS_DIR/lib/plugin/ascend/custom_compiler" "$OUT/custom_compiler"
cd "$OUT/custom_compiler"
ARGS=(-o "$SRC/op_host" -k "$SRC/op_kernel" --soc_version "$SOC" --vendor_name "$VENDOR"
      --ascend_cann_package_path "$CANN")
if [ -n "$INSTALL" ]; then
  if [ "$INSTALL" = "default" ]; then ARGS+=(-i); else ARGS+=(--install_path "$INSTALL"); fi
fi
echo "build_ascend_ops: $PYTHON setup.py ${ARGS[*]}"
if ! "$PYTHON" setup.py "${ARGS[@]}"; then
  die "compilation failed: see $OUT/custom_compiler/build.log"
fi

PKG="$(find "$OUT/custom_compiler/CustomProject/build_out" -type d -path "*vendors/$VENDOR" 2>/dev/null | head -n 1)"
echo
echo "build_ascend_ops: built the '$VENDOR' custom op package for $SOC."
if [ -n "$INSTALL" ]; then
  DEST="$INSTALL"; [ "$INSTALL" = "default" ] && DEST="$ASCEND_OPP_PATH"
  echo "Installed under $DEST. Make MindSpore find it with:"
  echo "  export ASCEND_CUSTOM_OPP_PATH=$DEST/vendors/$VENDOR:\${ASCEND_CUSTOM_OPP_PATH:-}"
elif [ -n "$PKG" ]; then
  echo "Use it in place with:"
  echo "  export ASCEND_CUSTOM_OPP_PATH=$PKG:\${ASCEND_CUSTOM_OPP_PATH:-}"
  echo "or install the .run package: bash $OUT/custom_compiler/CustomProject/build_out/*.run"
else
  echo "Install the .run package: bash $OUT/custom_compiler/CustomProject/build_out/*.run"
fi
echo "Then check: python -c 'from mindgr.ops import ascend; print(ascend.unavailable_reason())'"

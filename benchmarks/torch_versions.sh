#!/usr/bin/env bash
# The test suite's fast subset (no multi-process end-to-end runs: -m "not slow") on another torch, in a venv of
# its own, so the floor `pyproject.toml` claims (`torch>=`) is one that was tested, not one that was hoped for.
#
#   bash benchmarks/torch_versions.sh VERSION [PIP_ARGS...]
#   bash benchmarks/torch_versions.sh 2.11.0 --index-url https://download.pytorch.org/whl/cpu
#
# VERSION is a torch release; PIP_ARGS go to the torch install (an index of CPU wheels keeps it small: PyPI's
# Linux wheels of torch are CUDA builds, about 0.8 GB plus 2-3 GB of nvidia-* wheels). The venv lives in a temp
# folder (kept with KEEP_VENV=1) and the log in $OUT (default: a temp folder). Exit code: pytest's.
# What ran where, and why the floor is what it is: docs/development.md ("The torch versions").
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash benchmarks/torch_versions.sh VERSION [PIP_ARGS...]" >&2; exit 2; }
VERSION=$1
shift
PY=${PYTHON:-$(command -v python3 || command -v python)}
OUT=${OUT:-$(mktemp -d -t commbench-torch-XXXXXX)}
VENV=$(mktemp -d -t commbench-venv-XXXXXX)
trap '[ "${KEEP_VENV:-0}" = 1 ] || rm -rf "$VENV"' EXIT
"$PY" -m venv "$VENV" || exit 2
PIP="$VENV/bin/python -m pip"
$PIP install -q "torch==$VERSION" "$@" || { echo "torch_versions: torch==$VERSION could not be installed" >&2; exit 2; }
$PIP install -q -e '.[test]' || exit 2
echo "torch_versions: torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)') in $VENV; log $OUT/pytest-$VERSION.log"
"$VENV/bin/python" -m pytest -q -m "not slow" -p no:cacheprovider -n 2 --dist loadfile 2>&1 | tee "$OUT/pytest-$VERSION.log"
exit "${PIPESTATUS[0]}"

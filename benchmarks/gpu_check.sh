#!/usr/bin/env bash
# The one script for a GPU machine: commbench's CUDA path, asserted step by step (none of it runs on a CPU).
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]        (default: $OUT, else a new temporary directory)
#
# Without CUDA it prints one line saying why and exits 2: a check that tests nothing must not pass.
# Each step runs as `python benchmarks/gpu_check.py step NAME` under its own timeout (seconds below, plus a
# 2 s kill grace each; all of it together stays under 540 s). A failed step does not stop the run; the
# summary (OUT/summary.txt, OUT/summary.json) lists every step's pass/fail, wall time and key figures, and
# the script exits 1 if any step failed. What each step proves: docs/gpu.md.
#
#   preflight     20  torch sees a CUDA device, else one line and exit 2
#   device        20  versions: torch, CUDA, NCCL, GPU name, compute capability
#   sweep         80  every collective x precision, 1-rank NCCL world, 4K and 1M, every #wrong == 0
#   sweep_256m   140  the same grid at 256M, timed with CUDA events, every #wrong == 0
#   native        40  native fp8 on all_reduce/reduce_scatter: rows with impl fp8_native, or skipped with a note
#   hook          45  the codec DDP hook against the synchronous chunked all_reduce, 256M bucket, bit for bit
#   codec_exact   35  fp8 encode/decode CPU vs CUDA bit for bit, e4m3/e5m2 x tensor/block/none
#   codec_speed   45  encode + decode at 256M as a fraction of the device copy bandwidth (>= 0.3)
#   training      70  every training policy steps on CUDA: memory kind cuda_allocator, finite loss and drift
#   summary       10  summary.txt and summary.json, printed; exit 1 if any step failed
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-$(command -v python3 || command -v python)}
GRACE=2
PREFLIGHT_TIMEOUT=20
SUMMARY_TIMEOUT=10
STEPS=(
    "device 20"
    "sweep 80"
    "sweep_256m 140"
    "native 40"
    "hook 45"
    "codec_exact 35"
    "codec_speed 45"
    "training 70"
)

timeout -k "$GRACE" "$PREFLIGHT_TIMEOUT" "$PY" benchmarks/gpu_check.py preflight
rc=$?
if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 124 ] && echo "gpu_check: the CUDA preflight ran past ${PREFLIGHT_TIMEOUT} s: nothing was tested" >&2
    exit "$rc"
fi

OUT=${1:-${OUT:-$(mktemp -d -t commbench-gpu-XXXXXX)}}
mkdir -p "$OUT/logs"
rm -rf "$OUT/steps" "$OUT/steps.tsv" "$OUT/summary.txt" "$OUT/summary.json"
T0=$SECONDS
for entry in "${STEPS[@]}"; do
    read -r name limit <<<"$entry"
    echo "== [$((SECONDS - T0)) s] $name (timeout $limit s)"
    start=$(date +%s.%N)
    timeout -k "$GRACE" "$limit" "$PY" benchmarks/gpu_check.py step "$name" --out "$OUT" --limit "$limit" 2>&1 \
        | tee "$OUT/logs/$name.log"
    rc=${PIPESTATUS[0]}
    wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    printf '%s\t%s\t%s\t%s\n' "$name" "$limit" "$rc" "$wall" >>"$OUT/steps.tsv"
done
echo "== [$((SECONDS - T0)) s] summary"
timeout -k "$GRACE" "$SUMMARY_TIMEOUT" "$PY" benchmarks/gpu_check.py summary --out "$OUT"

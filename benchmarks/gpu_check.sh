#!/usr/bin/env bash
# The one script for a GPU machine: commbench's CUDA path, asserted step by step (none of it runs on a CPU).
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]        (default: $OUT, else a new temporary directory)
#
# Without CUDA it prints one line saying why and exits 2: a check that tests nothing must not pass.
# Each step runs as `python benchmarks/gpu_check.py step NAME` under its own timeout (seconds below, plus a
# 2 s kill grace each; all of it together stays under 545 s: the device machine's 560 s per command less a margin;
# sized from the first H200 run, where a CLI start costs about 10 s). A failed step does not stop the run; the
# summary lists every step's pass/fail, wall time and key figures, and the script exits 1 if any step failed.
# The bulky output (run directories, consoles) goes to a temporary work folder (kept with KEEP_WORK=1); OUT_DIR
# gets three files: summary.txt, summary.json and logs.tar.gz (every step's log and record, the consoles and
# metadata of the runs). What each step proves: docs/gpu.md.
#
#   preflight     20  torch sees a CUDA device, else one line and exit 2
#   device        12  versions: torch, CUDA, NCCL, GPU name, compute capability
#   sweep         46  every collective x precision, 1-rank NCCL world, 4K and 1M, every #wrong == 0 (eager codec)
#   codec_exact   42  fp8 encode/decode CPU vs CUDA bit for bit, e4m3/e5m2 x tensor/block/none (compiles the codec)
#   codec_speed   38  encode + decode at 256M as a fraction of the device copy bandwidth
#   sweep_256m    42  the same grid at 256M, timed with CUDA events, every #wrong == 0 (fused codec)
#   native        30  native fp8 on all_reduce/reduce_scatter: rows with impl fp8_native, or skipped with a note
#   hook          36  the codec DDP hook against the synchronous chunked all_reduce, bit for bit; its control
#   counts        30  kernels and bytes per element of encode, decode, fp8 all_reduce; events vs host clock
#   training      90  every training policy steps on CUDA: memory kind cuda_allocator, finite loss and drift
#   memory        36  the fp32 peak twice in one process, and after a sweep vs training alone
#   launch        40  supervisor without a CUDA context; --nproc 2 on one GPU refused; LOCAL_RANK=3; metadata
#   cuda_graph    36  benchmarks/gpu_cuda_graph.py: graph-mode rows exist, are right and timed
#   summary        9  summary.txt and summary.json, printed; exit 1 if any step failed
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-$(command -v python3 || command -v python)}
GRACE=2
PREFLIGHT_TIMEOUT=20
SUMMARY_TIMEOUT=9
STEPS=(
    "device 12"
    "sweep 46"
    "codec_exact 42"
    "codec_speed 38"
    "sweep_256m 42"
    "native 30"
    "hook 36"
    "counts 30"
    "training 90"
    "memory 36"
    "launch 40"
    "cuda_graph 36"
)

timeout -k "$GRACE" "$PREFLIGHT_TIMEOUT" "$PY" benchmarks/gpu_check.py preflight
rc=$?
if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 124 ] && echo "gpu_check: the CUDA preflight ran past ${PREFLIGHT_TIMEOUT} s: nothing was tested" >&2
    exit "$rc"
fi

OUT=${1:-${OUT:-$(mktemp -d -t commbench-gpu-XXXXXX)}}
WORK=$(mktemp -d -t commbench-gpu-work-XXXXXX)
[ "${KEEP_WORK:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT" "$WORK/logs"
rm -f "$OUT/summary.txt" "$OUT/summary.json" "$OUT/logs.tar.gz"
T0=$SECONDS
for entry in "${STEPS[@]}"; do
    read -r name limit <<<"$entry"
    echo "== [$((SECONDS - T0)) s] $name (timeout $limit s)"
    start=$(date +%s.%N)
    timeout -k "$GRACE" "$limit" "$PY" benchmarks/gpu_check.py step "$name" --out "$WORK" --limit "$limit" 2>&1 \
        | tee "$WORK/logs/$name.log"
    rc=${PIPESTATUS[0]}
    wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    printf '%s\t%s\t%s\t%s\n' "$name" "$limit" "$rc" "$wall" >>"$WORK/steps.tsv"
done
echo "== [$((SECONDS - T0)) s] summary"
timeout -k "$GRACE" "$SUMMARY_TIMEOUT" "$PY" benchmarks/gpu_check.py summary --out "$WORK"
rc=$?
cp "$WORK/summary.txt" "$WORK/summary.json" "$OUT/" 2>/dev/null
# the logs, the step records and, of every run, its console and metadata: small files only
(cd "$WORK" && find logs steps steps.tsv -type f 2>/dev/null; find . -mindepth 2 -type f \
    \( -name console.log -o -name metadata.json -o -name '*.csv' \) -size -2M 2>/dev/null) \
    | sort -u | tar -czf "$OUT/logs.tar.gz" -C "$WORK" -T - 2>/dev/null
echo "gpu_check: $OUT: summary.txt, summary.json, logs.tar.gz${KEEP_WORK:+ (work folder kept: $WORK)}"
exit "$rc"

#!/usr/bin/env bash
# The GPU path in one prepared run (< 8 minutes on one GPU): none of the CUDA code runs on a CPU machine.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]
#
# 1. a 1-rank NCCL world: a sweep of every precision and collective (CUDA events, NCCL, the fp8 byte path on
#    CUDA tensors, native fp8 where it is detected), every #wrong must be 0;
# 2. native fp8 detection: what commbench decided and why (capability, NCCL version, the probe);
# 3. 2 gloo ranks on the same machine (auto backend must not pick NCCL for 2 ranks on 1 GPU);
# 4. the training policies on CUDA with the allocator's memory statistics;
# 5. the fp8 codec's encode/decode throughput against the device's copy bandwidth.
# Without CUDA it says so and exits 0. Each step has its own timeout; the script stops at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: no CUDA device visible to torch: skipped"
    exit 0
fi

OUT=${1:-$(mktemp -d -t commbench-gpu-XXXXXX)}
mkdir -p "$OUT"
T0=$SECONDS
step() { echo; echo "== [$((SECONDS - T0)) s] $*"; }

step "device"
"$PY" - <<'EOF'
import torch
p = torch.cuda.get_device_properties(0)
print(f"{p.name}: sm_{p.major}{p.minor}, {p.total_memory / 2**30:.1f} GiB, {torch.cuda.device_count()} device(s)")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
EOF

step "native fp8 detection"
"$PY" - <<'EOF'
import torch
from commbench.fp8_ops import native_fp8_available
print(f"capability {torch.cuda.get_device_capability(0)}; NCCL {torch.cuda.nccl.version()}; "
      f"native fp8 available: {native_fp8_available('nccl', torch.device('cuda', 0))}")
EOF

PRECS=fp32,fp16,bf16,fp16_compress,bf16_compress
PRECS+=,fp8_e4m3,fp8_e4m3:block128,fp8_e4m3:none,fp8_e5m2,fp8_e5m2:block32,fp8_e5m2:none
PRECS+=,fp8_e4m3_native,fp8_e4m3_native:block128,fp8_e5m2_native
FAST=(--min-time 0.005 --repeats 3 --warmup 1 --quiet --no-training)

step "1-rank NCCL sweep of every precision"
timeout 240 "$PY" -m commbench run --nproc 1 --backend nccl \
    --collectives all_reduce,all_gather,reduce_scatter,all_to_all --precisions "$PRECS" \
    -b 4K -e 64M -f 16 "${FAST[@]}" --out "$OUT/nccl1"
"$PY" - "$OUT/nccl1" <<'EOF'
import sys
import commbench
from commbench.results import load_metadata
df = commbench.load(sys.argv[1])
meta = load_metadata(sys.argv[1])
print(f"rows {len(df)}; device {meta['device_name']}; fp8_codec {meta.get('fp8_codec')}")
cols = ["collective", "precision", "impl", "size_bytes", "time_us", "busbw_gbps", "encode_us", "decode_us",
        "wrong", "rel_err", "comm_rel_err"]
big = df[df["fp32_bytes"] == df["fp32_bytes"].max()]
print(big[cols].to_string(index=False))
print("native fp8 rows:", int((df["impl"] == "fp8_native").sum()))
bad = df[df["wrong"] != 0]
if len(bad):
    print(bad[cols].to_string(index=False))
    sys.exit("gpu_check: #wrong > 0 on the GPU")
EOF

step "2 gloo ranks on this machine (auto backend)"
timeout 150 "$PY" -m commbench run --nproc 2 --collectives all_reduce,all_gather --precisions fp32,bf16,fp8_e4m3 \
    -b 4K -e 4M -f 32 "${FAST[@]}" --out "$OUT/gloo2"
"$PY" -c "import sys; from commbench.results import load_metadata as m; d = m(sys.argv[1]); print(d['backend'], d['world_size'], d['device'])" "$OUT/gloo2"

step "training policies on CUDA with memory statistics"
cat > "$OUT/train.toml" <<'EOF'
name = "gpu-check-training"
collectives = []

[training]
model = "gpt"
policies = "all"
steps = 3
warmup_steps = 1
batch_size = 8
seq_len = 64
d_model = 128
n_layers = 2
n_heads = 4
vocab = 512
measure_memory = true
EOF
timeout 240 "$PY" -m commbench run "$OUT/train.toml" --nproc 1 --backend nccl --quiet --no-report --out "$OUT/train"
"$PY" - "$OUT/train" <<'EOF'
import sys
from commbench.results import load_training
t = load_training(sys.argv[1])
print(t[["policy", "step_time_us_p50", "peak_mem_bytes", "peak_mem_kind", "warnings"]].to_string(index=False)
      if "step_time_us_p50" in t.columns else t.to_string(index=False))
if not (t["peak_mem_kind"] == "cuda_allocator").all() or not (t["peak_mem_bytes"] > 0).all():
    sys.exit("gpu_check: training memory was not measured by the CUDA allocator")
EOF

step "fp8 codec throughput against the device copy bandwidth"
timeout 120 "$PY" - <<'EOF'
import torch
from commbench import fp8
dev = torch.device("cuda", 0)
n = 64 * 2**20
x = torch.randn(n, device=dev)
y = torch.empty_like(x)
q = torch.empty(n, dtype=torch.uint8, device=dev)

def gbps(fn, nbytes, reps=20):
    fn(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record(); torch.cuda.synchronize()
    return nbytes * reps / (a.elapsed_time(b) * 1e-3) / 1e9

copy = gbps(lambda: y.copy_(x), 2 * 4 * n)  # read + write
print(f"device copy: {copy:.0f} GB/s (bytes read + written)")
for fmt in ("e4m3", "e5m2"):
    for scaling in ("tensor", "block", "none"):
        s = torch.empty(fp8.num_scales(n, scaling), dtype=torch.float32, device=dev)
        enc = gbps(lambda: fp8.quantize(x, fmt, scaling, out=(q, s)), 5 * n)  # 4 B read + 1 B written
        dec = gbps(lambda: fp8.dequantize(q, s, fmt, scaling, out=y), 5 * n)
        print(f"{fmt} {scaling:<6} encode {enc:6.0f} GB/s ({enc / copy:.2f} of copy)  decode {dec:6.0f} GB/s ({dec / copy:.2f})")
EOF

step "done: outputs in $OUT"

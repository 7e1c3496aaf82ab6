#!/usr/bin/env bash
# On the GPU host, after tools/gpu_build.sh: GroupNorm and InstanceNorm kernel sweeps (vknorm beside the
# copy roof, ncnn's Vulkan layer and torch CUDA, fp32 and fp16) and `vknorm bench --model` on the
# committed GroupNorm/InstanceNorm models. Usage: bash tools/gpu_channel_norms.sh OUTDIR [BATCHES]
set -uo pipefail
out=${1:-/tmp}; batches=${2:-3}
python3 -m vknorm info | head -3
for op in groupnorm instancenorm; do
  python3 -m vknorm bench --op $op --dtype both --compare ncnn,copy,torch --batches "$batches" \
    --json "$out/$op.json" --plot "$out/$op.png" 2>/dev/null
done
python3 - "$out" <<'PY'
import json, subprocess, sys
out = sys.argv[1]
models = json.load(open("tests/data/models.json"))
for name in ("sd_resblock", "sd_resblock_c320", "instnorm_block", "instnorm_noaffine"):
    for fp16 in (False, True):
        tag = f"{name}_{'fp16' if fp16 else 'fp32'}"
        cmd = [sys.executable, "-m", "vknorm", "bench", "--model", f"tests/data/{name}.ncnn.param",
               f"tests/data/{name}.ncnn.bin", "--input", f"in0={models[name]}", "--iters", "30",
               "--json", f"{out}/model_{tag}.json"] + (["--fp16"] if fp16 else [])
        p = subprocess.run(cmd, capture_output=True, text=True)
        print(tag, p.stdout if p.returncode == 0 else f"rc {p.returncode}\n{p.stderr[-2000:]}", flush=True)
PY

#!/usr/bin/env bash
# On the GPU host, after tools/gpu_build.sh: `vknorm bench --model` on every committed model, fp32 and
# fp16 storage, one JSON per run into OUTDIR. Usage: bash tools/gpu_models.sh OUTDIR [ITERS] [MODEL...]
set -uo pipefail
out=${1:-/tmp}; iters=${2:-30}
python3 - "$out" "$iters" "${@:3}" <<'PY'
import json, subprocess, sys
out, iters, only = sys.argv[1], sys.argv[2], sys.argv[3:]
models = json.load(open("tests/data/models.json"))
for name, dims in models.items():
    if name.startswith("_") or (only and name not in only):
        continue
    for fp16 in (False, True):
        tag = f"{name}_{'fp16' if fp16 else 'fp32'}"
        cmd = [sys.executable, "-m", "vknorm", "bench", "--model", f"tests/data/{name}.ncnn.param",
               f"tests/data/{name}.ncnn.bin", "--input", f"in0={dims}", "--iters", iters, "--json", f"{out}/{tag}.json"]
        if fp16:
            cmd.append("--fp16")
        p = subprocess.run(cmd, capture_output=True, text=True)
        print(p.stdout if p.returncode == 0 else f"{tag}: rc {p.returncode}\n{p.stderr[-2000:]}", flush=True)
PY

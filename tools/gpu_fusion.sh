#!/usr/bin/env bash
# On the GPU host, after tools/gpu_build.sh: the fusion figures of docs/benchmarks.
#  - every committed model, `vknorm bench --model` in fp32 and fp16 storage (stock ncnn Vulkan,
#    vknorm-in-graph, vknorm-fused, ...), merged into OUTDIR/models.json;
#  - the fused kernels at 43690x768 (LayerNorm and RMSNorm): the norm alone, + the residual add, + the
#    add writing its sum, each against the copy roof and torch: OUTDIR/kernel_{plain,add,add_sum}.json.
# Usage: bash tools/gpu_fusion.sh OUTDIR [ITERS]
set -uo pipefail
out=${1:-/tmp/fusion}; iters=${2:-30}
mkdir -p "$out/models"
bash tools/gpu_models.sh "$out/models" "$iters" > "$out/models.txt" 2>&1
python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
runs = []
for f in sorted(glob.glob(f"{out}/models/*.json")):
    runs.append(json.load(open(f)))
    os.unlink(f)
os.rmdir(f"{out}/models")
json.dump({"method": "vknorm bench --model: wall ms per inference, median of the interleaved rounds", "runs": runs},
          open(f"{out}/models.json", "w"), indent=1)
for r in runs:
    by = {x["impl"]: x["ms"] for x in r["results"]}
    print(f"{os.path.basename(r['model']):32s} {'fp16' if r['fp16'] else 'fp32'}  stock {by['ncnn-vulkan']:.3f}  "
          f"in-graph {by['vknorm-in-graph']:.3f} ({by['ncnn-vulkan'] / by['vknorm-in-graph']:.2f}x)  "
          f"fused {by['vknorm-fused']:.3f} ({by['ncnn-vulkan'] / by['vknorm-fused']:.2f}x)")
PY
for kind in plain add add_sum; do
  flag=()
  [ "$kind" = add ] && flag=(--residual add)
  [ "$kind" = add_sum ] && flag=(--residual add+sum)
  python3 -m vknorm bench --op both --rows 43690 --cols 768 "${flag[@]}" --dtype both --compare copy,torch \
    --batches 5 --json "$out/kernel_$kind.json" 2>/dev/null | tail -4
done

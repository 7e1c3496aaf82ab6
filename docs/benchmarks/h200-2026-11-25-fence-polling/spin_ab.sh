# A/B of VKNORM_FENCE_SPIN_US on round trips: one build, settings interleaved, torch once.
set -u
source .gpu/setup.sh
NO_NCNN=1 bash tools/gpu_build.sh > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 docs/benchmarks/h200-2026-11-25-host-round-trips/round_trips.py $OUT/torch.json --torch > /dev/null
for r in 1 2; do for s in ${SPINS:-0 20 200 2000}; do
  VKNORM_FENCE_SPIN_US=$s python3 docs/benchmarks/h200-2026-11-25-host-round-trips/round_trips.py $OUT/rt_${s}_$r.json > /dev/null
done; done
python3 - <<'PY'
import json, glob, os, collections
out = os.environ["OUT"]
t = {(tuple(r["shape"]), r["call"]): r["ms"] for r in json.load(open(f"{out}/torch.json"))}
rows = collections.defaultdict(dict)
for f in sorted(glob.glob(f"{out}/rt_*.json")):
    _, s, r = os.path.basename(f)[:-5].split("_")
    for x in json.load(open(f)):
        rows[(tuple(x["shape"]), x["call"])][f"{s}/{r}"] = x["ms"]
for k, v in rows.items():
    print(f"{'x'.join(map(str,k[0])):>10s} {k[1]:28s}", " ".join(f"{c}:{m:.3f}" for c, m in sorted(v.items(), key=lambda i: (int(i[0].split('/')[0]), i[0]))), f"torch:{t[k]:.3f}" if k in t else "")
PY

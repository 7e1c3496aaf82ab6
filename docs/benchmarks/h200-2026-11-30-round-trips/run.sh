# Host round trips at HEAD (context pipeline cache, tuning knobs read only when set), torch once, two rounds.
set -u
source .gpu/setup.sh > /dev/null
[ -f /tmp/vknorm-site/vknorm/__init__.py ] || { bash tools/gpu_build.sh > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
rt=docs/benchmarks/h200-2026-11-25-host-round-trips/round_trips.py
python3 $rt $OUT/torch.json --torch > /dev/null
for r in 1 2; do python3 $rt $OUT/rt_$r.json > /dev/null; done
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
t = {(tuple(r["shape"]), r["call"]): r["ms"] for r in json.load(open(f"{out}/torch.json"))}
runs = [{(tuple(r["shape"]), r["call"]): r["ms"] for r in json.load(open(f"{out}/rt_{i}.json"))} for i in (1, 2)]
for k in runs[0]:
    print(f"{'x'.join(map(str, k[0])):>10s} {k[1]:36s}", " / ".join(f"{r[k]:.3f}" for r in runs), f"torch {t[k]:.3f}" if k in t else "")
PY

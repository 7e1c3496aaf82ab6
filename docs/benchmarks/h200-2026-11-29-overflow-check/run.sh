source .gpu/setup.sh > /dev/null
export ROUNDS=3
bash tools/gpu_builds_ab.sh run /tmp/ab --op layernorm --dtype both \
  --rows 32768 --cols 1024 --rows 2048 --cols 16384 --rows 1024 --cols 32768 --batches 3 > $OUT/ab_layernorm.txt 2>&1
tail -8 $OUT/ab_layernorm.txt
for round in 1 2 3; do for name in d55e103 HEAD WORKTREE; do
  PYTHONPATH=/tmp/builds/site_$name:$PYTHONPATH python3 -m vknorm bench --compare copy --op instancenorm --dtype both \
    --channels 128 --size 64x64 --channels 256 --size 32x32 --channels 64 --size 56x56 --batches 3 \
    --json /tmp/ab/in_${name}_r$round.json > /dev/null 2>&1
done; done
python3 - <<'PY'
import glob, json, statistics
for name in ("d55e103", "HEAD", "WORKTREE"):
    t = {}
    for f in glob.glob(f"/tmp/ab/in_{name}_r*.json"):
        for r in json.load(open(f))["results"]:
            if r["impl"] == "vknorm": t.setdefault((r["dtype"], r["shape"]), []).append(r["gpu_us"])
    for k in sorted(t): print(name, k, "%.2f" % statistics.median(t[k]), [round(v, 2) for v in t[k]])
PY
(cd /tmp/ab && tar czf $OUT/ab_json.tar.gz *.json)

# One build; VKNORM_TUNE_CONVERSION_THREADS (and bytes per thread) interleaved over few_planes + 1024x4096 shapes.
set -u
source .gpu/setup.sh
NO_NCNN=1 bash tools/gpu_build.sh > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
rm -rf /tmp/rt; mkdir -p /tmp/rt
for r in 1 2 3; do for t in ${SETTINGS:-1 2 3 4 6 8}; do
  VKNORM_TUNE_CONVERSION_THREADS=$t python3 .gpu/scratch/few_planes.py /tmp/rt/t${t}_r$r.json > /dev/null
done; done
python3 - <<'PY'
import json, glob, os, collections, statistics
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for f in glob.glob("/tmp/rt/*.json"):
    t = os.path.basename(f).split("_")[0]
    for x in json.load(open(f)):
        rows[(tuple(x["shape"]), x["call"])][t].append(x["ms"])
for k, v in rows.items():
    print(f"{'x'.join(map(str,k[0])):>11s} {k[1]:14s}", " ".join(f"{c}:{statistics.median(m):.3f}" for c, m in sorted(v.items(), key=lambda i: int(i[0][1:]))))
PY
tar -czf $OUT/raw.tar.gz -C /tmp/rt .

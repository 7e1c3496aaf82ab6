# One build; VKNORM_TUNE_CONVERSION_BYTES_PER_THREAD interleaved over the round-trip shapes, three rounds.
set -u
source .gpu/setup.sh
NO_NCNN=1 bash tools/gpu_build.sh > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
rm -rf /tmp/rt; mkdir -p /tmp/rt
for r in 1 2 3; do for b in ${SETTINGS:-2097152 1048576 524288 262144}; do
  VKNORM_TUNE_CONVERSION_BYTES_PER_THREAD=$b python3 docs/benchmarks/h200-2026-11-25-host-round-trips/round_trips.py /tmp/rt/b${b}_r$r.json > /dev/null
done; done
python3 - <<'PY'
import json, glob, os, collections, statistics
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for f in glob.glob("/tmp/rt/*.json"):
    t = os.path.basename(f).split("_")[0]
    for x in json.load(open(f)):
        rows[(tuple(x["shape"]), x["call"])][t].append(x["ms"])
for k, v in rows.items():
    print(f"{'x'.join(map(str,k[0])):>10s} {k[1]:28s}", " ".join(f"{c}:{statistics.median(m):.3f}" for c, m in sorted(v.items(), key=lambda i: -int(i[0][1:]))))
PY
tar -czf $OUT/raw.tar.gz -C /tmp/rt .

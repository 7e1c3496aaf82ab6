# One build; one measurement knob interleaved over a script's shapes, three rounds; medians per setting.
#   KNOB=VKNORM_TUNE_CONVERSION_THREADS TAG=t SETTINGS="1 2 3 4 6 8" SCRIPT=.gpu/scratch/few_planes.py bash knob_ab.sh
#   KNOB=VKNORM_TUNE_CONVERSION_BYTES_PER_THREAD TAG=b SETTINGS="2097152 1048576 524288 262144" \
#     SCRIPT=docs/benchmarks/h200-2026-11-25-host-round-trips/round_trips.py bash knob_ab.sh
# (the runs here: threads/ and bytes-per-thread/; few_planes.py lived in .gpu/scratch/ then)
set -u
source .gpu/setup.sh
NO_NCNN=1 bash tools/gpu_build.sh > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
rm -rf /tmp/rt; mkdir -p /tmp/rt
for r in 1 2 3; do for v in $SETTINGS; do
  env "$KNOB=$v" python3 "$SCRIPT" "/tmp/rt/$TAG${v}_r$r.json" > /dev/null
done; done
python3 - <<'PY'
import json, glob, os, collections, statistics
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for f in glob.glob("/tmp/rt/*.json"):
    setting = os.path.basename(f).split("_")[0]
    for x in json.load(open(f)):
        rows[(tuple(x["shape"]), x["call"])][setting].append(x["ms"])
for k, v in rows.items():
    print(f"{'x'.join(map(str, k[0])):>11s} {k[1]:28s}", " ".join(f"{c}:{statistics.median(m):.3f}" for c, m in v.items()))
PY
tar -czf $OUT/raw.tar.gz -C /tmp/rt .

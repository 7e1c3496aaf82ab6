# Build every packed tree (kernels only) in parallel, then round_trips.py interleaved, ROUNDS rounds.
set -u
source .gpu/setup.sh
build=$(realpath tools/gpu_build.sh)
names=()
for f in .gpu/builds/*.tar.gz; do
  n=$(basename $f .tar.gz); names+=($n)
  rm -rf /tmp/builds/src_$n; mkdir -p /tmp/builds/src_$n; tar -xzf $f -C /tmp/builds/src_$n
  (cd /tmp/builds/src_$n && NO_NCNN=1 CMAKE_BUILD_PARALLEL_LEVEL=8 VKNORM_SITE=/tmp/builds/site_$n VKNORM_BUILD_DIR=/tmp/builds/build_$n bash $build > /tmp/build_$n.log 2>&1 || tail -20 /tmp/build_$n.log) &
done
wait
rm -rf /tmp/rt; mkdir -p /tmp/rt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in $(seq ${ROUNDS:-2}); do for n in "${names[@]}"; do
  [ -n "${FEW_ONLY:-}" ] || PYTHONPATH=/tmp/builds/site_$n python3 docs/benchmarks/h200-2026-11-25-host-round-trips/round_trips.py /tmp/rt/${n}_r$r.json > /dev/null
  PYTHONPATH=/tmp/builds/site_$n python3 .gpu/scratch/few_planes.py /tmp/rt/${n}_few_r$r.json > /dev/null
done; done
python3 - <<'PY'
import json, glob, os, collections
out = "/tmp/rt"
rows = collections.defaultdict(dict)
for f in sorted(glob.glob(f"{out}/*_r*.json")):
    n = os.path.basename(f)[:-5]
    for x in json.load(open(f)):
        rows[(tuple(x["shape"]), x["call"])][n] = x["ms"]
for k, v in rows.items():
    print(f"{'x'.join(map(str,k[0])):>10s} {k[1]:28s}", " ".join(f"{c}:{m:.3f}" for c, m in sorted(v.items())))
PY
tar -czf $OUT/raw.tar.gz -C /tmp/rt .

# Host round trips of the builds packed in .gpu/builds, interleaved round by round; here three: 2982592 (fence
# polling, 2026-11-25), 1721543 (the last build whose suite ran here) and HEAD (context pipeline cache, tuning knobs read only when set).
# Packed here (the sources a build needs): for r in 2982592 1721543 HEAD; do git archive --format=tar.gz \
#   -o .gpu/builds/$r.tar.gz $r -- . ":!docs" ":!tests" ":!examples"; done
set -u
source .gpu/setup.sh > /dev/null
build=$(realpath tools/gpu_build.sh)
for f in .gpu/builds/*.tar.gz; do
  n=$(basename $f .tar.gz); mkdir -p /tmp/b/src_$n; tar -xzf $f -C /tmp/b/src_$n
  (cd /tmp/b/src_$n && NO_NCNN=1 CMAKE_BUILD_PARALLEL_LEVEL=5 VKNORM_SITE=/tmp/b/site_$n VKNORM_BUILD_DIR=/tmp/b/build_$n \
     bash $build > $OUT/build_$n.log 2>&1 || tail -5 $OUT/build_$n.log) &
done; wait
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
rt=$(realpath docs/benchmarks/h200-2026-11-25-host-round-trips/round_trips.py)
for r in 1 2 3; do for f in .gpu/builds/*.tar.gz; do n=$(basename $f .tar.gz)
  (cd /tmp && PYTHONPATH=/tmp/b/site_$n:$PYTHONPATH python3 $rt $OUT/${n}_r$r.json > /dev/null)
done; done
python3 - <<'PY'
import json, os, glob, collections, statistics
out = os.environ["OUT"]
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(f"{out}/*_r*.json")):
    n = os.path.basename(f).rsplit("_r", 1)[0]
    for r in json.load(open(f)):
        rows[("x".join(map(str, r["shape"])), r["call"])][n].append(r["ms"])
names = sorted({n for v in rows.values() for n in v})
print(f"{'shape':>10s} {'call':32s}", " ".join(f"{n:>22s}" for n in names))
for (s, c), v in rows.items():
    print(f"{s:>10s} {c:32s}", " ".join(f"{statistics.median(v[n]):7.3f} ({min(v[n]):.3f}-{max(v[n]):.3f})" for n in names))
PY

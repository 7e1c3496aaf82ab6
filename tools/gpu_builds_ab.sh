#!/usr/bin/env bash
# A/B of builds rather than settings (tools/gpu_ab.sh interleaves settings of one build): which commit
# changed a kernel's speed, or does an uncommitted change pay. Two steps:
#   here, with git:     bash tools/gpu_builds_ab.sh pack REV...      (REV: a commit, or WORKTREE for the
#                       working tree with its uncommitted changes to tracked files) -> .gpu/builds/<name>.tar.gz
#   on the GPU host:    source .gpu/setup.sh; bash tools/gpu_builds_ab.sh run OUTDIR [vknorm bench flags...]
# `run` builds every packed tree in parallel (kernels only, no ncnn: /tmp/builds/site_<name>), then runs
# `vknorm bench --compare copy` with the flags given, builds interleaved round by round (ROUNDS, default 2),
# into OUTDIR/<name>_r<round>.json, and prints the median time per shape and build with its % of the copy roof.
#   bash tools/gpu_builds_ab.sh run /tmp/ab --op rmsnorm --dtype fp32 --rows 32768 --cols 1024 --batches 2
set -euo pipefail
mode=${1:-}; shift || true
case "$mode" in
  pack)
    [ $# -ge 1 ] || { echo "usage: $0 pack REV... (a commit or WORKTREE)" >&2; exit 2; }
    mkdir -p .gpu/builds
    for rev in "$@"; do
      if [ "$rev" = WORKTREE ]; then
        commit=$(git stash create); commit=${commit:-HEAD}  # the working tree as a commit (HEAD if clean)
      else
        commit=$(git rev-parse --verify --quiet "$rev^{commit}") || { echo "not a commit: $rev" >&2; exit 2; }
      fi
      name=$(echo "$rev" | tr -c 'A-Za-z0-9._\n-' '_')
      git archive --format=tar.gz -o ".gpu/builds/$name.tar.gz" "$commit"
      echo ".gpu/builds/$name.tar.gz ($rev = $(git rev-parse --short "$commit"))"
    done
    ;;
  run)
    out=${1:?usage: $0 run OUTDIR [vknorm bench flags...]}; shift
    ls .gpu/builds/*.tar.gz >/dev/null 2>&1 || { echo "nothing packed: run '$0 pack REV...' first (here)" >&2; exit 2; }
    mkdir -p "$out" /tmp/builds
    build=$(realpath tools/gpu_build.sh)  # this tree's recipe, whatever the packed trees hold
    names=()
    for f in .gpu/builds/*.tar.gz; do
      name=$(basename "$f" .tar.gz); names+=("$name")
      rm -rf "/tmp/builds/src_$name" "/tmp/builds/site_$name"; mkdir -p "/tmp/builds/src_$name"
      tar -xzf "$f" -C "/tmp/builds/src_$name"
      (cd "/tmp/builds/src_$name" && NO_NCNN=1 CMAKE_BUILD_PARALLEL_LEVEL=4 VKNORM_SITE="/tmp/builds/site_$name" \
         VKNORM_BUILD_DIR="/tmp/builds/build_$name" bash "$build" > "$out/build_$name.log" 2>&1 ||
         { echo "build $name failed:"; tail -20 "$out/build_$name.log"; }) &
    done
    wait
    for round in $(seq 1 "${ROUNDS:-2}"); do
      for name in "${names[@]}"; do
        [ -d "/tmp/builds/site_$name/vknorm" ] || continue
        echo "== round $round: $name"
        PYTHONPATH="/tmp/builds/site_$name${PYTHONPATH:+:$PYTHONPATH}" python3 -m vknorm bench --compare copy "$@" \
          --json "$out/${name}_r$round.json" 2>/dev/null | tail -n +4
      done
    done
    python3 - "$out" "${names[@]}" <<'PY'
import glob, json, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
times = {}  # (op, dtype, shape) -> name -> [(vknorm us, copy us)]
for name in names:
    for f in sorted(glob.glob(f"{out}/{name}_r*.json")):
        by = {}
        for r in json.load(open(f))["results"]:
            by.setdefault((r["op"], r["dtype"], r["shape"]), {})[r["impl"]] = r["gpu_us"]
        for key, impls in by.items():
            if "vknorm" in impls and "copy" in impls:
                times.setdefault(key, {}).setdefault(name, []).append((impls["vknorm"], impls["copy"]))
print("median us (% of the copy roof) per build")
print(f"{'op':12s} {'dtype':5s} {'shape':>16s}  " + "  ".join(f"{n:>16s}" for n in names))
for key, per in times.items():
    cells = []
    for n in names:
        if n not in per:
            cells.append(f"{'-':>16s}")
            continue
        us = statistics.median(v for v, _ in per[n])
        copy = statistics.median(c for _, c in per[n])
        cells.append(f"{us:9.1f} ({100 * copy / us:3.0f}%)")
    print(f"{key[0]:12s} {key[1]:5s} {key[2]:>16s}  " + "  ".join(cells))
PY
    ;;
  *)
    echo "usage: $0 pack REV... | run OUTDIR [vknorm bench flags...]" >&2
    exit 2
    ;;
esac

# The per-layer cost inside ncnn's Vulkan graph on the H200, at one build (the tree this runs in):
#   bash run.sh chain   chain.py at 16x64 and 197x768, float32 and float16 storage
#   bash run.sh floor   tools/norm_floor.py --iters 80, float32 and float16 (the README's whole-model table)
# (modes/ came from an earlier form of this script, which ran chain.py under each value of a switch that an
# uncommitted experimental build read from VKNORM_EXP_BARRIERS.)
source .gpu/setup.sh > /dev/null
start=$(date +%s)
[ -n "$REBUILD" ] && rm -f /tmp/vknorm-site/vknorm/__init__.py
[ -f /tmp/vknorm-site/vknorm/__init__.py ] ||
  { bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
echo "build $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
d=docs/benchmarks/h200-2026-12-01-per-layer
for step in "$@"; do
  case $step in
    chain) for shape in "16 64" "197 768"; do
             set -- $shape
             for fp in "" "--fp16"; do
               python3 $d/chain.py --rows $1 --cols $2 $fp --json $OUT/chain_$1x$2${fp:+_fp16}.json 2>&1 |
                 grep -v "^\["
             done
           done ;;
    floor) for fp in "" "--fp16"; do
             python3 tools/norm_floor.py --iters 80 $fp --json $OUT/floor${fp:+_fp16}.json 2>&1 |
               grep -v "^\[" | tail -12
           done ;;
  esac
  echo "$step done at $(( $(date +%s) - start )) s"
done
echo "total $(( $(date +%s) - start )) s"

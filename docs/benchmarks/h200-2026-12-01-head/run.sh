# Whole models and the GroupNorm/InstanceNorm benches on the H200 at one build: bash run.sh models MODEL... (each
# committed model named, fp32 and fp16, `vknorm bench --model --iters 60`) or bash run.sh ops (`vknorm bench --op
# groupnorm` and `--op instancenorm` at their default shapes); the build made only where this host has none.
source .gpu/setup.sh > /dev/null
start=$(date +%s)
[ -f /tmp/vknorm-site/vknorm/__init__.py ] || { bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
echo "build $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "$1" in
  # the JSONs in one archive: the device tool brings back only so many files from one call
  models) shift; mkdir -p $OUT/models; bash tools/gpu_models.sh $OUT/models 60 "$@"
          tar -czf $OUT/models.tar.gz -C $OUT models && rm -r $OUT/models ;;
  ops) for op in groupnorm instancenorm; do
         python3 -m vknorm bench --op $op --json $OUT/$op.json > $OUT/$op.txt 2>&1; echo "$op rc $?"; tail -30 $OUT/$op.txt
       done ;;
esac
echo "total $(( $(date +%s) - start )) s"

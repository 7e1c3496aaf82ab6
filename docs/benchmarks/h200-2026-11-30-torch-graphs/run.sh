# vknorm bench's default GroupNorm / InstanceNorm / LayerNorm sweeps with torch timed from CUDA graph replays.
source .gpu/setup.sh > /dev/null
start=$(date +%s)
[ -f /tmp/vknorm-site/vknorm/__init__.py ] || { bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }; }
echo "build $(( $(date +%s) - start )) s"
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
for op in groupnorm instancenorm; do
  timeout 240 python3 -m vknorm bench --op $op --dtype both --compare copy,ncnn,torch --json $OUT/$op.json \
    > $OUT/$op.txt 2>&1; echo "$op rc $? $(( $(date +%s) - start )) s"; cat $OUT/$op.txt
done
timeout 120 python3 -m vknorm bench --op layernorm --dtype both --compare copy,torch --json $OUT/layernorm.json \
  > $OUT/layernorm.txt 2>&1; echo "layernorm rc $? $(( $(date +%s) - start )) s"; cat $OUT/layernorm.txt

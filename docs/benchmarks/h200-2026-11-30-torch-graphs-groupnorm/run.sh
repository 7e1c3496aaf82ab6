# GroupNorm's default shapes and LayerNorm's default sweep against the copy roof and torch (CUDA graph replays);
# ncnn left out here (run.sh's --compare ncnn sweep of GroupNorm passed its time limit).
source .gpu/setup.sh > /dev/null
start=$(date +%s)
[ -f /tmp/vknorm-site/vknorm/__init__.py ] || { bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
timeout 150 python3 -m vknorm bench --op groupnorm --dtype both --compare copy,torch --json $OUT/groupnorm.json \
  > $OUT/groupnorm.txt 2>&1; echo "groupnorm rc $? $(( $(date +%s) - start )) s"; cat $OUT/groupnorm.txt
timeout $(( 330 - ($(date +%s) - start) )) python3 -m vknorm bench --op layernorm --dtype both --compare copy,torch \
  --json $OUT/layernorm.json > $OUT/layernorm.txt 2>&1; echo "layernorm rc $? $(( $(date +%s) - start )) s"
cat $OUT/layernorm.txt

source .gpu/setup.sh > /dev/null
[ -f /tmp/vknorm-site/vknorm/__init__.py ] || { NO_NCNN=1 bash tools/gpu_build.sh > $OUT/build.log 2>&1 || exit 1; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
# this build's kernels (the inverse square root defined at 0) at the SD GroupNorm shapes, against the copy roof
timeout 230 python3 -m vknorm bench --op groupnorm --dtype both --compare copy --json $OUT/groupnorm.json > $OUT/groupnorm.txt 2>&1
echo rc $?; tail -12 $OUT/groupnorm.txt

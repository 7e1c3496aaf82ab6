# Before/after on the H200 in one lease: the tree this runs in ("after") and .gpu/builds/before.tar.gz (git archive
# of the commit before), each built with ncnn into its own site; then, alternating the builds round by round,
# chain.py (the per-layer cost in ncnn's graph) and `vknorm bench --model` on the models named in MODELS.
source .gpu/setup.sh > /dev/null
start=$(date +%s)
d=docs/benchmarks/h200-2026-12-01-per-layer
rm -rf /tmp/before && mkdir -p /tmp/before && tar -xzf .gpu/builds/before.tar.gz -C /tmp/before
bash tools/gpu_build.sh > $OUT/build_after.log 2>&1 || { tail -30 $OUT/build_after.log; exit 1; }
(cd /tmp/before && cp -r $OLDPWD/.gpu . && VKNORM_SITE=/tmp/site-before VKNORM_BUILD_DIR=/tmp/build-before \
   bash tools/gpu_build.sh > $OUT/build_before.log 2>&1) || { tail -30 $OUT/build_before.log; exit 1; }
echo "builds $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for round in ${ROUNDS:-1 2}; do
  for build in before after; do
    site=/tmp/vknorm-site; [ $build = before ] && site=/tmp/site-before
    echo "== round $round, $build"
    if [ -n "${CHAIN-1}" ]; then
      for fp in "" "--fp16"; do
        PYTHONPATH=$site:$PYTHONPATH python3 $d/chain.py --rows 16 --cols 64 $fp --calls 60 --rounds 2 \
          --json $OUT/chain_${build}_r${round}${fp:+_fp16}.json 2>&1 | grep "vknorm\|fp"
      done
    fi
    mkdir -p $OUT/models_${build}_r$round
    PYTHONPATH=$site:$PYTHONPATH bash tools/gpu_models.sh $OUT/models_${build}_r$round ${ITERS:-40} $MODELS |
      grep -v "^\[" | grep "^model\|^ *ncnn-vulkan\|^ *vknorm-\|ms/inference" | head -60
    echo "at $(( $(date +%s) - start )) s"
  done
done
tar -czf $OUT/results.tar.gz -C $OUT $(cd $OUT && ls -d chain_* models_* 2>/dev/null) &&
  rm -rf $OUT/chain_* $OUT/models_*
echo "total $(( $(date +%s) - start )) s"

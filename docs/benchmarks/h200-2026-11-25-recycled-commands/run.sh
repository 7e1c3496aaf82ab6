# The lease that measured bench_all/, floor/ and cpp_example_times.txt (GPU host, project root, .gpu carried).
source .gpu/setup.sh >/dev/null
R=$OUT/r; mkdir -p $R/bench
bash tools/gpu_build.sh > $R/build.log 2>&1; tail -1 $R/build.log
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
timeout 240 bash tools/gpu_test.sh tests/test_deploy_ncnn_cpp.py -q > $R/cpp_tests.txt 2>&1; tail -1 $R/cpp_tests.txt
ex=build/cxx-ncnn-example/ncnn_example
for m in ln_residual_stack:197x768 transformer_block:16x64 sd_resblock:64x16x16; do
  n=${m%%:*}; dims=${m##*:}
  for round in 1 2; do for flags in "--stock" "--stock --runner" "--fuse" "--fuse --runner" "--fuse --fp16" "--fuse --fp16 --runner" "--stock --fp16" "--stock --fp16 --runner"; do
    echo "$n $flags round $round: $($ex tests/data/$n.ncnn.param tests/data/$n.ncnn.bin $dims $flags --repeat 300 2>/dev/null | grep inferences)"
  done; done
done > $R/cpp_example_times.txt
cat $R/cpp_example_times.txt
python3 tools/norm_floor.py --iters 80 --json $R/floor_fp32.json > $R/floor_fp32.txt 2>&1
python3 tools/norm_floor.py --iters 80 --fp16 --json $R/floor_fp16.json > $R/floor_fp16.txt 2>&1
grep -v "^\[" $R/floor_fp32.txt $R/floor_fp16.txt | tail -30
timeout 200 bash tools/gpu_models.sh $R/bench 60 > $R/bench/tables.txt 2>&1
tar -czf $OUT/r.tgz -C $OUT r && rm -rf $R

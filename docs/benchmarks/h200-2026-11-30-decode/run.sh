# tools/decode_speed.py on the H200: a decoder layer of two sizes, both attention forms, both storages, in one
# call; the JSON of each in $OUT. The build made only where this host has none.
source .gpu/setup.sh > /dev/null
start=$(date +%s)
[ -f /tmp/vknorm-site/vknorm/__init__.py ] || { bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
echo "build $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for dims in 2048,16,128,4,5632 4096,32,128,8,11008; do
  for attention in sdpa mha; do
    for storage in fp32 fp16; do
      flag=$([ $storage = fp16 ] && echo --fp16)
      python3 tools/decode_speed.py --attention $attention --dims $dims --prompt 128 --tokens 32 --rounds 7 $flag \
        --json $OUT/decode_${attention}_${dims%%,*}_${storage}.json 2>/dev/null | tail -5
    done
  done
done

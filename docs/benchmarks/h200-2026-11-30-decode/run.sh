# tools/decode_speed.py on the H200: a decoder layer of two sizes, both attention forms, both storages, in one
# call; the tables in $OUT/decode.txt, every run's JSON in $OUT/decode.json. The build made only where this host
# has none.
source .gpu/setup.sh > /dev/null
start=$(date +%s)
[ -f /tmp/vknorm-site/vknorm/__init__.py ] ||
  { bash tools/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }; }
export PYTHONPATH=/tmp/vknorm-site:$PYTHONPATH
echo "build $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for dims in 2048,16,128,4,5632 4096,32,128,8,11008; do
  for attention in sdpa mha; do
    for storage in fp32 fp16; do
      flag=$([ $storage = fp16 ] && echo --fp16)
      python3 tools/decode_speed.py --attention $attention --dims $dims --prompt 128 --tokens 32 --rounds 7 $flag \
        --json /tmp/decode_${attention}_${dims%%,*}_${storage}.json 2>/dev/null | tail -5 | tee -a $OUT/decode.txt
    done
  done
done
python3 -c "import glob, json, sys
json.dump([json.load(open(f)) for f in sorted(glob.glob('/tmp/decode_*.json'))], sys.stdout, indent=1)" \
  > $OUT/decode.json

# 16 KB shared-memory plans (VKNORM_MAX_SHARED_MEMORY=16384) before/after, on this GPU, interleaved builds
export VKNORM_MAX_SHARED_MEMORY=16384
ROUNDS=2 bash tools/gpu_builds_ab.sh run $OUT/ab16k --op groupnorm --batches 2 \
  --channels 640 --size 32x32 --channels 960 --size 32x32 --channels 1920 --size 32x32 --channels 1280 --size 32x32 \
  --channels 1280 --size 40x40 --channels 64 --size 32x32 --channels 64 --size 48x48 --channels 12 --size 56x56 \
  --groups 32 --groups 32 --groups 32 --groups 32 --groups 32 --groups 2 --groups 8 --groups 1

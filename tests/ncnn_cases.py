"""ncnn's own LayerNorm / RMSNorm test cases, plus ncnn's CPU algorithm (data module, no tests).

Cases
-----
``LAYERNORM_CASES`` reproduces every call in ncnn ``tests/test_layernorm.cpp`` and
``RMSNORM_CASES`` every call in ncnn ``tests/test_rmsnorm.cpp`` (Tencent/ncnn, the
current versions with params 0=affine_size 1=eps 2=affine: test_layernorm_0..3 and
test_rmsnorm_0..4; test_rmsnorm_4 holds the dims-4 cases; no stored version of
test_layernorm.cpp has dims-4 cases).  Order is ncnn's order.  Each case is
``{"shape": tuple in numpy order, "affine_size": int, "eps": float, "affine": int}``;
ncnn passes eps as a C float literal, so use ``np.float32(case["eps"])``.
Shapes: ncnn ``RandomMat(w)`` -> ``(w,)``, ``RandomMat(w, h)`` -> ``(h, w)``,
``RandomMat(w, h, c)`` -> ``(c, h, w)``, ``RandomMat(w, h, d, c)`` -> ``(c, d, h, w)``.

How ncnn's test_layer uses a case (tests/testutil.cpp): input = RandomMat(shape),
gamma = RandomMat(affine_size), beta = RandomMat(affine_size) (LayerNorm), values
uniform in [-1.2, 1.2) from ncnn's own PRNG seeded with SRAND(7767517), values with
|v| < 1e-4 set to 0.  The weights are always passed, but load_model reads them only
when affine=1.  The output of the generic layer (src/layer/layernorm.cpp, "naive")
is compared with the arch-optimised CPU layer and the Vulkan layer under these
Options (pack, fp16_packed, fp16_storage, fp16_arithmetic, bf16_packed+storage):
(0,0,0,0,0) (0,0,1,0,0) (0,0,1,1,0) (0,0,0,0,1) (1,0,0,0,0) (1,1,0,0,0)* (1,1,0,1,0)*
(1,0,1,0,0) (1,0,1,1,0) (1,0,0,0,1); * = Vulkan only.  Vulkan runs only for pack=1
options and always with fp16_arithmetic forced off.  With fp16/bf16 storage the
input and weights are first rounded through fp16/bf16.  Pass criterion per element
(NearlyEqual): |a-b| <= eps or |a-b| < eps*max(|a|,|b|), eps = 1e-3 for LayerNorm
(test_layer default) and 1e-4 for RMSNorm (passed explicitly); x100 with fp16/bf16
storage, x1000 with fp16 arithmetic.  One RMSNorm case carries
TEST_LAYER_DISABLE_GPU_TESTING: see ``RMSNORM_GPU_SKIPPED_CASES``.

ncnn's CPU algorithm (generic src/layer/layernorm.cpp and rmsnorm.cpp)
------------------------------------------------------------------------
Layout: a Mat has w, h, d, c; channel q starts at q*cstep (cstep = w*h*d rounded up
so each channel starts on a 16-byte boundary), so groups never cross channels.
Within a channel the data is dense in (d, h, w) order.  ``affine_size`` is used
(besides sizing gamma/beta) only for dims 3 and 4 to choose the grouping; it is
checked in the order w, then w*h (dims 4), then "anything else".

* dims 1 (w,): one group = all w elements; gamma/beta index = i (0..w-1).
  affine_size is not checked (assumed == w).
* dims 2 (h, w): h groups, one per row of w; gamma/beta index = column j.
  affine_size is not checked (assumed == w).
* dims 3 (c, h, w):
  - affine_size == w: c*h groups, one per row of w in each channel;
    gamma/beta index = column j (same gamma for every row and channel).
  - otherwise (meant for affine_size == w*h): c groups, one per channel of w*h
    elements; gamma/beta index = position in the channel = y*w + x.
* dims 4 (c, d, h, w):
  - affine_size == w: c*d*h groups (rows); gamma index = x.
  - else affine_size == w*h: c*d groups, one per depth slice of h*w;
    gamma index = y*w + x.
  - otherwise (meant for affine_size == w*h*d): c groups, one per channel of
    d*h*w; gamma index = z*h*w + y*w + x.
* affine_size that matches nothing: dims 3 -> whole-channel groups (w*h),
  dims 4 -> whole-channel groups (w*h*d), dims 1/2 -> rows as usual.  With
  affine=1 gamma/beta are then indexed past affine_size when affine_size is
  smaller than the group (out-of-bounds read, undefined); with affine=0 only the
  grouping is affected (e.g. affine_size=0 on dims 3/4 = whole channel).
  affine=1 with affine_size=0 fails to load (mb.load(0) is empty -> -100).

Per group of n = size elements, all float32, sequential loops:
  LayerNorm:
    sum = 0; for i: sum += x[i]
    mean = sum / n
    sqsum = 0; for i: v = x[i] - mean; sqsum += v * v
    var = sqsum / n
    a = 1.f / sqrtf(var + eps)
    b = -mean * a
    affine:  y[i] = (x[i] * a + b) * gamma[k] + beta[k]
    else:    y[i] = x[i] * a + b
  RMSNorm:
    sqsum = 0; for i: sqsum += x[i] * x[i]
    rms = sqsum / n
    a = 1.f / sqrtf(rms + eps)
    affine:  y[i] = (x[i] * a) * gamma[k]
    else:    y[i] = x[i] * a

What pip ncnn actually runs on an x86 CPU (LayerNorm_x86 / RMSNorm_x86, never the
generic layer): same grouping, but the sums use 16/8/4-wide SIMD partial
accumulators (AVX-512/AVX/SSE) plus a scalar tail, reduced at the end; the
square sums use FMA; for elempack 1: a = 1/sqrtf(var/n + eps), m = mean*a,
y = fma(fma(x, a, -m), gamma, beta); for packed blobs (elempack 4/8/16 when the
packed axis h (dims 2) or c (dims 3/4) divides) statistics are per SIMD lane and
1/sqrt is rsqrt(14) + Newton steps.  So CPU ncnn is not bit-exact to the sequential
formula above; differences are a few ulp.

ncnn's Vulkan layer (layernorm_vulkan.cpp, same rules for rmsnorm_vulkan.cpp):
returns the input unchanged when affine_size == 0.  Reduction groups: dims 1 -> w
(the blob is treated as unpacked), dims 2 -> rows, dims 3/4 -> rows if affine_size
== w, dims 4 depth slices if affine_size == w*h, else w*h*d; but the apply shader
indexes coeffs by (y*w + x) / affine_size and gamma/beta by (y*w + x) % affine_size
(h = h*d), so affine_size must equal the group size exactly for correct output.
"""

# Source: Tencent/ncnn tests/test_layernorm.cpp and tests/test_rmsnorm.cpp.

LAYERNORM_CASES = [
    # test_layernorm_0: dims 3, affine_size == w (per-row groups)
    {"shape": (2, 4, 6), "affine_size": 6, "eps": 0.01, "affine": 0},  # RandomMat(6, 4, 2)
    {"shape": (6, 5, 4), "affine_size": 4, "eps": 0.01, "affine": 0},  # RandomMat(4, 5, 6)
    {"shape": (8, 3, 3), "affine_size": 3, "eps": 0.002, "affine": 0},  # RandomMat(3, 3, 8)
    {"shape": (12, 6, 5), "affine_size": 5, "eps": 0.02, "affine": 0},  # RandomMat(5, 6, 12)
    {"shape": (16, 7, 4), "affine_size": 4, "eps": 0.02, "affine": 0},  # RandomMat(4, 7, 16)
    {"shape": (24, 7, 6), "affine_size": 6, "eps": 0.001, "affine": 0},  # RandomMat(6, 7, 24)
    {"shape": (32, 8, 5), "affine_size": 5, "eps": 0.001, "affine": 0},  # RandomMat(5, 8, 32)
    {"shape": (2, 4, 6), "affine_size": 6, "eps": 0.01, "affine": 1},  # RandomMat(6, 4, 2)
    {"shape": (6, 5, 4), "affine_size": 4, "eps": 0.01, "affine": 1},  # RandomMat(4, 5, 6)
    {"shape": (8, 3, 3), "affine_size": 3, "eps": 0.002, "affine": 1},  # RandomMat(3, 3, 8)
    {"shape": (12, 6, 5), "affine_size": 5, "eps": 0.02, "affine": 1},  # RandomMat(5, 6, 12)
    {"shape": (16, 7, 4), "affine_size": 4, "eps": 0.02, "affine": 1},  # RandomMat(4, 7, 16)
    {"shape": (24, 7, 6), "affine_size": 6, "eps": 0.001, "affine": 1},  # RandomMat(6, 7, 24)
    {"shape": (32, 8, 5), "affine_size": 5, "eps": 0.001, "affine": 1},  # RandomMat(5, 8, 32)
    # test_layernorm_1: dims 3, affine_size == w*h (per-channel groups)
    {"shape": (2, 4, 6), "affine_size": 24, "eps": 0.01, "affine": 0},  # RandomMat(6, 4, 2)
    {"shape": (6, 5, 4), "affine_size": 20, "eps": 0.01, "affine": 0},  # RandomMat(4, 5, 6)
    {"shape": (8, 3, 3), "affine_size": 9, "eps": 0.002, "affine": 0},  # RandomMat(3, 3, 8)
    {"shape": (12, 6, 5), "affine_size": 30, "eps": 0.02, "affine": 0},  # RandomMat(5, 6, 12)
    {"shape": (16, 7, 4), "affine_size": 28, "eps": 0.02, "affine": 0},  # RandomMat(4, 7, 16)
    {"shape": (24, 7, 6), "affine_size": 42, "eps": 0.001, "affine": 0},  # RandomMat(6, 7, 24)
    {"shape": (32, 8, 5), "affine_size": 40, "eps": 0.001, "affine": 0},  # RandomMat(5, 8, 32)
    {"shape": (2, 4, 6), "affine_size": 24, "eps": 0.01, "affine": 1},  # RandomMat(6, 4, 2)
    {"shape": (6, 5, 4), "affine_size": 20, "eps": 0.01, "affine": 1},  # RandomMat(4, 5, 6)
    {"shape": (8, 3, 3), "affine_size": 9, "eps": 0.002, "affine": 1},  # RandomMat(3, 3, 8)
    {"shape": (12, 6, 5), "affine_size": 30, "eps": 0.02, "affine": 1},  # RandomMat(5, 6, 12)
    {"shape": (16, 7, 4), "affine_size": 28, "eps": 0.02, "affine": 1},  # RandomMat(4, 7, 16)
    {"shape": (24, 7, 6), "affine_size": 42, "eps": 0.001, "affine": 1},  # RandomMat(6, 7, 24)
    {"shape": (32, 8, 5), "affine_size": 40, "eps": 0.001, "affine": 1},  # RandomMat(5, 8, 32)
    # test_layernorm_2: dims 2, affine_size == w
    {"shape": (2, 4), "affine_size": 4, "eps": 0.01, "affine": 0},  # RandomMat(4, 2)
    {"shape": (6, 5), "affine_size": 5, "eps": 0.01, "affine": 0},  # RandomMat(5, 6)
    {"shape": (8, 3), "affine_size": 3, "eps": 0.002, "affine": 0},  # RandomMat(3, 8)
    {"shape": (12, 6), "affine_size": 6, "eps": 0.02, "affine": 0},  # RandomMat(6, 12)
    {"shape": (16, 4), "affine_size": 4, "eps": 0.02, "affine": 0},  # RandomMat(4, 16)
    {"shape": (24, 7), "affine_size": 7, "eps": 0.001, "affine": 0},  # RandomMat(7, 24)
    {"shape": (32, 8), "affine_size": 8, "eps": 0.001, "affine": 0},  # RandomMat(8, 32)
    {"shape": (2, 4), "affine_size": 4, "eps": 0.01, "affine": 1},  # RandomMat(4, 2)
    {"shape": (6, 5), "affine_size": 5, "eps": 0.01, "affine": 1},  # RandomMat(5, 6)
    {"shape": (8, 3), "affine_size": 3, "eps": 0.002, "affine": 1},  # RandomMat(3, 8)
    {"shape": (12, 6), "affine_size": 6, "eps": 0.02, "affine": 1},  # RandomMat(6, 12)
    {"shape": (16, 4), "affine_size": 4, "eps": 0.02, "affine": 1},  # RandomMat(4, 16)
    {"shape": (24, 7), "affine_size": 7, "eps": 0.001, "affine": 1},  # RandomMat(7, 24)
    {"shape": (32, 8), "affine_size": 8, "eps": 0.001, "affine": 1},  # RandomMat(8, 32)
    # test_layernorm_3: dims 1, affine_size == w
    {"shape": (2,), "affine_size": 2, "eps": 0.01, "affine": 0},  # RandomMat(2)
    {"shape": (6,), "affine_size": 6, "eps": 0.01, "affine": 0},  # RandomMat(6)
    {"shape": (8,), "affine_size": 8, "eps": 0.002, "affine": 0},  # RandomMat(8)
    {"shape": (12,), "affine_size": 12, "eps": 0.02, "affine": 0},  # RandomMat(12)
    {"shape": (16,), "affine_size": 16, "eps": 0.02, "affine": 0},  # RandomMat(16)
    {"shape": (24,), "affine_size": 24, "eps": 0.001, "affine": 0},  # RandomMat(24)
    {"shape": (32,), "affine_size": 32, "eps": 0.001, "affine": 0},  # RandomMat(32)
    {"shape": (2,), "affine_size": 2, "eps": 0.01, "affine": 1},  # RandomMat(2)
    {"shape": (6,), "affine_size": 6, "eps": 0.01, "affine": 1},  # RandomMat(6)
    {"shape": (8,), "affine_size": 8, "eps": 0.002, "affine": 1},  # RandomMat(8)
    {"shape": (12,), "affine_size": 12, "eps": 0.02, "affine": 1},  # RandomMat(12)
    {"shape": (16,), "affine_size": 16, "eps": 0.02, "affine": 1},  # RandomMat(16)
    {"shape": (24,), "affine_size": 24, "eps": 0.001, "affine": 1},  # RandomMat(24)
    {"shape": (32,), "affine_size": 32, "eps": 0.001, "affine": 1},  # RandomMat(32)
]

# test_rmsnorm_0..3 are test_layernorm_0..3 case for case (the same shapes, eps and affine); then dims 4.
RMSNORM_DIMS4_CASES = [
    # test_rmsnorm_4: dims 4, affine_size == w / w*h / w*h*d
    {"shape": (8, 2, 3, 5), "affine_size": 5, "eps": 0.01, "affine": 0},  # RandomMat(5, 3, 2, 8)
    {"shape": (5, 2, 3, 4), "affine_size": 4, "eps": 0.01, "affine": 1},  # RandomMat(4, 3, 2, 5)
    {"shape": (8, 2, 3, 5), "affine_size": 15, "eps": 0.002, "affine": 0},  # RandomMat(5, 3, 2, 8)
    {"shape": (5, 2, 3, 4), "affine_size": 12, "eps": 0.002, "affine": 1},  # RandomMat(4, 3, 2, 5)
    {"shape": (8, 2, 3, 5), "affine_size": 30, "eps": 0.001, "affine": 0},  # RandomMat(5, 3, 2, 8)
    {"shape": (5, 2, 3, 4), "affine_size": 24, "eps": 0.001, "affine": 1},  # RandomMat(4, 3, 2, 5)
]
RMSNORM_CASES = LAYERNORM_CASES + RMSNORM_DIMS4_CASES

# Cases ncnn runs with TEST_LAYER_DISABLE_GPU_TESTING (CPU-only in ncnn's own test):
# test_rmsnorm(RandomMat(5, 8, 32), 5, 0.001f, 0, TEST_LAYER_DISABLE_GPU_TESTING).
RMSNORM_GPU_SKIPPED_CASES = [
    {"shape": (32, 8, 5), "affine_size": 5, "eps": 0.001, "affine": 0},
]

# NOT from ncnn's tests: test_layernorm.cpp has no dims-4 cases, although
# LayerNorm supports dims 4 with the same rules as RMSNorm.  These mirror
# test_rmsnorm_4 for LayerNorm.
LAYERNORM_DIMS4_EXTRA_CASES = RMSNORM_DIMS4_CASES

# ncnn test_layer comparison tolerances (NearlyEqual epsilon), fp32 options.
LAYERNORM_TEST_EPSILON = 1e-3
RMSNORM_TEST_EPSILON = 1e-4

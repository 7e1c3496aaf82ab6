#!/usr/bin/env python3
"""Build the small ncnn test models under tests/data/ for vknorm.

Each model is a tiny, deterministic PyTorch module (CPU torch, fixed seed,
explicit non-trivial affine weights) converted with pnnx to an ncnn
``NAME.ncnn.param`` / ``NAME.ncnn.bin`` pair.  Only those two files are copied
into the output directory; pnnx's other artefacts stay in a temp dir.

After conversion every model is checked with pyncnn on the CPU path against the
torch output (``--no-verify`` skips it) and its norm layers are checked against
the expected types/params.  ``--vulkan`` also runs the fp32 Vulkan path (e.g.
mesa lavapipe) and reports its error vs the CPU path.  ``--json FILE`` writes
the collected facts (input/output blobs and shapes, norm layers, errors).

Weights are stored fp32 (pnnx fp16=0) so ncnn CPU matches torch to ~1e-6.

pnnx pitfalls met while writing this:
  * don't trace under torch.no_grad(): nn.TransformerEncoderLayer then uses
    its fused fast path, which pnnx can't convert;
  * nn.RMSNorm(eps=None) is exported as "1=0.0" (torch uses finfo.eps at run
    time), so always pass eps explicitly;
  * F.scaled_dot_product_attention is left as an unconvertible op; write the
    attention out (matmul/softmax) instead;
  * LayerNorm over a whole dims-3 blob (see the note above MODELS) is wrong
    in ncnn.

GroupNorm / InstanceNorm models (sd_resblock*, instnorm_*) get their affine
weights from init_group_norms (weight U[0.5, 1.5], bias 0.1 N) instead of
init_affine; pnnx emits nn.GroupNorm as ncnn GroupNorm, nn.InstanceNorm2d as
ncnn InstanceNorm and nn.SiLU as ncnn Swish.

Run it from the dedicated venv (see tools/requirements-models.txt), e.g.
    /opt/vknorm-models-venv/bin/python tools/make_models.py --out tests/data
"""

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # the project's venv has no torch: `make models` makes the one this runs in
    print("make_models.py needs torch and pnnx: run `make models` (it sets up their venv and runs this)",
          file=sys.stderr)
    sys.exit(2)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NORM_TYPES = ("LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm")


# --------------------------------------------------------------------------
# helpers


def init_affine(module, seed):
    """Give a LayerNorm / RMSNorm explicit, non-trivial affine weights."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if getattr(module, "weight", None) is not None:
            w = module.weight
            w.copy_(1.0 + 0.1 * torch.randn(w.shape, generator=g))
        if getattr(module, "bias", None) is not None:
            b = module.bias
            b.copy_(0.1 * torch.randn(b.shape, generator=g))


def init_all_norms(model, seed):
    i = 0
    for m in model.modules():
        if isinstance(m, (nn.LayerNorm, nn.RMSNorm)):
            init_affine(m, seed * 100 + i)
            i += 1
    init_group_norms(model, seed)


def init_group_norms(model, seed):
    """Give every affine GroupNorm / InstanceNorm explicit, non-trivial weights:
    weight ~ U[0.5, 1.5], bias ~ 0.1 N (own generator, so the other norms'
    init and the conv weights drawn from the global seed are unaffected)."""
    g = torch.Generator().manual_seed(seed * 1000 + 7)
    with torch.no_grad():
        for m in model.modules():
            if not isinstance(m, (nn.GroupNorm, nn.InstanceNorm1d,
                                  nn.InstanceNorm2d, nn.InstanceNorm3d)):
                continue
            if getattr(m, "weight", None) is not None:
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
            if getattr(m, "bias", None) is not None:
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))


# --------------------------------------------------------------------------
# models


class TransformerBlock(nn.Module):
    """Pre-norm transformer encoder block + final LayerNorm (seq 16, d 64)."""

    def __init__(self, d=64, heads=4, ff=128):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            d, heads, dim_feedforward=ff, dropout=0.0, activation="gelu",
            batch_first=True, norm_first=True)
        self.final_norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.final_norm(self.layer(x))


class ConvNeXtBlock(nn.Module):
    """dwconv7x7 -> NHWC LayerNorm(c) -> Linear -> GELU -> Linear -> residual."""

    def __init__(self, c=32):
        super().__init__()
        self.dwconv = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.pwconv1 = nn.Linear(c, 4 * c)
        self.pwconv2 = nn.Linear(4 * c, c)

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)  # N C H W -> N H W C
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class LlamaBlock(nn.Module):
    """RMSNorm -> causal MHA (hand-written) -> +, RMSNorm -> SwiGLU -> +."""

    def __init__(self, d=64, heads=4, ff=128, seq=16):
        super().__init__()
        self.heads = heads
        self.head_dim = d // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.attn_norm = nn.RMSNorm(d, eps=1e-6)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.mlp_norm = nn.RMSNorm(d, eps=1e-6)
        self.w_gate = nn.Linear(d, ff, bias=False)
        self.w_up = nn.Linear(d, ff, bias=False)
        self.w_down = nn.Linear(ff, d, bias=False)
        self.register_buffer("causal_mask",
                             torch.triu(torch.full((seq, seq), -1e4), 1))

    def forward(self, x):
        b, t, d = x.shape
        h, hd = self.heads, self.head_dim
        y = self.attn_norm(x)
        q = self.wq(y).view(b, t, h, hd).transpose(1, 2)
        k = self.wk(y).view(b, t, h, hd).transpose(1, 2)
        v = self.wv(y).view(b, t, h, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * self.scale + self.causal_mask
        a = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.wo(a)
        y = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(y)) * self.w_up(y))


class LayerNorm2d(nn.Module):
    """conv3x3 -> LayerNorm over (h, w): one group of w*h per channel."""

    def __init__(self, c=8, h=6, w=10):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.norm = nn.LayerNorm([h, w])

    def forward(self, x):
        return self.norm(self.conv(x))


class NormVariants(nn.Module):
    """Non-affine and 2-D variants on a dims-3 blob (c=8, h=6, w=10)."""

    def __init__(self, c=8, h=6, w=10):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.ln_rows_noaffine = nn.LayerNorm(w, eps=1e-5, elementwise_affine=False)
        self.rms_2d = nn.RMSNorm([h, w], eps=1e-5)
        self.rms_rows_noaffine = nn.RMSNorm(w, eps=1e-5, elementwise_affine=False)

    def forward(self, x):
        x = self.ln_rows_noaffine(self.conv(x))
        x = self.rms_2d(x)
        return self.rms_rows_noaffine(x)


class LayerNorm1d(nn.Module):
    """Linear -> LayerNorm on a dims-1 blob (w=64)."""

    def __init__(self, d=64):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(self.fc(x))


class LayerNorm4d(nn.Module):
    """LayerNorm over w, then over (h, w), then over (d, h, w) of a dims-4 blob."""

    def __init__(self, c=4, d=3, h=5, w=8):
        super().__init__()
        self.conv = nn.Conv3d(c, c, 1)
        self.ln_w = nn.LayerNorm(w)
        self.ln_hw = nn.LayerNorm([h, w])
        self.ln_dhw = nn.LayerNorm([d, h, w])

    def forward(self, x):
        return self.ln_dhw(self.ln_hw(self.ln_w(self.conv(x))))


class LNResidualStack(nn.Module):
    """12 pre-norm residual steps x = x + GELU(LayerNorm_i(x)) on a dims-2 blob
    (seq 197, d 768, ViT-B/16 sized): LayerNorm-dominated (per step ncnn runs
    Split, LayerNorm, GELU and one BinaryOp add), no Linear layers, so the .bin
    holds only the 12 LayerNorms' gamma/beta (~74 KB).

    Each LayerNorm's affine weights are scaled by AFFINE_SCALE after the usual
    init (gamma ~ 0.25 * (1 + 0.1 N), beta ~ 0.25 * 0.1 N), as a pre-norm branch
    with a small output gain: it keeps the residual stream's magnitude moderate.
    With unit gain x grows to |x| ~ 80 at the last LayerNorm's input, and float16
    storage of each LayerNorm's input (rounding error ~|x| * 2^-11) then exceeds
    the tests' fixed tolerances."""

    AFFINE_SCALE = 0.25

    def __init__(self, d=768, depth=12):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(d, eps=1e-5) for _ in range(depth))

    def after_init(self):
        with torch.no_grad():
            for norm in self.norms:
                norm.weight.mul_(self.AFFINE_SCALE)
                norm.bias.mul_(self.AFFINE_SCALE)

    def forward(self, x):
        for norm in self.norms:
            x = x + F.gelu(norm(x))
        return x


class SDResBlock(nn.Module):
    """Stable-Diffusion-style residual block (no time embedding):
    h = conv(SiLU(GroupNorm(32, c)(x))); h = conv(SiLU(GroupNorm(32, c)(h)));
    out = x + h.  c=64 gives 2 channels per group; c=320 gives 10 channels
    per group, so groups straddle ncnn's pack-4 channel packing."""

    def __init__(self, c=64, groups=32, k=3, eps=1e-5):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, c, eps=eps)
        self.conv1 = nn.Conv2d(c, c, k, padding=k // 2)
        self.norm2 = nn.GroupNorm(groups, c, eps=eps)
        self.conv2 = nn.Conv2d(c, c, k, padding=k // 2)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return x + h


class SDResBlockC320(SDResBlock):
    """SDResBlock at 320 channels (SD's first UNet stage), GroupNorm(32, 320).
    1x1 convs instead of 3x3: two 3x3 320->320 convs are ~7.4 MB of fp32
    weights, over the ~3 MB budget for a committed test model; two 1x1 convs
    are ~0.8 MB.  The norms, the part under test, are unchanged."""

    def __init__(self):
        super().__init__(c=320, groups=32, k=1)


class InstNormBlock(nn.Module):
    """Style-transfer / GAN-generator residual block:
    conv3x3 -> InstanceNorm2d(affine) -> ReLU -> conv3x3 -> InstanceNorm2d(affine) -> + x."""

    def __init__(self, c=16, eps=1e-5):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.in1 = nn.InstanceNorm2d(c, eps=eps, affine=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.in2 = nn.InstanceNorm2d(c, eps=eps, affine=True)

    def forward(self, x):
        h = F.relu(self.in1(self.conv1(x)))
        return x + self.in2(self.conv2(h))


class InstNormNoAffine(nn.Module):
    """conv3x3 -> InstanceNorm2d(affine=False) -> ReLU on an odd 7x7 map."""

    def __init__(self, c=8, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.norm = nn.InstanceNorm2d(c, eps=eps, affine=False)

    def forward(self, x):
        return F.relu(self.norm(self.conv(x)))


# Deliberately NOT built: nn.LayerNorm([c, h, w]) over a whole dims-3 blob.
# pnnx emits "LayerNorm 0=w*h*c" (e.g. 0=480 for 8x6x10), but ncnn's CPU
# LayerNorm treats any dims-3 affine_size != w as one group of w*h per channel
# and indexes gamma/beta [0, w*h) for every channel, so the ncnn result does not
# match torch (max abs err ~1.3 with non-trivial weights).


# name -> (factory, torch input shape incl. batch 1, seed,
#          expected norm layers in graph order: see norm_key())
MODELS = {
    "transformer_block": (TransformerBlock, (1, 16, 64), 1,
                          [("LayerNorm", 64, 1)] * 3),
    "convnext_block": (ConvNeXtBlock, (1, 32, 14, 14), 2,
                       [("LayerNorm", 32, 1)]),
    "llama_block": (LlamaBlock, (1, 16, 64), 3,
                    [("RMSNorm", 64, 1)] * 2),
    "layernorm_2d": (LayerNorm2d, (1, 8, 6, 10), 4,
                     [("LayerNorm", 60, 1)]),
    "norm_variants": (NormVariants, (1, 8, 6, 10), 5,
                      [("LayerNorm", 10, 0), ("RMSNorm", 60, 1),
                       ("RMSNorm", 10, 0)]),
    "layernorm_1d": (LayerNorm1d, (1, 64), 6,
                     [("LayerNorm", 64, 1)]),
    "layernorm_4d": (LayerNorm4d, (1, 4, 3, 5, 8), 7,
                     [("LayerNorm", 8, 1), ("LayerNorm", 40, 1),
                      ("LayerNorm", 120, 1)]),
    "ln_residual_stack": (LNResidualStack, (1, 197, 768), 8,
                          [("LayerNorm", 768, 1)] * 12),
    "sd_resblock": (SDResBlock, (1, 64, 16, 16), 9,
                    [("GroupNorm", 32, 64, 1)] * 2),
    "sd_resblock_c320": (SDResBlockC320, (1, 320, 8, 8), 10,
                         [("GroupNorm", 32, 320, 1)] * 2),
    "instnorm_block": (InstNormBlock, (1, 16, 24, 24), 11,
                       [("InstanceNorm", 16, 1)] * 2),
    "instnorm_noaffine": (InstNormNoAffine, (1, 8, 7, 7), 12,
                          [("InstanceNorm", 8, 0)]),
}


def norm_key(layer):
    """A norm layer's identifying params as in MODELS' expected lists:
    LayerNorm/RMSNorm (type, 0=affine_size, 2=affine);
    GroupNorm (type, 0=group, 1=channels, 3=affine);
    InstanceNorm (type, 0=channels, 2=affine).  ncnn defaults: affine=1."""
    p = layer["params"]
    if layer["type"] == "GroupNorm":
        return (layer["type"], int(p.get("0", 1)), int(p.get("1", 0)),
                int(p.get("3", 1)))
    return (layer["type"], int(p.get("0", 0)), int(p.get("2", 1)))


def build(name):
    factory, shape, seed, _ = MODELS[name]
    torch.manual_seed(seed)
    model = factory().eval()
    init_all_norms(model, seed)
    if hasattr(model, "after_init"):
        model.after_init()
    x = torch.randn(shape)
    return model, x


# --------------------------------------------------------------------------
# conversion


@contextlib.contextmanager
def pushd(path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def convert(name, model, x, out_dir, fp16):
    import pnnx

    with tempfile.TemporaryDirectory(prefix="vknorm-pnnx-") as tmp, pushd(tmp):
        # NOT under torch.no_grad(): with grad disabled, nn.TransformerEncoderLayer
        # takes its fused fast path (aten::_transformer_encoder_layer_fwd), which
        # pnnx cannot convert.  pnnx.export swallows the converter's stdout and
        # does not raise on failure, so check the produced files ourselves.
        pnnx.export(model, name + ".pt", (x,), check_trace=False, fp16=fp16)
        for ext in ("param", "bin"):
            src = "%s.ncnn.%s" % (name, ext)
            if not os.path.isfile(src):
                raise RuntimeError("pnnx did not produce %s for %s" % (src, name))
            shutil.copyfile(src, os.path.join(out_dir, src))


# --------------------------------------------------------------------------
# param parsing / verification


def parse_param(path):
    """Return list of layer dicts from an ncnn text .param file."""
    with open(path) as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    assert lines[0] == "7767517", "bad param magic in %s" % path
    layers = []
    for ln in lines[2:]:
        tok = ln.split()
        typ, lname, nb, nt = tok[0], tok[1], int(tok[2]), int(tok[3])
        bottoms = tok[4:4 + nb]
        tops = tok[4 + nb:4 + nb + nt]
        params = {}
        for kv in tok[4 + nb + nt:]:
            k, v = kv.split("=", 1)
            params[k] = v
        layers.append(dict(type=typ, name=lname, bottoms=bottoms, tops=tops,
                           params=params))
    return layers


def ncnn_shape(mat):
    """ncnn dims, outermost first, batch already absent: e.g. [16, 64] (h, w)."""
    if mat.dims == 1:
        return [mat.w]
    if mat.dims == 2:
        return [mat.h, mat.w]
    if mat.dims == 3:
        return [mat.c, mat.h, mat.w]
    return [mat.c, mat.d, mat.h, mat.w]


def make_net(param, binf, vulkan=False):
    import ncnn

    net = ncnn.Net()
    # must be set before load_param
    net.opt.use_vulkan_compute = vulkan
    # fp32 everywhere so the comparison against torch is tight
    net.opt.use_fp16_storage = False
    net.opt.use_fp16_packed = False
    net.opt.use_fp16_arithmetic = False
    net.opt.use_bf16_storage = False
    net.opt.num_threads = 1
    # keep intermediate blobs so they can be extracted for shape reporting
    net.opt.lightmode = False
    if net.load_param(param) != 0 or net.load_model(binf) != 0:
        raise RuntimeError("ncnn failed to load %s" % param)
    return net


def run_ncnn(net, inputs, outputs):
    """inputs: {name: np.ndarray (no batch)}; returns {name: ncnn.Mat}.

    ncnn.Mat(ndarray) borrows the array's memory without keeping it alive, so
    the array must outlive the Mat; .clone() gives ncnn its own copy (a borrowed
    Mat fed to a layer that runs in place under lightmode segfaults).
    """
    import ncnn

    ex = net.create_extractor()
    keep = []
    for k, v in inputs.items():
        arr = np.ascontiguousarray(v, dtype=np.float32)
        keep.append(arr)
        ex.input(k, ncnn.Mat(arr).clone())
    res = {}
    for k in outputs:
        ret, m = ex.extract(k)
        if ret != 0:
            raise RuntimeError("extract(%s) failed: %d" % (k, ret))
        res[k] = m
    return res


def verify(name, out_dir, model, x, tol, vulkan=False):
    param = os.path.join(out_dir, name + ".ncnn.param")
    binf = os.path.join(out_dir, name + ".ncnn.bin")
    layers = parse_param(param)
    in_names = [l["tops"][0] for l in layers if l["type"] == "Input"]
    consumed = {b for l in layers for b in l["bottoms"]}
    out_names = [t for l in layers for t in l["tops"] if t not in consumed]
    norms = [l for l in layers if l["type"] in NORM_TYPES]

    with torch.no_grad():
        ref = model(x).numpy()[0]

    net = make_net(param, binf)
    norm_blobs = [b for l in norms for b in (l["bottoms"][0], l["tops"][0])]
    mats = run_ncnn(net, {in_names[0]: x.numpy()[0]}, out_names + norm_blobs)
    got = np.array(mats[out_names[0]]).reshape(ref.shape)
    err = float(np.abs(got - ref).max())

    vk_err = None
    if vulkan:
        # fp32 Vulkan path (lavapipe on a GPU-less machine) vs the CPU path,
        # on the outputs and on every norm layer's output blob
        vnet = make_net(param, binf, vulkan=True)
        tops = out_names + [l["tops"][0] for l in norms]
        vmats = run_ncnn(vnet, {in_names[0]: x.numpy()[0]}, tops)
        vk_err = {b: float(np.abs(np.array(vmats[b]) - np.array(mats[b])).max())
                  for b in tops}

    expected = MODELS[name][3]
    found = [norm_key(l) for l in norms]
    problems = []
    if found != expected:
        problems.append("norm layers %s != expected %s" % (found, expected))
    if not err <= tol:
        problems.append("max abs err %.3g > %.3g" % (err, tol))

    info = dict(
        name=name,
        inputs=[dict(blob=n, shape=list(x.shape[1:])) for n in in_names],
        outputs=[dict(blob=n, shape=ncnn_shape(mats[n])) for n in out_names],
        norm_layers=[dict(type=l["type"], name=l["name"],
                          params={k: l["params"][k] for k in sorted(l["params"])},
                          bottom=l["bottoms"][0], top=l["tops"][0],
                          bottom_shape=ncnn_shape(mats[l["bottoms"][0]]))
                     for l in norms],
        layer_types=sorted({l["type"] for l in layers}),
        max_abs_err=err,
        vulkan_vs_cpu_max_abs_err=vk_err,
        problems=problems,
    )
    return info


def print_info(info):
    ins = ", ".join("%s %s" % (i["blob"], "x".join(map(str, i["shape"])))
                    for i in info["inputs"])
    outs = ", ".join("%s %s" % (o["blob"], "x".join(map(str, o["shape"])))
                     for o in info["outputs"])
    print("%-18s in: %-16s out: %-16s max|err| = %.3g"
          % (info["name"], ins, outs, info["max_abs_err"]))
    for n in info["norm_layers"]:
        p = " ".join("%s=%s" % kv for kv in n["params"].items())
        print("    %-9s %-8s %-30s bottom %s %s" % (
            n["type"], n["name"], p, n["bottom"],
            "x".join(map(str, n["bottom_shape"]))))
    if info["vulkan_vs_cpu_max_abs_err"]:
        print("    vulkan vs cpu max|err|: " + ", ".join(
            "%s %.3g" % kv for kv in info["vulkan_vs_cpu_max_abs_err"].items()))
    for p in info["problems"]:
        print("    PROBLEM:", p)


# --------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO_ROOT, "tests", "data"),
                    help="output directory (default: <repo>/tests/data)")
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS),
                    help="build only these models")
    ap.add_argument("--no-verify", action="store_true",
                    help="skip the pyncnn check")
    ap.add_argument("--fp16", action="store_true",
                    help="store weights as fp16 in .bin (default fp32)")
    ap.add_argument("--tol", type=float, default=1e-4,
                    help="max abs error allowed vs torch (default 1e-4)")
    ap.add_argument("--vulkan", action="store_true",
                    help="also run the fp32 Vulkan path (needs a Vulkan "
                         "device, e.g. mesa lavapipe) and report its error "
                         "vs the CPU path (informational only)")
    ap.add_argument("--json", help="write model facts to this JSON file")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)

    if args.vulkan and not args.no_verify:
        import ncnn
        if ncnn.get_gpu_count() == 0:
            print("--vulkan: ncnn sees no Vulkan device, skipping the Vulkan check")
            args.vulkan = False

    names = args.only or list(MODELS)
    infos = []
    failed = False
    for name in names:
        model, x = build(name)
        convert(name, model, x, out_dir, args.fp16)
        if args.no_verify:
            print("%-18s written" % name)
            continue
        info = verify(name, out_dir, model, x,
                      args.tol if not args.fp16 else max(args.tol, 1e-2),
                      vulkan=args.vulkan)
        print_info(info)
        infos.append(info)
        failed |= bool(info["problems"])

    if args.json:
        with open(args.json, "w") as f:
            json.dump(infos, f, indent=2)
    total = sum(os.path.getsize(os.path.join(out_dir, n + ".ncnn." + e))
                for n in names for e in ("param", "bin"))
    print("wrote %d models to %s (%d bytes)" % (len(names), out_dir, total))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

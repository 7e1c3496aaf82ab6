"""Test support: run ncnn models in ncnn's Vulkan graph (stock, and with vknorm's layers inside) and
measure every norm blob (LayerNorm, RMSNorm, GroupNorm, InstanceNorm) and model output. Runs as a child process (``python
tests/graph_runs.py OUT.json``) so that ncnn's own Vulkan instance can be created under the Khronos
validation layer (see ``validated_env``); the parent test reads the JSON and the validation log.

For each committed model x storage (fp32, fp16) x packing (on, off) it runs
  * stock ncnn CPU fp32 (the reference),
  * stock ncnn Vulkan,
  * ncnn Vulkan with vknorm's layers (vknorm.graph),
and records, per norm layer: max |err| of each Vulkan run against the CPU run on the same blob, and
vknorm's error against float64 computed from the very input the layer saw in that run (for float16
storage that input is already float16-rounded, so this isolates the kernel from the storage), with the
excess over float16 output rounding; per model output: both Vulkan runs' error against the CPU run;
and vknorm's forward counters.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)
import validation_layer  # noqa: E402
from reference import channel_norm64, half_fp16_spacing  # noqa: E402

NORM_TYPES = ("LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm")
DATA = os.path.join(TESTS_DIR, "data")


def validated_env(log_path: str, settings_dir: str) -> dict:
    """Environment that loads the Khronos validation layer (with synchronization validation) into every
    Vulkan instance of the process, ncnn's included, and logs every warning or error to ``log_path``."""
    validation_layer.write_settings(settings_dir, log_path)
    env = dict(os.environ)
    env["VK_INSTANCE_LAYERS"] = "VK_LAYER_KHRONOS_validation"
    env["VK_LAYER_SETTINGS_PATH"] = settings_dir
    # ncnn loads a driver named by VK_DRIVER_FILES / VK_ICD_FILENAMES itself, bypassing the Vulkan loader and
    # with it every layer (a host whose loader does not find its GPU's driver unaided names it so): the loader
    # gets the same driver as an addition instead, and ncnn goes through it.
    named = [env.pop(k) for k in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES") if k in env]
    if named:
        env["VK_ADD_DRIVER_FILES"] = os.pathsep.join([*named, *filter(None, [env.get("VK_ADD_DRIVER_FILES")])])
    return env


def run_validated(tmp_path, script: str, *args, env: dict = None, unset=(), timeout: int = 300):
    """Runs `script` (python -c, with `args`) in a child process under validated_env, with the variables in
    `unset` removed and `env` added: (CompletedProcess, the validation log's text, "" when nothing came). The
    layer opens its log when an instance loads it: no log is a run the layer never saw, which fails here."""
    import subprocess

    log = tmp_path / "validation.log"
    full = validated_env(str(log), str(tmp_path))
    for k in unset:
        full.pop(k, None)
    full.update(env or {})
    proc = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=full, capture_output=True, text=True,
                          timeout=timeout)
    assert log.exists(), f"the validation layer wrote no log: not loaded (stderr: {proc.stderr[-2000:]})"
    return proc, log.read_text()


def models() -> dict:
    with open(os.path.join(DATA, "models.json")) as f:
        table = json.load(f)
    return {k: tuple(int(v) for v in dims.split("x")) for k, dims in table.items() if not k.startswith("_")}


def norm_layers(param_path: str):
    """(name, type, bottom blob, top blob) of every norm line of a .param."""
    out = []
    with open(param_path) as f:
        lines = f.read().split("\n")[2:]
    for line in lines:
        parts = line.split()
        if len(parts) < 4 or parts[0] not in NORM_TYPES:
            continue
        nb = int(parts[2])
        out.append((parts[1], parts[0], parts[4], parts[4 + nb]))
    return out


def output_blobs(param_path: str):
    """Blobs that no layer consumes: the model's outputs."""
    produced, consumed = [], set()
    with open(param_path) as f:
        lines = f.read().split("\n")[2:]
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        nb, nt = int(parts[2]), int(parts[3])
        consumed.update(parts[4:4 + nb])
        produced += parts[4 + nb:4 + nb + nt]
    return [b for b in produced if b not in consumed]


def group_size(shape, affine_size: int) -> int:
    """ncnn's groups for a numpy shape (w), (h, w), (c, h, w), (c, d, h, w)."""
    if len(shape) <= 2:
        return shape[-1]
    w, h = shape[-1], shape[-2]
    if affine_size == w:
        return w
    if len(shape) == 4 and affine_size == w * h:
        return w * h
    return int(np.prod(shape[1:]))


def layer_reference64(x, layer: dict):
    """float64 of a vknorm layer (vknorm_layers() record) applied to x."""
    gamma = layer["gamma"] if layer["affine"] else None
    beta = layer["beta"] if layer["affine"] else None
    if layer["type"] in ("GroupNorm", "InstanceNorm"):
        return channel_norm64(layer["type"], x, layer["eps"], layer.get("group", 1), gamma, beta)
    return reference64(x, layer["type"], layer["eps"], layer["affine_size"], gamma, beta)


def reference64(x, op: str, eps: float, affine_size: int, gamma=None, beta=None):
    """float64 LayerNorm/RMSNorm of x, grouped as ncnn groups it; gamma/beta run along each group."""
    x = np.asarray(x, np.float64)
    g = x.reshape(-1, group_size(x.shape, affine_size))
    if op == "LayerNorm":
        y = (g - g.mean(1, keepdims=True)) / np.sqrt(g.var(1, keepdims=True) + eps)
    else:
        y = g / np.sqrt((g * g).mean(1, keepdims=True) + eps)
    if gamma is not None:
        y = y * np.asarray(gamma, np.float64)
        if op == "LayerNorm" and beta is not None:
            y = y + np.asarray(beta, np.float64)
    return y.reshape(x.shape)


def run_net(graph, param, binp, inputs, blobs, vknorm, vulkan, fp16=False, packing=True):
    # The model as it is (fusion off): every norm blob of the param stays extractable by name.
    net = graph.configure(graph.Net(vknorm=vknorm, fuse=False), vulkan=vulkan, fp16=fp16, packing=packing,
                          lightmode=False)
    assert net.load_param(param) == 0 and net.load_model(binp) == 0, param
    out = extract_all(graph, net, inputs, blobs, label=param)
    info = {"counters": net.vknorm_counters(), "layers": net.vknorm_layers() if vknorm else []}
    del net
    return out, info


def extract_all(graph, net, inputs: dict, blobs, label="") -> dict:
    """One extractor of `net`: every input given (numpy), every blob extracted back to numpy."""
    ex = net.create_extractor()
    for name, x in inputs.items():
        assert ex.input(name, graph.Mat(x)) == 0, (label, name)
    out = {}
    for b in blobs:
        r, m = ex.extract(b)
        assert r == 0, (label, b, r)
        out[b] = np.array(m)
    return out


def stock_bound(cpu, stock, fp16: bool) -> float:
    """`vknorm check --vulkan`'s rule for a blob of the vknorm run against the CPU run (vknorm.check.output_bound):
    twice stock ncnn Vulkan's difference there, plus the layer rule's atol at the blob's finite scale."""
    from vknorm import check

    atol = check.ATOL_FP16 if fp16 else check.ATOL_FP32
    return check.output_bound(np.asarray(cpu, np.float64), max_err(stock, cpu), atol)


def max_err(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def measure_model(graph, name: str, dims) -> list:
    param, binp = os.path.join(DATA, name + ".ncnn.param"), os.path.join(DATA, name + ".ncnn.bin")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(dims).astype(np.float32)  # models.json: numpy order, batch dropped
    inputs = {"in0": x}
    norms = norm_layers(param)
    outputs = output_blobs(param)
    blobs = list(dict.fromkeys([b for n in norms for b in (n[2], n[3])] + outputs))
    cpu, _ = run_net(graph, param, binp, inputs, blobs, vknorm=False, vulkan=False)
    results = []
    for fp16 in (False, True):
        for packing in (True, False):
            stock, _ = run_net(graph, param, binp, inputs, blobs, False, True, fp16, packing)
            vk, info = run_net(graph, param, binp, inputs, blobs, True, True, fp16, packing)
            by_name = {l["name"]: l for l in info["layers"]}
            layers = []
            for lname, ltype, bottom, top in norms:
                l = by_name[lname]
                # The input the layer saw: float16 storage rounds it on upload when a CPU layer made it.
                xin = vk[bottom].astype(np.float16).astype(np.float32) if fp16 else vk[bottom]
                ref = layer_reference64(xin, l)
                err64 = np.abs(np.asarray(vk[top], np.float64) - ref)
                # float16 storage rounds the output: half the float16 spacing at the output's value is not the kernel's.
                storage = half_fp16_spacing(vk[top]) if fp16 else 0.0
                layers.append({"name": lname, "type": ltype, "shape": list(xin.shape),
                               "vknorm_vs_cpu": max_err(vk[top], cpu[top]),
                               "stock_vs_cpu": max_err(stock[top], cpu[top]),
                               "bound": stock_bound(cpu[top], stock[top], fp16),
                               "vknorm_vs_f64": float(err64.max()),
                               "vknorm_excess_f64": float(np.max(err64 - storage)),
                               "ref_max": float(np.abs(ref).max()),
                               "vulkan_forwards": l["vulkan_forwards"], "cpu_forwards": l["cpu_forwards"],
                               "variants": l["variants"]})
            results.append({"model": name, "fp16": fp16, "packing": packing, "layers": layers,
                            "outputs": [{"name": o, "vknorm_vs_cpu": max_err(vk[o], cpu[o]),
                                         "stock_vs_cpu": max_err(stock[o], cpu[o]),
                                         "bound": stock_bound(cpu[o], stock[o], fp16),
                                         "vknorm_vs_stock": max_err(vk[o], stock[o])} for o in outputs],
                            "counters": info["counters"]})
    return results


def large_offset_case(graph, tmp: str) -> list:
    """Norms fed 1e4 + N(0, 1e-2) (|mean| >> std) through ncnn's graph, fp32, packing on/off: vknorm's error
    against float64 and stock ncnn Vulkan's, on the same blob. A LayerNorm over rows of 768, and a
    GroupNorm of 320 channels in 32 groups (groups straddle pack4 elements)."""
    rng = np.random.default_rng(1)
    cases = []
    w, h = 768, 8
    gamma = (1 + 0.1 * rng.standard_normal(w)).astype(np.float32)
    beta = (0.1 * rng.standard_normal(w)).astype(np.float32)
    x = (1e4 + 1e-2 * rng.standard_normal((h, w))).astype(np.float32)
    cases.append(("LayerNorm", f"LayerNorm ln 1 1 in0 out0 0={w} 1=1.000000e-05 2=1", gamma, beta, x,
                  reference64(x, "LayerNorm", 1e-5, w, gamma, beta)))
    c = 320
    gamma = (1 + 0.1 * rng.standard_normal(c)).astype(np.float32)
    beta = (0.1 * rng.standard_normal(c)).astype(np.float32)
    x = (1e4 + 1e-2 * rng.standard_normal((c, 4, 4))).astype(np.float32)
    cases.append(("GroupNorm", f"GroupNorm gn 1 1 in0 out0 0=32 1={c} 2=1.000000e-05 3=1", gamma, beta, x,
                  channel_norm64("GroupNorm", x, 1e-5, 32, gamma, beta)))
    out = []
    for ltype, line, gamma, beta, x, ref in cases:
        param = os.path.join(tmp, f"offset_{ltype}.param")
        with open(param, "w") as f:
            f.write(f"7767517\n2 2\nInput in0 0 1 in0\n{line}\n")
        binp = os.path.join(tmp, f"offset_{ltype}.bin")
        with open(binp, "wb") as f:
            f.write(gamma.tobytes() + beta.tobytes())
        for packing in (True, False):
            vk, info = run_net(graph, param, binp, {"in0": x}, ["out0"], True, True, False, packing)
            stock, _ = run_net(graph, param, binp, {"in0": x}, ["out0"], False, True, False, packing)
            out.append({"type": ltype, "packing": packing, "vknorm_vs_f64": max_err(vk["out0"], ref),
                        "stock_vs_f64": max_err(stock["out0"], ref), "counters": info["counters"],
                        "scale": max(1.0, float(np.abs(ref).max()))})
    return out


def main(path: str) -> None:
    from vknorm import graph

    result = {"device": graph.gpu_name(), "models": [], "large_offset": None}
    for name, dims in models().items():
        result["models"] += measure_model(graph, name, dims)
    with tempfile.TemporaryDirectory() as tmp:
        result["large_offset"] = large_offset_case(graph, tmp)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])

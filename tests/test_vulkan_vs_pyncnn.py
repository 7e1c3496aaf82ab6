"""vknorm on Vulkan vs pyncnn's own LayerNorm/RMSNorm — on ncnn's Vulkan path
(lavapipe) and on its CPU path, fp32 and fp16 — for every ncnn test case and a few model-sized blobs.

ncnn is an independent implementation with its own (different) summation orders, so the comparison
tolerance is looser than the float64 one:
  fp32:          max abs error <= 1e-4 * max(1, max|y_ncnn|)
  fp16 storage:  max abs error <= 1e-2 * max(1, max|y_ncnn|)   (both sides round input and output to fp16;
                 ncnn's Vulkan fp16 path also rounds gamma/beta to fp16)
The fp16 comparison with ncnn's CPU path feeds it the fp16-rounded input (x86 ncnn has no fp16 storage
for these layers). ncnn runs RMSNORM_GPU_SKIPPED_CASES with TEST_LAYER_DISABLE_GPU_TESTING, so those are
compared with ncnn's CPU path only.
"""
from __future__ import annotations

import numpy as np
import pytest

import ncnn_cases
import vknorm
from pyncnn_layer import run_ncnn_layer, vulkan_available
from reference import PATHS, all_cases, case_data, case_name, make_layer, max_abs_err, scale

NCNN_FP32_TOL = 1e-4
NCNN_FP16_TOL = 1e-2
CASES = all_cases()


def gpu_skipped(op, case) -> bool:
    return op == "RMSNorm" and case in ncnn_cases.RMSNORM_GPU_SKIPPED_CASES


@pytest.fixture(scope="module")
def ncnn_results():
    """ncnn's outputs for every case, computed once: CPU fp32, CPU on fp16-rounded input, Vulkan fp32/fp16."""
    if not vulkan_available():
        pytest.fail("pyncnn sees no Vulkan device (lavapipe expected)")
    out = []
    for seed, (op, case) in enumerate(CASES):
        x, gamma, beta = case_data(op, case, seed)
        args = (case["affine_size"], case["eps"], case["affine"], gamma, beta)
        x16 = x.astype(np.float16)
        r = {
            "op": op, "case": case, "x": x, "x16": x16, "args": args,
            "layer": make_layer(op, *args),
            "cpu32": run_ncnn_layer(op, x, *args, vulkan=False),
            "cpu16": run_ncnn_layer(op, x16.astype(np.float32), *args, vulkan=False),
        }
        if not gpu_skipped(op, case):
            r["vk32"] = run_ncnn_layer(op, x, *args, vulkan=True, fp16=False)
            r["vk16"] = run_ncnn_layer(op, x, *args, vulkan=True, fp16=True)
        out.append(r)
    return out


def compare(results, key: str, fp16: bool, tol: float):
    failures = []
    compared = 0
    for r in results:
        if key not in r:
            continue
        theirs = r[key]
        for path in PATHS:
            for packing in (False, True):
                opt = vknorm.Option(use_fp16_storage=fp16, use_packing_layout=packing, path=path)
                ours = r["layer"](r["x16"] if fp16 else r["x"], device="vulkan", option=opt)
                err, bound = max_abs_err(ours, theirs), tol * scale(theirs)
                compared += 1
                if not err <= bound:
                    failures.append(f"{case_name(r['op'], r['case'])} path={path} packing={packing}: "
                                    f"{err:.3e} > {bound:.3e}")
    assert compared > 0
    assert not failures, f"vs ncnn {key}: {len(failures)} failure(s)\n" + "\n".join(failures[:40])


def test_fp32_matches_ncnn_vulkan_layer(ncnn_results):
    compare(ncnn_results, "vk32", fp16=False, tol=NCNN_FP32_TOL)


def test_fp16_storage_matches_ncnn_vulkan_layer_with_fp16_storage(ncnn_results):
    compare(ncnn_results, "vk16", fp16=True, tol=NCNN_FP16_TOL)


def test_fp32_matches_ncnn_cpu_layer(ncnn_results):
    compare(ncnn_results, "cpu32", fp16=False, tol=NCNN_FP32_TOL)


def test_fp16_storage_matches_ncnn_cpu_layer_on_the_fp16_rounded_input(ncnn_results):
    compare(ncnn_results, "cpu16", fp16=True, tol=NCNN_FP16_TOL)


MODEL_BLOBS = [
    ("LayerNorm", (197, 768), 768), ("RMSNorm", (32, 4096), 4096), ("LayerNorm", (16, 56, 56), 56),
    ("LayerNorm", (64, 7, 7), 49), ("RMSNorm", (4, 2, 3, 64), 64), ("LayerNorm", (4, 2, 8, 33), 264),
]


@pytest.mark.parametrize("op,shape,affine_size", MODEL_BLOBS, ids=[f"{o}-{'x'.join(map(str, s))}" for o, s, _ in MODEL_BLOBS])
def test_model_sized_blobs_match_ncnn_vulkan_and_cpu(op, shape, affine_size):
    rng = np.random.default_rng(affine_size)
    x = (rng.standard_normal(shape) * 1.5 + 0.7).astype(np.float32)
    gamma = (1 + 0.2 * rng.standard_normal(affine_size)).astype(np.float32)
    beta = (0.2 * rng.standard_normal(affine_size)).astype(np.float32)
    layer = make_layer(op, affine_size, 1e-5, True, gamma, beta)
    args = (affine_size, 1e-5, 1, gamma, beta)
    failures = []
    for fp16, tol in ((False, NCNN_FP32_TOL), (True, NCNN_FP16_TOL)):
        xin = x.astype(np.float16) if fp16 else x
        refs = {
            "ncnn vulkan": run_ncnn_layer(op, x, *args, vulkan=True, fp16=fp16),
            "ncnn cpu": run_ncnn_layer(op, xin.astype(np.float32), *args, vulkan=False),
        }
        for packing in (False, True):
            ours = layer(xin, device="vulkan", option=vknorm.Option(use_fp16_storage=fp16, use_packing_layout=packing))
            for name, theirs in refs.items():
                err, bound = max_abs_err(ours, theirs), tol * scale(theirs)
                if not err <= bound:
                    failures.append(f"fp16={fp16} packing={packing} vs {name}: {err:.3e} > {bound:.3e}")
    assert not failures, "\n".join(failures)

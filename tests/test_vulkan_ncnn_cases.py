"""Every case of ncnn's tests/test_layernorm.cpp and test_rmsnorm.cpp (plus the dims-4
LayerNorm mirror) x {fp32, fp16 storage} x {packing off, on} x every path {auto, subgroup, workgroup,
split}, on lavapipe, against the CPU reference and float64 numpy.

Tolerances: fp32 storage: max abs error <= 1e-5 * max(1, max|y|); fp16 storage, against float64 computed from
the fp16-rounded input (the input is fed as float16): what the output's own rounding to float16 cannot explain
<= 1e-5 * max(1, max|y|) (reference.storage_rule); against the CPU reference (ncnn's float32 algorithm, its
output rounded to float16 there): what that algorithm's own a-priori float32 error and, in float16, both outputs'
rounding cannot explain <= 1e-5 * max(1, max|y|) (reference.ncnn_rule).
One test function per (storage, path) loops over all cases and packings and names every failing one.
"""
from __future__ import annotations

import numpy as np
import pytest

import vknorm
from availability import missing
from reference import (PATHS, all_cases, case_data, case_name, check_dispatch, group_size,
                       make_layer, ncnn_float32_error, ncnn_rule, norm64, storage_rule)

CASES = all_cases()


@pytest.fixture(scope="module")
def prepared():
    """Per case: layer (reused by every test), inputs and the references, computed once."""
    out = []
    for seed, (op, case) in enumerate(CASES):
        x, gamma, beta = case_data(op, case, seed)
        layer = make_layer(op, case["affine_size"], case["eps"], case["affine"], gamma, beta)
        x16 = x.astype(np.float16)
        args = (case["affine_size"], case["eps"], case["affine"], gamma, beta)
        out.append({
            "op": op, "case": case, "layer": layer, "x": x, "x16": x16,
            "ref32": norm64(op, x, *args), "ref16": norm64(op, x16, *args),
            "cpu32": layer(x, device="cpu"), "cpu16": layer(x16, device="cpu"),
            # what ncnn's float32 algorithm (the CPU reference) may be off float64 by, per element
            "cpu_err32": ncnn_float32_error(op, x, *args), "cpu_err16": ncnn_float32_error(op, x16, *args),
            "group_size": group_size(x.shape, case["affine_size"]),
        })
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("storage", ["fp32", "fp16"])
def test_every_ncnn_case_matches_cpu_reference_and_float64(prepared, storage, path, vulkan_device):
    fp16 = storage == "fp16"
    failures = []
    for p in prepared:
        for packing in (False, True):
            opt = vknorm.Option(use_fp16_storage=fp16, use_packing_layout=packing, path=path)
            x = p["x16"] if fp16 else p["x"]
            y = p["layer"](x, device="vulkan", option=opt)
            what = f"{case_name(p['op'], p['case'])} {storage} packing={packing} path={path}"
            if y.dtype != x.dtype or y.shape == () or y.shape != x.shape:
                failures.append(f"{what}: returned {y.dtype}{y.shape} for {x.dtype}{x.shape}")
                continue
            # float64 of the input the kernel read by the storage's rule (float16: past the output's rounding);
            # ncnn's algorithm (the CPU reference) by ncnn's rule: past its own float32 error and, in float16, both
            # outputs' rounding
            err, bound = storage_rule(y, p["ref16" if fp16 else "ref32"], fp16)
            if not err <= bound:
                failures.append(f"{what}: vs float64 error {err:.3e} > {bound:.3e} (the storage rule)")
            ref = p["cpu16" if fp16 else "cpu32"]
            err, bound = ncnn_rule(y, ref, p["cpu_err16" if fp16 else "cpu_err32"], ours_fp16=fp16, theirs_fp16=fp16)
            if not err <= bound:
                failures.append(f"{what}: vs CPU reference {err:.3e} past ncnn's rule > {bound:.3e}")
            problem = check_dispatch(p["layer"].last_dispatch, path, p["group_size"], vulkan_device)
            if problem:
                failures.append(f"{what}: {problem}")
    assert not failures, f"{len(failures)} failure(s):\n" + "\n".join(failures[:40])


def test_fp16_storage_with_float32_input_rounds_the_input_and_returns_float32(prepared, vulkan_device):
    """fp16 storage fed float32: the device holds the fp16-rounded input, the result comes back as float32."""
    if not vulkan_device["storage_16bit"]:
        missing("device has no 16-bit storage (lavapipe has)")
    failures = []
    for p in prepared[::7]:
        for packing in (False, True):
            opt = vknorm.Option(use_fp16_storage=True, use_packing_layout=packing)
            y = p["layer"](p["x"], device="vulkan", option=opt)
            assert y.dtype == np.float32
            err, bound = storage_rule(y, p["ref16"], True)
            if not err <= bound:
                failures.append(f"{case_name(p['op'], p['case'])} packing={packing}: {err:.3e} > {bound:.3e}")
            # the values are fp16 values (the device stored them as float16)
            np.testing.assert_array_equal(y, y.astype(np.float16).astype(np.float32))
    assert not failures, "\n".join(failures)


def test_a_layer_gives_identical_results_call_after_call_in_every_storage_and_packing(prepared):
    """One layer, three rounds of calls in both storages and packings: each call's output is bit-identical to
    the same option's first (nothing a call leaves behind, pipelines or scratch, changes the next one)."""
    p = next(q for q in prepared if q["op"] == "LayerNorm" and q["case"]["affine"] and q["x"].ndim == 3)
    first = {}
    for _ in range(3):
        for fp16 in (False, True):
            for packing in (False, True):
                opt = vknorm.Option(use_fp16_storage=fp16, use_packing_layout=packing)
                y = p["layer"](p["x16"] if fp16 else p["x"], device="vulkan", option=opt)
                key = (fp16, packing)
                if key in first:
                    np.testing.assert_array_equal(y, first[key])
                first[key] = y

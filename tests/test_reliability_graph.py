"""Reliability of the in-graph path: vknorm's layers inside ncnn's Vulkan graph (vknorm.graph) under a long
run, Net reload cycles, threads, and device memory running out.

The scenarios live in tests/reliability_graph.py (tools/reliability_report.py runs the same ones at full
size for docs/reliability.md); each runs in a process of its own with the Khronos validation layer loaded
into ncnn's Vulkan instance (its log must stay empty, teardown included). The sizes here are CI budgets.
ncnn's device memory is read through vknorm.graph.track_device_memory() (every VkDeviceMemory ncnn
allocates or frees), and set_device_memory_limit() makes ncnn's allocations past a limit fail as on a
full device.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import reliability_graph as G
from availability import needs_graph

pytestmark = [needs_graph, pytest.mark.timeout(600)]


def clean(r: dict) -> dict:
    """The child ran to the end and the validation layer logged nothing (ncnn's teardown included)."""
    assert r["returncode"] == 0 and not r.get("failed"), f"exit {r['returncode']}\n{r['stderr_tail']}"
    assert not r["validation_log_missing"], "the validation layer wrote no log: not loaded into the child's instance"
    assert r["validation_lines"] == 0, "\n".join(r["validation_messages"])
    return r


# ============================================================================ lifetime

@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_inferences_keep_device_memory_and_rss_flat_and_outputs_identical(fp16):
    """600 inferences of the transformer block as a user runs them (a new extractor each): after warm-up
    the device memory ncnn holds never moves (not one inference off it, the peak equal to it), every output
    is bit-identical to the first one for its input, every vknorm forward ran on the GPU, and the
    validation layer stays silent. RSS is measured in a second run without the validation layer (whose
    own bookkeeping grows with every submission, stock ncnn's as much as vknorm's): within 1 %, or within
    half a point of stock ncnn's own growth in the same run where the driver's grows more (NVIDIA's: 1.4 %
    over these 600 inferences)."""
    r = clean(G.run_scenario("lifetime", {"n": 600, "warmup": 100, "fp16": fp16}))
    assert r["errors"] == 0 and r["mismatches"] == 0, r
    assert r["steady_bytes"] > 0 and r["drift_inferences"] == 0, r
    assert (r["end_bytes"], r["end_blocks"]) == (r["steady_bytes"], r["steady_blocks"]), r
    assert r["peak_after_warmup"] == r["steady_bytes"], r
    assert r["after_clear_bytes"] < r["steady_bytes"], r  # the net's weights went with it
    assert r["vulkan_forwards"] == 600 * r["norm_layers"] and r["cpu_forwards"] == 0, r
    alone = G.run_scenario("lifetime", {"n": 600, "warmup": 100, "fp16": fp16}, validation=False)
    assert alone["returncode"] == 0 and alone["mismatches"] == 0 and alone["drift_inferences"] == 0, alone
    if alone["rss_growth"] > 0.01:
        stock = G.run_scenario("lifetime", {"n": 600, "warmup": 100, "fp16": fp16, "vknorm": False}, validation=False)
        assert stock["returncode"] == 0, stock
        assert alone["rss_growth"] <= stock["rss_growth"] + 0.005, (alone, stock)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_net_load_clear_cycles_do_not_grow_and_tear_down_clean(fp16):
    """15 cycles of load -> inference -> clear: ncnn's device memory after each cycle is the same once warm,
    outputs are identical every cycle, and after ncnn's instance is destroyed nothing it allocated is
    left and the validation layer reported no leak."""
    r = clean(G.run_scenario("reload_cycles", {"cycles": 15, "warmup": 3, "fp16": fp16}))
    assert r["errors"] == 0 and r["mismatches"] == 0, r
    assert r["cycles_off_steady"] == 0 and r["bytes_end"] == r["bytes_after_warmup"], r
    assert r["rss_growth"] <= 0.05, r
    assert (r["bytes_after_instance_destroyed"], r["blocks_after_instance_destroyed"]) == (0, 0), r


# ============================================================================ concurrency

@pytest.mark.parametrize("model,fp16,nets", [
    ("transformer_block", False, "one"), ("transformer_block", True, "one"),
    ("transformer_block", False, "many"), ("sd_resblock", True, "many"), ("sd_resblock", False, "one"),
], ids=lambda v: str(v))
def test_8_threads_give_the_sequential_outputs_bit_for_bit(model, fp16, nets):
    """8 threads at once on fresh nets, input shapes varying, so the layers plan formats and make pipelines
    under the load: every output equals the same inference run alone, the nets end with exactly the
    sequential run's pipelines (the per-format plan cache made no duplicate and lost none), and the
    validation layer's thread-safety checks stay silent."""
    r = clean(G.run_scenario("threads", {"model": model, "fp16": fp16, "nets": nets, "per_thread": 3}))
    assert r["errors"] == [] and r["hung_threads"] == 0 and r["serial_errors"] == 0, r
    assert r["inferences"] == 24 and r["failed"] == 0 and r["mismatches"] == 0, r
    assert r["pipelines_like_serial"] and r["pipelines"] > 0, r
    assert r["cpu_forwards"] == 0 and r["vulkan_forwards"] > 0, r


# ============================================================================ faults

@pytest.mark.parametrize("model,big,fp16,step_mib", [
    ("transformer_block", [1024, 64], False, 4),
    ("transformer_block", [2048, 64], True, 2),
    ("split_layernorm", [256, 40000], False, 4),  # vknorm's split path: its scratch comes from ncnn's allocator
], ids=["transformer_block", "transformer_block_fp16", "split_layernorm"])
def test_device_memory_running_out_is_an_error_code_and_the_next_inference_runs(model, big, fp16, step_mib):
    """ncnn's device memory limited to what the net holds after one inference, then step_mib MiB more at
    each step: the large input fails with ncnn's -100 (never a crash: vknorm.graph reserves the input's
    upload, where ncnn would drop a failed allocation and crash) until it fits, and then gives the output
    it gives without a limit; the inference at the model's own size after each failure runs, bit-identical
    to its output before any limit."""
    r = clean(G.run_scenario("faults", {"model": model, "big": big, "fp16": fp16, "step_mib": step_mib}))
    assert r["first_ret"] == 0 and r["big_failed"] >= 1 and r["refused_allocations"] >= 1, r
    assert r["error_codes"] == [-100], r
    assert r["normal_ok"] == r["limits"], r["outcomes"]
    assert r["big_fitted"] and r["after_limit_lifted_ok"], r
    assert r["cpu_forwards"] == 0, r


def test_device_memory_limit_needs_tracking_and_a_byte_count():
    from vknorm import graph

    with pytest.raises(ValueError, match="byte count"):
        graph.set_device_memory_limit(-1)
    with pytest.raises(ValueError, match="byte count"):
        graph.set_device_memory_limit(1.5)
    assert set(graph.device_memory()) == {"tracking", "bytes", "blocks", "peak_bytes", "allocations", "refused", "limit"}
    assert np.isscalar(graph.device_memory()["bytes"])


def test_a_device_memory_limit_before_tracking_raises_and_sets_nothing():
    """Without track_device_memory() no allocation is counted, so a limit could never be enforced: setting one is
    a RuntimeError saying what to call first, and the limit stays 0 (in a fresh process: tracking, once started,
    stays on)."""
    code = ("from vknorm import graph\n"
            "try:\n    graph.set_device_memory_limit(1 << 20)\nexcept RuntimeError as e:\n    print('refused:', e)\n"
            "m = graph.device_memory()\nprint('tracking', m['tracking'], 'limit', m['limit'])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused: set_device_memory_limit: call track_device_memory() first" in proc.stdout, proc.stdout
    assert "tracking False limit 0" in proc.stdout, proc.stdout

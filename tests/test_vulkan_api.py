"""The Python API: device="vulkan" by default, ncnn-style Option per layer or per call, forced paths
reported by last_dispatch, VKNORM_PATH, device tensors (VkMat) chaining layers without a host round
trip or normalized into new VkMats, weights reloaded, no device-memory growth, timestamps.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

import vknorm
from reference import (FP16_TOL, FP32_TOL, PATH_RANK, PATHS, channel_norm64, check_dispatch, half_fp16_spacing,
                       make_layer, max_abs_err, norm64, scale, storage_rule)


def ln_layer(size, rng, affine=True, eps=1e-5):
    gamma = rng.uniform(0.5, 1.5, size).astype(np.float32)
    beta = rng.uniform(-1, 1, size).astype(np.float32)
    return make_layer("LayerNorm", size, eps, affine, gamma, beta), gamma, beta


def rms_layer(size, rng, eps=1e-5):
    gamma = rng.uniform(0.5, 1.5, size).astype(np.float32)
    return make_layer("RMSNorm", size, eps, True, gamma), gamma


# ------------------------------------------------------------------------------ device and options

def test_vulkan_is_the_default_device_when_one_exists():
    rng = np.random.default_rng(0)
    layer, gamma, beta = ln_layer(16, rng)
    assert layer.last_dispatch.get("dispatches", 0) == 0  # nothing ran yet
    x = rng.standard_normal((4, 16)).astype(np.float32)
    y = layer(x)
    assert layer.last_dispatch["dispatches"] >= 1, "the default call did not run on Vulkan"
    ref = norm64("LayerNorm", x, 16, 1e-5, True, gamma, beta)
    assert max_abs_err(y, ref) <= FP32_TOL * scale(ref)


def test_device_can_be_named_by_string_index_or_context():
    rng = np.random.default_rng(1)
    layer, _, _ = ln_layer(8, rng)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    want = layer(x, device="vulkan")
    index = vknorm.device_info()["index"]
    for device in (f"vulkan:{index}", index, vknorm.Context.default()):
        np.testing.assert_array_equal(layer(x, device=device), want)


def test_a_device_index_names_one_context_shared_by_every_call_with_it():
    """device=N and "vulkan:N" make that device's context once: tensors and layers named by the same index
    work together (each call made a context of its own: 45x slower, and a VkMat of device=0 was refused by a
    layer of device=0 as living on another device)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    index = vknorm.device_info()["index"]
    a, b = vknorm.to_device(x, device=index), vknorm.to_device(x, device=f"vulkan:{index}")
    assert a.context is b.context
    # the default device named by its index is the default context: tensors made without a device work too
    assert a.context is vknorm.to_device(x).context
    layer = vknorm.LayerNorm(16, 1e-5, affine=False, device=index)
    want = layer(x)
    layer.forward_inplace(a)
    np.testing.assert_array_equal(a.download().cast_fp32().numpy().reshape(x.shape), want)
    y = layer.forward_add(b, vknorm.to_device(np.zeros_like(x), device=index))
    np.testing.assert_array_equal(y.download().cast_fp32().numpy().reshape(x.shape), want)


@pytest.mark.parametrize("bad", [0, {}, "", [], False, 1, {"use_fp16_storage": True}])
def test_an_option_that_is_not_an_option_is_refused_even_when_falsy(bad):
    layer = vknorm.LayerNorm(4, affine=False)
    x = np.ones((2, 4), np.float32)
    with pytest.raises(TypeError, match="option must be a vknorm.Option"):
        layer(x, option=bad)
    with pytest.raises(TypeError, match="option must be a vknorm.Option"):
        vknorm.LayerNorm(4, affine=False, option=bad)


def test_option_given_to_the_layer_is_used_and_a_per_call_option_overrides_it(vulkan_device):
    rng = np.random.default_rng(2)
    gamma = rng.uniform(0.5, 1.5, 6).astype(np.float32)
    beta = rng.uniform(-1, 1, 6).astype(np.float32)
    layer = vknorm.LayerNorm(affine_size=6, eps=1e-5, option=vknorm.Option(path="split", use_fp16_storage=True))
    layer.load_model(gamma, beta)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    y = layer(x, device="vulkan")
    assert layer.last_dispatch["path"] == "split"
    fp16 = bool(vulkan_device["storage_16bit"])
    if fp16:  # fp16 storage from the layer's Option
        np.testing.assert_array_equal(y, y.astype(np.float16).astype(np.float32))
    y2 = layer(x, device="vulkan", option=vknorm.Option(path="subgroup"))
    assert layer.last_dispatch["path"] == "subgroup"
    ref = norm64("LayerNorm", x, 6, 1e-5, True, gamma, beta)
    assert max_abs_err(y2, ref) <= FP32_TOL * scale(ref)
    # float64 of the input as stored (float16 storage rounds it first), by the storage rule
    err, bound = storage_rule(y, norm64("LayerNorm", x.astype(np.float16) if fp16 else x, 6, 1e-5, True, gamma, beta),
                              fp16)
    assert err <= bound, (err, bound)


@pytest.mark.parametrize("size", [1, 3, 8, 37, 64, 200, 1000, 5000])
def test_last_dispatch_shows_the_forced_path_or_the_next_larger_one(size, vulkan_device):
    rng = np.random.default_rng(size)
    layer, gamma, beta = ln_layer(size, rng)
    x = rng.standard_normal((8, size)).astype(np.float32)
    ref = norm64("LayerNorm", x, size, 1e-5, True, gamma, beta)
    failures = []
    taken = {}
    for packing in (False, True):
        for path in PATHS:
            y = layer(x, device="vulkan", option=vknorm.Option(path=path, use_packing_layout=packing))
            info = layer.last_dispatch
            taken[(path, packing)] = info["path"]
            problem = check_dispatch(info, path, size, vulkan_device)
            if problem:
                failures.append(f"packing={packing} path={path}: {problem} ({info})")
            if not max_abs_err(y, ref) <= FP32_TOL * scale(ref):
                failures.append(f"packing={packing} path={path}: wrong result")
            assert info["workgroup_size"] >= 1 and info["workgroup_size"] <= vulkan_device["max_workgroup_invocations"]
        # Forcing a smaller kernel never lands on a larger one than forcing a larger kernel does.
        ranks = [PATH_RANK[taken[(p, packing)]] for p in ("subgroup", "workgroup", "split")]
        if ranks != sorted(ranks):
            failures.append(f"packing={packing}: forced subgroup/workgroup/split ran {taken}")
    assert not failures, "\n".join(failures)


def test_vknorm_path_env_forces_the_auto_path(monkeypatch):
    rng = np.random.default_rng(3)
    layer, gamma, beta = ln_layer(12, rng)
    x = rng.standard_normal((4, 12)).astype(np.float32)
    ref = norm64("LayerNorm", x, 12, 1e-5, True, gamma, beta)
    for forced in ("split", "workgroup", "subgroup"):
        monkeypatch.setenv("VKNORM_PATH", forced)
        y = layer(x, device="vulkan", option=vknorm.Option(path="auto"))
        assert layer.last_dispatch["path"] == forced
        assert max_abs_err(y, ref) <= FP32_TOL * scale(ref)
    monkeypatch.setenv("VKNORM_PATH", "split")
    layer(x, device="vulkan", option=vknorm.Option(path="subgroup"))
    assert layer.last_dispatch["path"] == "subgroup", "an explicit Option.path wins over VKNORM_PATH"


def test_bad_vknorm_path_env_is_a_clear_error(monkeypatch):
    rng = np.random.default_rng(4)
    layer, _, _ = ln_layer(4, rng)
    monkeypatch.setenv("VKNORM_PATH", "warp-speed")
    with pytest.raises(ValueError, match="warp-speed"):
        layer(np.ones((2, 4), np.float32), device="vulkan")


@pytest.mark.parametrize("size", [3, 768, 5000])
def test_shared_memory_reductions_and_small_workgroup_caps_stay_exact(size):
    rng = np.random.default_rng(5)
    layer, gamma, beta = ln_layer(size, rng)
    rms, rgamma = rms_layer(size, rng)
    x = (rng.standard_normal((8, size)) + 2).astype(np.float32)
    refs = [(layer, norm64("LayerNorm", x, size, 1e-5, True, gamma, beta)),
            (rms, norm64("RMSNorm", x, size, 1e-5, True, rgamma))]
    failures = []
    for cap in (0, 1, 8, 32):
        for subgroup_ops in (True, False):
            for path in PATHS:
                opt = vknorm.Option(path=path, use_subgroup_ops=subgroup_ops, max_workgroup_size=cap)
                for lyr, ref in refs:
                    y = lyr(x, device="vulkan", option=opt)
                    info = lyr.last_dispatch
                    what = f"{lyr!r} cap={cap} subgroup_ops={subgroup_ops} path={path} ran {info['path']}"
                    if not max_abs_err(y, ref) <= FP32_TOL * scale(ref):
                        failures.append(f"{what}: {max_abs_err(y, ref):.3e}")
                    if not subgroup_ops and info["subgroup"]:
                        failures.append(f"{what}: used subgroup reductions although use_subgroup_ops=False")
                    if cap and info["workgroup_size"] > cap:
                        failures.append(f"{what}: workgroup of {info['workgroup_size']} > cap {cap}")
    assert not failures, "\n".join(failures[:30])


# ------------------------------------------------------------------------------ device tensors

@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape,packs", [((8, 6, 5), True), ((6, 6, 5), False), ((8, 768), True), ((3, 10), False),
                                         ((4, 2, 3, 5), True), ((33,), False)], ids=str)
def test_to_device_uses_the_options_storage_and_packing(shape, packs, fp16):
    x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    for packing in (False, True):
        vk = vknorm.to_device(x, vknorm.Option(use_fp16_storage=fp16, use_packing_layout=packing))
        pack = 4 if (packing and packs) else 1
        assert vk.elempack == pack and vk.elemsize == (2 if fp16 else 4) * pack
        assert vk.dims == len(shape)
        if len(shape) >= 3:
            plane = int(np.prod(shape[1:]))
            assert vk.c == shape[0] // pack
            assert vk.cstep == (plane * vk.elemsize + 15) // 16 * 16 // vk.elemsize
        m = vk.download()
        assert (m.elempack, m.elemsize) == (vk.elempack, vk.elemsize)
        want = x.astype(np.float16) if fp16 else x
        np.testing.assert_array_equal(m.numpy(), want)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("packing", [False, True], ids=["pack1", "pack4"])
@pytest.mark.parametrize("shape,affine_size", [((8, 768), 768), ((8, 6, 5), 5), ((4, 6, 5), 30), ((4, 2, 3, 5), 15),
                                               ((12, 5000), 5000), ((9,), 9)], ids=str)
def test_vkmat_chain_of_two_layers_equals_two_host_forwards(shape, affine_size, packing, fp16):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    ln, _, _ = ln_layer(affine_size, rng)
    rms, _ = rms_layer(affine_size, rng)
    opt = vknorm.Option(use_fp16_storage=fp16, use_packing_layout=packing)
    xin = x.astype(np.float16) if fp16 else x
    host = rms(ln(xin, device="vulkan", option=opt), device="vulkan", option=opt)

    vk = vknorm.to_device(xin, opt)
    assert ln.forward_inplace(vk, option=opt) is vk
    assert ln.last_dispatch["dispatches"] >= 1
    assert rms.forward_inplace(vk, option=opt) is vk
    chained = vk.download().numpy()
    assert chained.dtype == host.dtype and chained.shape == host.shape
    np.testing.assert_array_equal(chained, host)


def test_vkmat_forward_uses_the_layers_default_option_storage_from_the_vkmat():
    """A VkMat carries its storage: an fp16 VkMat stays fp16 through a layer."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((8, 40)).astype(np.float32)
    ln, gamma, beta = ln_layer(40, rng)
    vk = vknorm.to_device(x, vknorm.Option(use_fp16_storage=True))
    ln.forward_inplace(vk)
    out = vk.download()
    assert out.elemsize == 2 * out.elempack
    ref = norm64("LayerNorm", x.astype(np.float16), 40, 1e-5, True, gamma, beta)  # of the input as stored
    err, bound = storage_rule(out.numpy(), ref, True)
    assert err <= bound, (err, bound)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", ["layernorm", "groupnorm_groups_inside_pack4", "layernorm_in_pieces"])
def test_a_layer_called_on_a_vkmat_gives_a_new_vkmat_and_leaves_the_input_as_it_was(case, fp16, monkeypatch):
    """layer(v) / layer.forward(v), as ncnn's Layer::forward: v is only read, the result is a new VkMat on v's
    device with forward_inplace's very bits; in pieces too (a blob larger than one storage buffer)."""
    rng = np.random.default_rng(11)
    opt = vknorm.Option(use_fp16_storage=fp16)
    if case == "groupnorm_groups_inside_pack4":  # 320 channels in 32 groups: groups of 10 straddle packed planes
        x = (rng.standard_normal((320, 6, 5)) * 2 + 3).astype(np.float32)
        layer = vknorm.GroupNorm(group=32, channels=320, eps=1e-5)
        gamma, beta = rng.uniform(0.5, 1.5, 320).astype(np.float32), rng.uniform(-1, 1, 320).astype(np.float32)
        layer.load_model(gamma, beta)
    else:
        x = (rng.standard_normal((40, 64)) * 2 + 3).astype(np.float32)
        layer, gamma, beta = ln_layer(64, rng)
        if case == "layernorm_in_pieces":
            monkeypatch.setenv("VKNORM_MAX_BUFFER_BYTES", "4096")
    xin = x.astype(np.float16) if fp16 else x
    v = vknorm.to_device(xin, opt)
    before = v.numpy()
    y = layer(v, option=opt)
    assert isinstance(y, vknorm.VkMat) and y.context is v.context
    assert (y.dims, y.w, y.h, y.c, y.elemsize, y.elempack, y.cstep) == (v.dims, v.w, v.h, v.c, v.elemsize, v.elempack,
                                                                        v.cstep)
    if case == "layernorm_in_pieces":
        assert layer.last_dispatch["pieces"] > 1, layer.last_dispatch
    np.testing.assert_array_equal(v.numpy(), before)
    inplace = vknorm.to_device(xin, opt)
    layer.forward_inplace(inplace, option=opt)
    np.testing.assert_array_equal(y.numpy(), inplace.numpy())
    np.testing.assert_array_equal(layer.forward(v, option=opt).numpy(), inplace.numpy())
    if case == "groupnorm_groups_inside_pack4":
        ref = channel_norm64("GroupNorm", xin, 1e-5, 32, gamma, beta)
    else:
        ref = norm64("LayerNorm", xin, 64, 1e-5, True, gamma, beta)
    err, bound = storage_rule(y.numpy(), ref, fp16)
    assert err <= bound, (err, bound)


# ------------------------------------------------------------------------------ lifecycle

def test_load_model_and_load_param_take_effect_on_the_next_vulkan_forward():
    rng = np.random.default_rng(9)
    layer, gamma, beta = ln_layer(24, rng)
    x = rng.standard_normal((8, 24)).astype(np.float32)
    layer(x, device="vulkan")
    gamma2, beta2 = gamma * -2, beta + 3
    layer.load_model(gamma2, beta2)
    ref = norm64("LayerNorm", x, 24, 1e-5, True, gamma2, beta2)
    assert max_abs_err(layer(x, device="vulkan"), ref) <= FP32_TOL * scale(ref)
    vk = vknorm.to_device(x)
    layer.forward_inplace(vk)
    assert max_abs_err(vk.download().numpy(), ref) <= FP32_TOL * scale(ref)
    layer.load_param({0: 24, 1: 0.5, 2: 1})
    layer.load_model(gamma2, beta2)
    ref = norm64("LayerNorm", x, 24, 0.5, True, gamma2, beta2)
    assert max_abs_err(layer(x, device="vulkan"), ref) <= FP32_TOL * scale(ref)


def test_repeated_forwards_do_not_grow_device_memory():
    rng = np.random.default_rng(10)
    ctx = vknorm.Context.default()
    layer, _, _ = ln_layer(4097, rng)
    x = rng.standard_normal((8, 4097)).astype(np.float32)
    for path in PATHS:  # warm every path once (weights, pipelines)
        layer(x, device="vulkan", option=vknorm.Option(path=path))
    gc.collect()  # earlier tests' garbage holding buffers of this context goes now, not in the middle of the count
    buffers, in_use = ctx.live_buffers, ctx.device_bytes_in_use
    for _ in range(3):
        for path in PATHS:
            layer(x, device="vulkan", option=vknorm.Option(path=path))
            vk = vknorm.to_device(x)
            layer.forward_inplace(vk, option=vknorm.Option(path=path))
            del vk
    gc.collect()
    assert (ctx.live_buffers, ctx.device_bytes_in_use) == (buffers, in_use)


def test_a_context_is_made_on_a_device_index_or_the_default_and_nothing_else():
    """Context.create(i): device i (numpy's integers too); -1 (the default) the default device; a bool (True is not
    device 1), another type, another negative index or one past any device is refused with what it got."""
    default = vknorm.device_info()["name"]
    assert vknorm.Context.create(-1).info["name"] == vknorm.Context.create().info["name"] == default
    assert vknorm.Context.create(np.int64(0)).info["name"] == vknorm.Context.create(0).info["name"]
    for bad, error in ((True, TypeError), ("0", TypeError), (0.0, TypeError), (-2, ValueError), (-2**31, ValueError),
                       (2**31, ValueError), (2**40, ValueError), (-2**40, ValueError), (2**70, ValueError)):
        with pytest.raises(error, match="index"):
            vknorm.Context.create(bad)
    with pytest.raises(ValueError, match="index"):  # a layer's device= index, made into a Context at its forward
        vknorm.LayerNorm(8, device=2**31)(np.ones((2, 8), np.float32))


def test_repeated_forwards_of_one_shape_reuse_their_buffers():
    """A buffer vknorm no longer holds stays in its context's cache for the next request of the same kind and
    size: after one round, numpy forwards, uploads, resident forwards and downloads of the same shapes, on
    every path (the split and cooperative ones with their scratch), allocate no device memory and give the
    same results as the first round."""
    rng = np.random.default_rng(12)
    ctx = vknorm.Context.create(0)
    gamma, beta = rng.uniform(0.5, 1.5, 4097).astype(np.float32), rng.uniform(-1, 1, 4097).astype(np.float32)
    layer = vknorm.LayerNorm(affine_size=4097, eps=1e-5, device=ctx)
    layer.load_model(gamma, beta)
    x = rng.standard_normal((8, 4097)).astype(np.float32)
    fp16 = vknorm.Option(use_fp16_storage=True)

    def one_round():
        out = []
        for path in PATHS:
            opt = vknorm.Option(path=path)
            out.append(layer(x, option=opt))
            vk = vknorm.to_device(x, device=ctx)
            layer.forward_inplace(vk, option=opt)
            out.append(vk.download().numpy())
        out.append(layer(x, option=fp16))
        return out

    first = one_round()
    allocations, cached = ctx.device_allocations, ctx.cached_buffers
    assert allocations > 0 and cached > 0 and ctx.device_bytes_cached > 0
    for _ in range(2):
        for a, b in zip(one_round(), first):
            np.testing.assert_array_equal(a, b)
    assert ctx.device_allocations == allocations, "a repeated shape allocated device memory"
    assert ctx.cached_buffers == cached
    ref = norm64("LayerNorm", x, 4097, 1e-5, True, gamma, beta)
    assert max_abs_err(first[0], ref) <= FP32_TOL * scale(ref)


def test_host_round_trips_of_a_large_tensor_reuse_their_host_memory():
    """Uploads, numpy forwards and downloads of an 8 MiB tensor take their host blocks (Mats, the numpy result)
    from a pool after the first call: no fresh pages are faulted in per call (glibc gives a large freed heap
    top back to the system, and each call then paid one page fault per 4 KiB, ~2000 per MiB)."""
    import resource

    rng = np.random.default_rng(13)
    ctx = vknorm.Context.create(0)
    layer = vknorm.LayerNorm(affine_size=1024, eps=1e-5, device=ctx)
    layer.load_model(np.ones(1024, np.float32), np.zeros(1024, np.float32))
    x = rng.standard_normal((2048, 1024)).astype(np.float32)  # rows divide by 4: pack4 on the device
    v = vknorm.to_device(x, device=ctx)
    calls = {"numpy forward": lambda: layer(x), "upload": lambda: vknorm.to_device(x, device=ctx),
             "download": lambda: v.download().numpy(),
             "numpy forward, float16 storage": lambda: layer(x, option=vknorm.Option(use_fp16_storage=True))}
    pages = x.nbytes // 4096
    for name, call in calls.items():
        call(), call()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(4):
            call()
        per_call = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 4
        assert per_call < pages / 8, f"{name}: {per_call:.0f} page faults a call ({pages} pages in the tensor)"
    y = layer(x)
    ref = norm64("LayerNorm", x, 1024, 1e-5, True, np.ones(1024), np.zeros(1024))
    assert max_abs_err(y, ref) <= FP32_TOL * scale(ref)
    np.testing.assert_array_equal(v.download().numpy(), x)


def test_gpu_time_comes_from_timestamp_queries(vulkan_device):
    rng = np.random.default_rng(11)
    layer, _, _ = ln_layer(768, rng)
    layer(rng.standard_normal((64, 768)).astype(np.float32), device="vulkan")
    if vulkan_device["timestamps"]:
        assert layer.last_dispatch["gpu_us"] > 0
        assert layer.gpu_time_us == layer.last_dispatch["gpu_us"]
    else:
        assert layer.last_dispatch["gpu_us"] == 0


def test_a_layer_refuses_a_shallow_copy_as_it_refuses_deepcopy_and_pickle():
    """A shallow copy would share the native layer: loading weights into the copy changed the original."""
    import copy
    import pickle

    for layer in (vknorm.LayerNorm(affine_size=4), vknorm.RMSNorm(affine_size=4), vknorm.GroupNorm(2, 4),
                  vknorm.InstanceNorm(4)):
        name = type(layer).__name__
        for clone, says in ((copy.copy, "cannot be copied"), (copy.deepcopy, "cannot be copied"),
                            (pickle.dumps, "cannot be pickled: save its params")):
            with pytest.raises(TypeError, match=f"{name} {says}.*from_param"):  # not the native class's name
                clone(layer)


def test_forward_add_on_the_cpu_gives_float16_back_for_float16_input_and_vkmats_refuse_the_cpu():
    rng = np.random.default_rng(3)
    ln = vknorm.LayerNorm(affine_size=64, eps=1e-5, affine=False)
    x, r = (rng.standard_normal((8, 64)).astype(np.float16) for _ in range(2))
    y, s = ln.forward_add(x, r, return_sum=True, device="cpu")
    y_vk, s_vk = ln.forward_add(x, r, return_sum=True, device="vulkan")
    assert y.dtype == s.dtype == y_vk.dtype == s_vk.dtype == np.float16
    assert np.array_equal(s, s_vk)
    # both float16 roundings of values within the float32 rule: a float16 spacing apart at most, past that rule
    ref = norm64("LayerNorm", s, 64, 1e-5, False)  # of the float16 sum both normalize
    apart = np.abs(y.astype(np.float64) - y_vk.astype(np.float64)) - 2 * half_fp16_spacing(ref)
    assert float(apart.max()) <= FP32_TOL * scale(ref)
    vx, vr = vknorm.to_device(x.astype(np.float32)), vknorm.to_device(r.astype(np.float32))
    with pytest.raises(ValueError, match="device='cpu'"):
        ln.forward_add(vx, vr, device="cpu")


def test_groups_reads_the_shape_alone_without_allocating_it():
    ln = vknorm.LayerNorm(affine_size=1 << 20)
    g = ln.groups((1 << 20, 1 << 20))  # 2 TiB as float16, were it allocated
    assert (g["group_size"], g["groups"]) == (1 << 20, 1 << 20)
    assert vknorm.LayerNorm(affine_size=768).groups(768)["groups"] == 1  # a dims-1 shape as an int, as numpy takes it
    with pytest.raises(TypeError, match="integers"):
        ln.groups((True, 8))
    gn = vknorm.GroupNorm(group=32, channels=320)
    assert gn.groups((320, 64, 64)) == {"group_size": 40960, "groups": 32, "planes": 10}
    with pytest.raises(ValueError, match="1..2"):
        ln.groups((0, 1 << 20))
    with pytest.raises(ValueError, match="channels"):
        gn.groups((64, 8, 8))


def test_from_numpy_and_to_device_take_read_only_arrays():
    x = np.random.default_rng(4).standard_normal((3, 5, 8)).astype(np.float32)
    frozen = x.copy()
    frozen.setflags(write=False)
    for a in (frozen, np.frombuffer(x.tobytes(), np.float32).reshape(x.shape), np.broadcast_to(x[0], x.shape)):
        assert np.array_equal(vknorm._core.Mat.from_numpy(a).numpy().reshape(a.shape), a)
        assert np.array_equal(vknorm.to_device(a).download().convert_packing(1).numpy().reshape(a.shape), a)


@pytest.mark.parametrize("storage", [{}, {"use_fp16_storage": True}, {"use_packing_layout": False}],
                         ids=["fp32", "fp16", "pack1"])
@pytest.mark.parametrize("shape,affine_size", [((7,), 7), ((12, 5), 5), ((8, 3, 5), 5), ((6, 3, 5), 15),
                                               ((4, 2, 3, 5), 15)], ids=str)
def test_a_numpy_forward_reads_its_input_where_it_lies_and_returns_a_new_array(shape, affine_size, storage):
    """layer(x) reads x in place (planes of 15 floats: dense in numpy, padded to 16 in ncnn's Mat), writes
    nothing into it, and returns an array of its own with the bits of forward_inplace on a Mat of x."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape) * 2 + 3).astype(np.float32)
    frozen = x.copy()
    frozen.setflags(write=False)
    ln, gamma, beta = ln_layer(affine_size, rng)
    opt = vknorm.Option(**storage)
    y = ln(frozen, option=opt)
    assert np.array_equal(frozen, x)
    assert y.shape == x.shape and y.dtype == np.float32 and y.flags.c_contiguous and y.flags.writeable
    assert not np.shares_memory(y, frozen)
    mat = vknorm._core.Mat.from_numpy(x)
    ln._layer.forward_inplace(mat, ln._native_option(opt))
    np.testing.assert_array_equal(y, mat.numpy().reshape(shape))
    # want saw x unrounded (float16 storage rounds it before the kernel reads it): FP16_TOL, not the storage rule
    tol = FP16_TOL if storage.get("use_fp16_storage") else FP32_TOL
    want = norm64("LayerNorm", x, affine_size, 1e-5, True, gamma, beta)
    assert max_abs_err(y, want) <= tol * scale(want)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", [(8, 3, 5), (8, 768), (4, 2, 3, 5), (33,)], ids=str)
def test_vkmat_numpy_unpacks_and_converts_as_it_downloads(shape, fp16):
    x = np.random.default_rng(12).standard_normal(shape).astype(np.float32)
    v = vknorm.to_device(x, vknorm.Option(use_fp16_storage=fp16))
    stored = x.astype(np.float16) if fp16 else x
    got = v.numpy()
    assert got.dtype == stored.dtype and got.shape == shape
    assert v.shape == shape and v.dtype == str(stored.dtype)  # what numpy() gives, known before downloading
    assert repr(v).startswith(f"VkMat(shape={shape!r}, dtype={stored.dtype}, elempack=")
    np.testing.assert_array_equal(got, stored)
    np.testing.assert_array_equal(got, v.download().convert_packing(1).numpy().reshape(shape))
    np.testing.assert_array_equal(v.numpy(np.float32), stored.astype(np.float32))
    np.testing.assert_array_equal(v.numpy("float16"), x.astype(np.float16))
    with pytest.raises(ValueError, match="float32 or float16"):
        v.numpy(np.int32)


def test_numpy_converts_a_vkmat_only_when_asked():
    # as a GPU array library does: np.asarray(v) was a 0-d object array holding the VkMat
    v = vknorm.to_device(np.ones((2, 8), np.float32))
    for convert in (np.asarray, np.array, lambda v: np.array(v, dtype=np.float32)):
        with pytest.raises(TypeError, match=r"a VkMat lives on the device: download it with v.numpy\(\)"):
            convert(v)


def test_the_copy_roof_refuses_nonsense_repetitions():
    v = vknorm.to_device(np.zeros((4, 64), np.float32))
    for warmup, reps in ((0, 0), (-5, -1), (-1, 10)):
        with pytest.raises(ValueError, match="reps >= 1"):
            vknorm._core.copy_repeated(v, warmup, reps, True)


def test_float_input_in_either_byte_order_keeps_its_precision():
    """Big-endian float16 ('>f2') is float16: it runs and comes back as float16, bit for bit as native float16 does
    (it was widened to float32 and returned as float32); big-endian float32 runs as native float32 does."""
    ln = vknorm.LayerNorm(8, 1e-5)
    ln.load_model(np.ones(8, np.float32), np.zeros(8, np.float32))
    native = np.arange(16, dtype=np.float16).reshape(2, 8)
    for device in ("cpu", "vulkan"):
        for x, like in ((native.astype(">f2"), native), (native.astype(np.float32).astype(">f4"), native.astype(np.float32))):
            y, want = ln(x, device=device), ln(like, device=device)
            assert y.dtype == like.dtype, (device, x.dtype, y.dtype)
            np.testing.assert_array_equal(y, want)


def test_readmes_operator_example_runs_as_written():
    """README's example of the layers on numpy and device tensors is code users paste: it must run unchanged."""
    import re
    from pathlib import Path
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("### The operator on numpy and device tensors", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    x = scope["x"]
    assert scope["y"].shape == x.shape and scope["s"].shape == x.shape
    np.testing.assert_allclose(scope["s"], x + x, rtol=0, atol=0)  # the add's value, as BinaryOp stores it

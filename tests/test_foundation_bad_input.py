"""Bad input: a clear Python exception, never a crash, on the CPU reference and on
Vulkan alike. (No Vulkan driver: tests/test_foundation_runtime.py, in a subprocess.)"""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import vknorm
from availability import import_or_missing
from reference import norm64, storage_rule

DEVICES = ["cpu", "vulkan"]


def ln_with_weights(affine_size: int) -> vknorm.LayerNorm:
    ln = vknorm.LayerNorm(affine_size=affine_size, eps=1e-5)
    ln.load_model(np.ones(affine_size, np.float32), np.zeros(affine_size, np.float32))
    return ln


def rms_with_weights(affine_size: int) -> vknorm.RMSNorm:
    rms = vknorm.RMSNorm(affine_size=affine_size, eps=1e-5)
    rms.load_model(np.ones(affine_size, np.float32))
    return rms


# ------------------------------------------------------------------------------ affine_size vs the input

MISMATCHES = [
    ("LayerNorm", 5, (4, 6), {"w": 6}),
    ("LayerNorm", 5, (6,), {"w": 6}),
    ("RMSNorm", 7, (2, 4, 6), {"h": 4, "w": 6}),
    ("LayerNorm", 7, (2, 4, 6), {"h": 4, "w": 6}),
    ("RMSNorm", 7, (2, 3, 4, 6), {"d": 3, "h": 4, "w": 6}),
    ("LayerNorm", 25, (2, 3, 4, 6), {"d": 3, "h": 4, "w": 6}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op,affine_size,shape,trailing", MISMATCHES, ids=[f"{m[0]}-{m[1]}-{m[2]}" for m in MISMATCHES])
def test_affine_size_not_matching_trailing_dims_names_both(op, affine_size, shape, trailing, device):
    layer = ln_with_weights(affine_size) if op == "LayerNorm" else rms_with_weights(affine_size)
    with pytest.raises(ValueError) as e:
        layer(np.ones(shape, np.float32), device=device)
    msg = str(e.value)
    assert "affine_size" in msg and str(affine_size) in msg, msg
    for k, v in trailing.items():
        assert f"{k}={v}" in msg, f"message does not name the input's {k}={v}: {msg!r}"


@pytest.mark.parametrize("op,shape", [("LayerNorm", (7, 13)), ("RMSNorm", (7, 13)), ("LayerNorm", (6, 7, 13))])
def test_affine_size_of_the_whole_blob_is_refused_saying_why(op, shape):
    """What pnnx writes for a normalized_shape spanning every non-batch dim: ncnn's LayerNorm normalizes rows
    (dims 2) or channels (dims 3) there, with the first weights; vknorm refuses and says so."""
    size = int(np.prod(shape))
    layer = ln_with_weights(size) if op == "LayerNorm" else rms_with_weights(size)
    with pytest.raises(ValueError) as e:
        layer(np.ones(shape, np.float32), device="cpu")
    msg = str(e.value)
    assert f"is the whole {len(shape)}-d blob" in msg and "cannot normalize as one group" in msg, msg
    assert ("each row of w" if len(shape) == 2 else "else each channel") in msg, msg


@pytest.mark.parametrize("device", DEVICES)
def test_affine_size_mismatch_is_refused_on_forward_inplace_and_vkmat_too(device):
    ln = ln_with_weights(5)
    x = np.ones((3, 6), np.float32)
    with pytest.raises(ValueError, match="affine_size"):
        ln.forward_inplace(x, device=device)
    np.testing.assert_array_equal(x, 1.0)  # untouched
    if device == "vulkan":
        with pytest.raises(ValueError, match="affine_size"):
            ln.forward_inplace(vknorm.to_device(x))


# ------------------------------------------------------------------------------ weights

def test_gamma_or_beta_of_wrong_length_is_refused_naming_the_lengths():
    ln = vknorm.LayerNorm(affine_size=5)
    with pytest.raises(ValueError, match=r"gamma.*4.*5|gamma.*5.*4"):
        ln.load_model(np.ones(4), np.zeros(5))
    with pytest.raises(ValueError, match=r"beta.*6.*5|beta.*5.*6"):
        ln.load_model(np.ones(5), np.zeros(6))
    with pytest.raises(ValueError, match="gamma"):
        ln.load_model(np.ones((1, 5)), np.zeros(5))
    with pytest.raises(ValueError):
        ln.load_model(np.ones(5))  # LayerNorm needs beta too
    rms = vknorm.RMSNorm(affine_size=5)
    with pytest.raises(ValueError, match=r"gamma.*6.*5|gamma.*5.*6"):
        rms.load_model(np.ones(6))
    with pytest.raises((TypeError, ValueError)):
        ln.load_model(np.array(["a"] * 5), np.zeros(5))


@pytest.mark.parametrize("device", DEVICES)
def test_forward_before_load_model_is_refused(device):
    with pytest.raises(ValueError, match="load_model"):
        vknorm.LayerNorm(affine_size=4)(np.ones((2, 4), np.float32), device=device)


# ------------------------------------------------------------------------------ eps and params

@pytest.mark.parametrize("eps", [-1e-3, -math.inf, math.inf, math.nan], ids=["negative", "-inf", "inf", "nan"])
@pytest.mark.parametrize("cls", [vknorm.LayerNorm, vknorm.RMSNorm], ids=["LayerNorm", "RMSNorm"])
def test_eps_negative_or_not_finite_is_refused(cls, eps):
    with pytest.raises(ValueError, match="eps"):
        cls(affine_size=4, eps=eps)
    with pytest.raises(ValueError, match="eps"):
        cls.from_param({0: 4, 1: eps})
    layer = cls(affine_size=4, eps=1e-5)
    with pytest.raises(ValueError, match="eps"):
        layer.load_param({0: 4, 1: eps})
    assert layer.eps == np.float32(1e-5)  # a refused load_param changes nothing


@pytest.mark.parametrize("cls", [vknorm.LayerNorm, vknorm.RMSNorm])
def test_several_bad_params_name_the_first_in_load_param_s_order(cls):
    """affine_size is checked before eps, whatever eps is (a NaN eps was reported first from Python)."""
    for eps in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError, match="affine_size must be >= 0"):
            cls(affine_size=-1, eps=eps)


def test_eps_zero_is_accepted():
    assert vknorm.LayerNorm(affine_size=4, eps=0.0).eps == 0.0


def test_negative_affine_size_and_unknown_device_and_path_are_refused():
    with pytest.raises(ValueError, match="affine_size"):
        vknorm.LayerNorm(affine_size=-1)
    with pytest.raises(ValueError, match="device"):
        ln_with_weights(4)(np.ones((1, 4), np.float32), device="gpu")
    with pytest.raises(ValueError, match="path"):
        vknorm.Option(path="fastest")


@pytest.mark.parametrize("make, match", [
    (lambda: vknorm.LayerNorm(affine_size=3.7), "not an integer"),
    (lambda: vknorm.GroupNorm(group=2.5, channels=8), "not an integer"),
    (lambda: vknorm.RMSNorm(affine_size=float("nan")), "not an integer"),
    (lambda: vknorm.LayerNorm(affine_size="4"), "not an integer"),
    (lambda: vknorm.InstanceNorm(channels=4, affine="no"), "affine must be True/False"),
    (lambda: vknorm.LayerNorm(affine_size=4, affine=2), "affine must be True/False"),
    (lambda: vknorm.Option(max_workgroup_size=2 ** 40), "max_workgroup_size"),
    (lambda: vknorm.Option(max_workgroup_size="64"), "max_workgroup_size"),
], ids=["float-size", "float-group", "nan-size", "str-size", "str-affine", "affine-2", "huge-wg", "str-wg"])
def test_params_and_options_are_what_ncnn_holds_or_refused(make, match):
    """An int param is an integer (3.7 is not silently 3), affine a flag, the workgroup cap a 32-bit count."""
    with pytest.raises(ValueError, match=match):
        make()


def test_a_float_for_an_int_param_is_refused_as_ncnn_would_read_it_as_not_given():
    """ncnn's ParamDict reads a float where a layer asks for an int as not given (a .param's 0=16.0 is affine_size
    0 there), so 16.0 is not taken as 16 either: refused, saying why, in every entry point."""
    for call in (lambda: vknorm.LayerNorm.from_param({0: 16.0, 1: 1e-5, 2: 0}),
                 lambda: vknorm.LayerNorm(8).load_param({0: 16.0}), lambda: vknorm.GroupNorm(group=2.0, channels=8),
                 lambda: vknorm.InstanceNorm.from_param({0: 8, 2: 1.0})):
        with pytest.raises(ValueError, match=r"is not an integer \(a float: ncnn would read it as not given"):
            call()


def test_from_param_reads_affine_as_ncnn_does_weights_unless_0():
    """The ncnn-id entry point reads a .param's affine as ncnn's layers do (2=2 loads weights there); the keyword
    constructor, a Python flag, still takes True/False or 1/0 only."""
    assert vknorm.LayerNorm.from_param({0: 8, 2: 2}).affine is True
    assert vknorm.GroupNorm.from_param({0: 2, 1: 8, 3: -1}).affine is True
    assert vknorm.RMSNorm.from_param({0: 8, 2: 0}).affine is False
    assert vknorm.LayerNorm.from_param({0: 8, 2: np.True_}).affine is True  # numpy's bool is an integer here too
    with pytest.raises(ValueError, match="affine must be True/False"):
        vknorm.LayerNorm(affine_size=8, affine=2)


def test_load_param_refuses_ids_the_layer_does_not_take_as_from_param_does():
    with pytest.raises(ValueError, match=r"LayerNorm.load_param: unknown param id 9: LayerNorm takes 0 affine_size, "
                                         r"1 eps, 2 affine \(a fused activation: set_activation\)"):
        vknorm.LayerNorm(8).load_param({0: 3, 1: 1e-5, 9: 4})
    with pytest.raises(ValueError, match=r"unknown param id 20: .*forward_add"):
        vknorm.LayerNorm(8).load_param({20: 1})
    with pytest.raises(ValueError, match=r"GroupNorm.load_param: unknown param id 4: GroupNorm takes 0 group"):
        vknorm.GroupNorm(2, 8).load_param({4: 1})


@pytest.mark.parametrize("key", [1.0, True, "1"], ids=["float", "bool", "str"])
def test_a_param_id_that_is_not_an_int_is_refused_by_both_entry_points(key):
    """A dict matches 1.0 and True to the key 1: neither is taken for the id 1 (eps), by from_param or load_param."""
    for call, where in ((lambda: vknorm.LayerNorm.from_param({0: 8, key: 1e-3}), "LayerNorm.from_param"),
                        (lambda: vknorm.LayerNorm(8).load_param({key: 1e-3}), "LayerNorm.load_param")):
        with pytest.raises(ValueError, match=rf"^{where}: param id {re.escape(repr(key))} is not an integer \(ids are "
                                            r"ncnn's ints"):
            call()
    assert vknorm.LayerNorm.from_param({np.int64(0): 8, np.int32(1): 1e-3}).eps == pytest.approx(1e-3)


@pytest.mark.parametrize("params", [None, [(0, 8)], "0=8"], ids=["None", "pairs", "text"])
def test_params_that_are_not_a_mapping_of_ids_are_a_type_error_naming_the_call(params):
    for call, where in ((lambda: vknorm.LayerNorm(8).load_param(params), "LayerNorm.load_param"),
                        (lambda: vknorm.GroupNorm.from_param(params), "GroupNorm.from_param")):
        with pytest.raises(TypeError, match=rf"^{where}: params must be a mapping of ncnn param ids to values .* got "
                                            rf"{type(params).__name__}$"):
            call()


def test_none_as_input_is_named():
    with pytest.raises(TypeError, match=r"LayerNorm\(\): expected a numpy array \(or a VkMat\), got None"):
        ln_with_weights(4)(None)


def test_an_eps_past_float32_is_refused_as_given_not_as_the_inf_it_becomes():
    with pytest.raises(ValueError, match=r"param 1 \(eps\)=1e\+40 does not fit ncnn's float32"):
        vknorm.LayerNorm(8, eps=1e40)
    with pytest.raises(ValueError, match=rf"param 1 \(eps\)={10 ** 39} does not fit ncnn's float32"):
        vknorm.LayerNorm(8, eps=10 ** 39)  # ints of up to 40 digits as given
    # an int of hundreds of digits in a few characters
    with pytest.raises(ValueError, match=r"^LayerNorm: param 1 \(eps\)=-1\.000e\+400 does not fit ncnn's float32$"):
        vknorm.LayerNorm(8, eps=-10 ** 400)


def test_an_eps_below_float32_is_refused_not_made_zero():
    # float32 would hold 1e-50 as 0: constant groups would then come out NaN; a subnormal eps and 0 itself are kept
    with pytest.raises(ValueError, match=r"param 1 \(eps\)=1e-50 is below float32's smallest value .* it would be 0"):
        vknorm.LayerNorm(8, eps=1e-50)
    with pytest.raises(ValueError, match=r"GroupNorm.load_param: param 2 \(eps\)=1e-50 is below"):
        vknorm.GroupNorm(2, 8).load_param({0: 2, 1: 8, 2: 1e-50})
    assert vknorm.LayerNorm(8, eps=1e-40).eps == pytest.approx(1e-40, rel=1e-4)
    assert vknorm.LayerNorm(8, eps=0.0).eps == 0.0


@pytest.mark.parametrize("name", ["gamma", "beta"])
def test_weights_past_float32_are_refused_as_given_not_as_the_inf_they_become(name):
    ln = vknorm.LayerNorm(8)
    w = {"gamma": np.ones(8), "beta": np.zeros(8)}
    w[name][3] = 1e300
    with pytest.raises(ValueError, match=rf"LayerNorm.load_model: {name}\[3\]=1e\+300 does not fit float32"):
        ln.load_model(w["gamma"], w["beta"])
    ln.load_model(np.full(8, np.inf, np.float32), np.zeros(8))  # inf itself is a float32: taken, as ncnn takes it
    assert np.isinf(ln.gamma).all()


@pytest.mark.parametrize("where", ["call", "cpu", "to_device"])
def test_float64_input_past_float32_is_refused_as_given_not_as_the_nan_it_becomes(where):
    """The layers compute in float32: a float64 element past its range would be Inf, and its group's output NaN.
    It is refused naming the element, as weights are; Inf given as Inf is taken, as ncnn takes it."""
    ln = vknorm.LayerNorm(4, affine=False)
    x = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, -3e300, 3.0, 4.0]])
    call = {"call": lambda a: ln(a), "cpu": lambda a: ln(a, device="cpu"), "to_device": vknorm.to_device}[where]
    with pytest.raises(ValueError, match=r"^input element \(1, 1\) = np.float64\(-3e\+300\) is past float32's range"):
        call(x)
    x[1, 1] = -np.inf
    y = ln(x)
    assert np.isfinite(y[0]).all() and np.isnan(y[1]).all()


def test_a_group_past_64_bits_of_elements_is_said_as_such_not_as_a_wrapped_count():
    """Four extents of 2^31 - 1 multiply past 2^64: the message says so, where it gave the product modulo 2^64."""
    huge = (2 ** 31 - 1,) * 4
    with pytest.raises(ValueError, match=r"groups of over 2\^64 elements"):
        vknorm.LayerNorm(affine_size=0, affine=False).groups(huge)
    with pytest.raises(ValueError, match=r"items of over 2\^64 elements"):
        vknorm.GroupNorm(group=2, channels=4, affine=False).groups((4,) + huge[1:])


def test_int_params_take_exactly_ncnns_32_bit_range():
    """ncnn holds int params as 32-bit ints: -2^31 and 2^31 - 1 reach the layer's own checks as given; one past
    either end is refused as not fitting (never wrapped, nor left to the binding's conversion)."""
    assert vknorm.LayerNorm(affine_size=2 ** 31 - 1).affine_size == 2 ** 31 - 1
    with pytest.raises(ValueError, match="group must be > 0, got -2147483648"):
        vknorm.GroupNorm(group=-(2 ** 31), channels=8)
    for make in (lambda: vknorm.LayerNorm(affine_size=2 ** 31), lambda: vknorm.GroupNorm(group=-(2 ** 31) - 1, channels=8),
                 lambda: vknorm.InstanceNorm(channels=2 ** 31)):
        with pytest.raises(ValueError, match="does not fit ncnn's 32-bit int"):
            make()


@pytest.mark.parametrize("device", [-1, False, True, "vulkan:-1", "vulkan:abc", "vulkan:", "gpu"], ids=str)
def test_a_device_is_cpu_vulkan_vulkan_n_an_index_or_a_context(device):
    with pytest.raises(ValueError, match="device must be"):
        ln_with_weights(4)(np.ones((1, 4), np.float32), device=device)


@pytest.mark.parametrize("call", ["__call__", "forward", "forward_inplace", "forward_add"])
def test_an_option_given_where_the_device_goes_says_to_pass_it_as_option(call):
    # ncnn's order is forward_inplace(x, opt); here the argument after x is device=
    ln = ln_with_weights(4)
    x = np.ones((1, 4), np.float32)
    args = (x, x, False, vknorm.Option()) if call == "forward_add" else (x, vknorm.Option())
    where = "LayerNorm()" if call == "__call__" else f"LayerNorm.{call}"
    with pytest.raises(TypeError, match=rf"{re.escape(where)}: got an Option where a device goes: pass it as option="):
        (ln if call == "__call__" else getattr(ln, call))(*args)


def test_a_device_index_past_the_devices_is_named_with_the_call():
    count = len(vknorm.devices())
    x = np.ones((1, 4), np.float32)
    for call, where in ((lambda: ln_with_weights(4)(x, device=count), "LayerNorm()"),
                        (lambda: ln_with_weights(4).forward_add(x, x, device=count), "LayerNorm.forward_add"),
                        (lambda: vknorm.to_device(x, device=count), "to_device")):
        with pytest.raises(ValueError, match=rf"^{re.escape(where)}: device index {count} out of range"):
            call()


@pytest.mark.parametrize("device", ["garbage", -1, "vulkan:x", True])
def test_a_layers_device_is_checked_when_the_layer_is_made(device):
    with pytest.raises(ValueError, match=r"LayerNorm: device must be"):
        vknorm.LayerNorm(4, affine=False, device=device)


def test_a_layers_device_index_past_the_devices_is_refused_when_the_layer_is_made():
    count = len(vknorm.devices())
    for device in (count, f"vulkan:{count}"):
        with pytest.raises(ValueError, match=rf"^LayerNorm: device index {count} out of range \({count} devices\)"):
            vknorm.LayerNorm(4, affine=False, device=device)
    assert vknorm.LayerNorm(4, affine=False, device=count - 1).device == count - 1


@pytest.mark.parametrize("call", ["__call__", "forward", "forward_inplace"])
@pytest.mark.parametrize("top", ["numpy", "vkmat"])
def test_a_top_blob_given_in_ncnns_forward_order_is_named_not_printed(call, top):
    """ncnn's forward(bottom, top, opt): here the argument after x is device=, and forward returns its output."""
    ln = ln_with_weights(4)
    x = np.ones((2, 4), np.float32)
    out = np.zeros((2, 4), np.float32) if top == "numpy" else vknorm.to_device(x)
    where = "LayerNorm()" if call == "__call__" else f"LayerNorm.{call}"
    kind = "ndarray" if top == "numpy" else "VkMat"
    with pytest.raises(TypeError, match=rf"^{re.escape(where)}: got a {kind} where a device goes: forward returns its "
                                        r"output \(no top argument"):
        (ln if call == "__call__" else getattr(ln, call))(x, out, vknorm.Option())


def test_a_layer_made_for_the_cpu_refuses_a_vkmat_rather_than_running_it_on_the_gpu():
    """The layer's device= holds for VkMats as a call's does: a VkMat runs where it lives, so a layer made for the
    CPU says it cannot run one (not a silent GPU run), and one made for the VkMat's device runs it."""
    x = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)
    cpu_layer = vknorm.LayerNorm(8, affine=False, device="cpu")
    for call in (lambda v: cpu_layer.forward_inplace(v), lambda v: cpu_layer.forward_add(v, v)):
        with pytest.raises(ValueError, match="device='cpu' cannot run it"):
            call(vknorm.to_device(x))
    here = vknorm.LayerNorm(8, affine=False, device="vulkan")
    assert np.array_equal(here.forward_inplace(vknorm.to_device(x)).numpy(), here(x))


@pytest.mark.parametrize("value", ["false", "yes", 2, None, 0.5])
def test_an_options_flags_are_true_or_false_not_any_truthy_value(value):
    """Option(use_fp16_storage="false") is not float16 storage by accident."""
    for field in ("use_fp16_storage", "use_packing_layout", "use_subgroup_ops"):
        with pytest.raises(ValueError, match=f"{field} must be True or False"):
            vknorm.Option(**{field: value})


def test_a_shape_past_ncnns_int_sizes_is_refused_before_any_copy_of_the_array():
    """A broadcast view takes no memory: the check comes before the contiguous copy (8 GiB here) is made."""
    view = np.broadcast_to(np.float32(0), (2 ** 31,))
    layer = vknorm.LayerNorm(8, affine=False)
    for call in (lambda: layer(view), lambda: layer(view, device="cpu"), lambda: vknorm.to_device(view)):
        with pytest.raises(ValueError, match=r"every dimension must be 1..2\^31-1"):
            call()


def test_forward_add_return_sum_is_a_flag():
    x = np.ones((2, 8), np.float32)
    with pytest.raises(TypeError, match="LayerNorm.forward_add: return_sum must be True or False, got 'no'"):
        vknorm.LayerNorm(8, affine=False).forward_add(x, x, return_sum="no")


def test_options_with_the_same_choices_are_equal():
    assert vknorm.Option() == vknorm.Option()
    assert vknorm.Option(path="split", use_fp16_storage=True) == vknorm.Option(use_fp16_storage=True, path="split")
    assert vknorm.Option() != vknorm.Option(use_packing_layout=False)
    assert vknorm.Option() != "Option()"
    with pytest.raises(TypeError):
        hash(vknorm.Option())  # mutable, as ncnn's: not a dict key


@pytest.mark.parametrize("field, value, error", [
    ("max_workgroup_size", -5, ValueError), ("max_workgroup_size", "3", ValueError),
    ("max_workgroup_size", 2 ** 40, ValueError), ("path", "fast", ValueError), ("use_fp16", True, AttributeError),
    ("use_packing_layout", "no", ValueError),
], ids=["negative-wg", "str-wg", "huge-wg", "path", "misspelt", "str-flag"])
def test_an_options_fields_set_after_construction_are_checked_as_the_constructor_checks_them(field, value, error):
    """ncnn style (opt.field = value): a value the constructor refuses is refused when set later too, and a misspelt
    field is an AttributeError, not an attribute that no call reads. The option keeps its earlier values."""
    o = vknorm.Option(path="split", max_workgroup_size=64)
    with pytest.raises(error, match="max_workgroup_size|path must be|no field 'use_fp16'|use_packing_layout must be"):
        setattr(o, field, value)
    assert (o.path, o.max_workgroup_size) == ("split", 64)
    o.max_workgroup_size, o.use_fp16_storage = np.int64(128), 1
    assert (o.max_workgroup_size, o.use_fp16_storage) == (128, True) and type(o.max_workgroup_size) is int


def test_unknown_param_ids_are_named():
    with pytest.raises(ValueError, match=r"param id 'a' is not an integer"):  # before any id is looked up
        vknorm.LayerNorm.from_param({5: 2, "a": 1})
    with pytest.raises(ValueError, match=r"unknown param ids \[5\]"):
        vknorm.LayerNorm.from_param({5: 2, 0: 8})
    with pytest.raises(ValueError, match=r"unknown param ids \[9, 10\]"):  # numbers in numeric order
        vknorm.LayerNorm.from_param({10: 1, 9: 2})


@pytest.mark.parametrize("option", ["fp16", {"use_fp16_storage": True}, 1], ids=str)
def test_an_option_that_is_not_a_vknorm_option_is_a_type_error(option):
    with pytest.raises(TypeError, match="option must be a vknorm.Option"):
        ln_with_weights(4)(np.ones((1, 4), np.float32), option=option, device="vulkan")


# ------------------------------------------------------------------------------ arrays

@pytest.mark.parametrize("shape", [(2 ** 31,), (2 ** 32 + 4,), (2, 2 ** 31), (2 ** 31, 1)], ids=str)
def test_a_dimension_past_ncnns_int_is_refused_not_wrapped(shape):
    """ncnn's Mat holds int sizes: 2^32 + 4 elements must not become a 4-element blob. (np.zeros reserves the
    pages without touching them; the refusal comes before any copy.)"""
    x = np.zeros(shape, np.float16)
    with pytest.raises(ValueError, match=r"every dimension must be 1..2\^31-1"):
        vknorm.to_device(x)
    rows = np.zeros((2 ** 31, 1), np.float16)  # a layer of 1-element groups over 2^31 rows
    with pytest.raises(ValueError, match=r"every dimension must be 1..2\^31-1"):
        vknorm.LayerNorm(affine_size=1, affine=False)(rows, device="vulkan")

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0,), (0, 4), (4, 0), (0, 2, 4), (2, 0, 3, 4)], ids=str)
def test_empty_arrays_are_refused(shape, device):
    layer = vknorm.RMSNorm(affine_size=4, affine=False)
    with pytest.raises(ValueError, match="empty"):
        layer(np.ones(shape, np.float32), device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(), (1, 1, 1, 1, 4), (2, 1, 2, 1, 2, 4)], ids=str)
def test_zero_or_more_than_4_dims_are_refused(shape, device):
    layer = vknorm.LayerNorm(affine_size=4, affine=False)
    with pytest.raises(ValueError, match="dims"):
        layer(np.ones(shape, np.float32), device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint16, np.bool_, np.complex64, np.str_])
def test_non_float_dtypes_are_refused(dtype, device):
    layer = vknorm.LayerNorm(affine_size=4, affine=False)
    x = np.ones((2, 4)).astype(dtype)
    with pytest.raises(TypeError, match="dtype"):
        layer(x, device=device)
    with pytest.raises(TypeError, match="dtype"):
        layer.forward_inplace(x, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_float16_input_is_accepted_and_returns_float16(device):
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float16)
    ln = ln_with_weights(8)
    y = ln(x, device=device)
    assert y.dtype == np.float16 and y.shape == x.shape
    err, bound = storage_rule(y, norm64("LayerNorm", x, 8, 1e-5, True, np.ones(8), np.zeros(8)), True)
    assert err <= bound, (err, bound)


@pytest.mark.parametrize("device", DEVICES)
def test_float64_lists_and_strided_views_are_converted(device):
    ln = ln_with_weights(4)
    x = np.random.default_rng(1).standard_normal((3, 8))
    want = ln(np.ascontiguousarray(x[:, ::2], np.float32), device=device)
    np.testing.assert_array_equal(ln(x[:, ::2], device=device), want)
    assert ln(x[:, ::2], device=device).dtype == np.float32
    np.testing.assert_array_equal(ln(x[:, ::2].tolist(), device=device), want)


def test_forward_inplace_refuses_read_only_arrays_and_non_arrays():
    ln = ln_with_weights(4)
    ro = np.ones((2, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        ln.forward_inplace(ro, device="cpu")
    with pytest.raises(TypeError):
        ln.forward_inplace([[1.0, 2.0, 3.0, 4.0]], device="cpu")


def test_a_vkmat_cannot_run_on_the_cpu_and_mats_are_not_numpy():
    ln = ln_with_weights(4)
    vk = vknorm.to_device(np.ones((2, 4), np.float32))
    for call in (ln.forward_inplace, ln, ln.forward):
        with pytest.raises(ValueError, match="device='cpu' cannot run it"):
            call(vk, device="cpu")
    with pytest.raises(TypeError):
        vknorm.to_device(np.ones((2, 4), np.int32))


@pytest.mark.parametrize("shape", [(3, 5, 7), (4, 9), (12,)], ids=str)
def test_a_pyncnn_mat_is_normalized_in_place_as_its_numpy_view_is(shape):
    """ncnn users hold pyncnn's Mat: forward_inplace writes into its memory (channels cstep apart) and returns it,
    as for the numpy view of it; a layer call reads it as an array."""
    ncnn = import_or_missing("ncnn")
    x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    ln = vknorm.LayerNorm(shape[-1], eps=1e-5, affine=False)
    want = ln(x)
    m = ncnn.Mat(x.copy())
    assert ln.forward_inplace(m) is m
    np.testing.assert_array_equal(np.array(m), want)
    np.testing.assert_array_equal(ln(ncnn.Mat(x.copy())), want)


def test_an_empty_or_packed_pyncnn_mat_is_refused_not_a_crash():
    """pyncnn's own conversion to numpy crashes (SIGSEGV) on an empty Mat and on a packed one: a call or an in-place
    forward given one says what it takes, in a child process so that a regression fails here and does not end
    the test run."""
    import_or_missing("ncnn")
    code = textwrap.dedent("""
        import ncnn, vknorm
        ln = vknorm.LayerNorm(5, eps=1e-5, affine=False)
        for name, m in (("empty", ncnn.Mat()), ("packed", ncnn.Mat(5, 3, 1, elemsize=16, elempack=4))):
            for call in (ln, ln.forward_inplace):
                try:
                    call(m)
                    print(name, "no error")
                except ValueError as e:
                    print(name, e)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [
        "empty LayerNorm(): the pyncnn Mat is empty",
        "empty LayerNorm.forward_inplace: the pyncnn Mat is empty",
        "packed LayerNorm(): a pyncnn Mat of elempack 4 and elemsize 16: only unpacked float32 Mats (elempack 1, "
        "elemsize 4) convert to numpy",
        "packed LayerNorm.forward_inplace: a pyncnn Mat of elempack 4 and elemsize 16: only unpacked float32 Mats "
        "(elempack 1, elemsize 4) convert to numpy"], proc.stdout


def test_an_input_whose_copy_exceeds_host_memory_is_a_memory_error_before_the_copy():
    """A broadcast view of 128 GiB takes a few bytes until it is copied contiguous: every call that copies its input
    (the device and the CPU path, forward_add of one float type or two, to_device) says so before copying (the
    kernel's out-of-memory killer ended the process). In a child limited to 4 GiB of address space, so that a
    regression fails on numpy's own message instead of filling the machine."""
    code = textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        import numpy as np, vknorm
        ln = vknorm.LayerNorm(1 << 15, 1e-5, affine=False)
        x = np.broadcast_to(np.float32(1), (1 << 20, 1 << 15))
        x16 = np.broadcast_to(np.float16(1), x.shape)  # with x: both read as float32
        for call in (lambda: ln(x), lambda: ln(x, device="cpu"), lambda: ln.forward_add(x, x),
                     lambda: ln.forward_add(x16, x), lambda: ln.forward_add(x, x, device="cpu"),
                     lambda: vknorm.to_device(x)):
            try:
                call()
                print("no error")
            except MemoryError as e:
                print(e)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 6 and all(ln.startswith("an input of shape (1048576, 32768) needs 128.0 GiB of host memory "
                                                 "(a contiguous float32 copy); this machine has ") for ln in lines), lines


def test_a_host_mat_is_refused_with_advice_that_works():
    """A vknorm.Mat is host memory: every call names what takes it (its numpy view, or a VkMat made from that),
    never forward_inplace, which refuses a Mat too."""
    ln = ln_with_weights(4)
    x = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    mat = vknorm.Mat.from_numpy(x.copy())
    for call in (lambda: ln(mat), lambda: ln.forward_inplace(mat), lambda: ln.forward_add(mat, mat),
                 lambda: vknorm.to_device(mat)):
        with pytest.raises(TypeError, match="got a Mat") as e:
            call()
        advice = str(e.value).split("got a Mat", 1)[1]
        assert "m.numpy()" in advice and "forward_inplace" not in advice, str(e.value)
    want = ln(x, device="cpu")
    np.testing.assert_allclose(ln(mat.numpy()), want, atol=1e-5)  # the advice, followed
    v = vknorm.to_device(mat.numpy())
    ln.forward_inplace(v)
    np.testing.assert_allclose(v.numpy(), want, atol=1e-5)


def test_a_vkmat_given_where_numpy_is_wanted_says_what_to_do():
    ln = ln_with_weights(4)
    v = vknorm.to_device(np.ones((2, 4), np.float32))
    with pytest.raises(TypeError, match=r"on the device already \(v.numpy\(\) downloads it\)"):
        vknorm.to_device(v)
    with pytest.raises(TypeError, match="must both be VkMats or both numpy arrays"):
        ln.forward_add(v, np.ones((2, 4), np.float32))


# ------------------------------------------------------------------------------ device= with VkMats

def _vkmat_calls(ln):
    return {"forward": lambda v, device: ln.forward(v, device=device),
            "forward_inplace": lambda v, device: ln.forward_inplace(v, device=device),
            "forward_add": lambda v, device: ln.forward_add(v, v, device=device)}


@pytest.mark.parametrize("call", ["forward", "forward_inplace", "forward_add"])
@pytest.mark.parametrize("device", ["garbage", "gpu", -1, True, "vulkan:abc", 2.0], ids=repr)
def test_an_invalid_device_with_a_vkmat_is_refused_not_ignored(call, device):
    ln = ln_with_weights(4)
    v = vknorm.to_device(np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match=f"LayerNorm.{call}: device must be"):
        _vkmat_calls(ln)[call](v, device)
    np.testing.assert_array_equal(v.numpy(), 1.0)  # refused before it ran


@pytest.mark.parametrize("call", ["forward", "forward_inplace", "forward_add"])
def test_a_device_other_than_the_vkmats_own_is_refused_naming_both(call):
    ln = ln_with_weights(4)
    v = vknorm.to_device(np.ones((2, 4), np.float32))
    have = v.context.info["index"]
    count = len(vknorm.devices())
    with pytest.raises(ValueError, match=f"device index {count} out of range"):
        _vkmat_calls(ln)[call](v, count)
    with pytest.raises(ValueError, match=f"device='vulkan:{count}'"):
        _vkmat_calls(ln)[call](v, f"vulkan:{count}")
    if count > 1:  # a real other device
        other = (have + 1) % count
        with pytest.raises(ValueError, match=f"is device {other}, but the VkMat lives on device {have}"):
            _vkmat_calls(ln)[call](v, other)
    with pytest.raises(ValueError, match="a Context other than the one the VkMat lives on"):
        _vkmat_calls(ln)[call](v, vknorm.Context.create(have))  # the same GPU, another context: not its buffers
    np.testing.assert_array_equal(v.numpy(), 1.0)


@pytest.mark.parametrize("call", ["forward", "forward_inplace", "forward_add"])
def test_a_device_naming_the_vkmats_own_runs_as_without_one(call):
    ln = ln_with_weights(4)
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    v0 = vknorm.to_device(x)
    index = v0.context.info["index"]
    want = _vkmat_calls(ln)[call](v0, None).numpy()
    for device in ("vulkan", f"vulkan:{index}", index, np.int64(index), v0.context):
        v = vknorm.to_device(x)
        np.testing.assert_array_equal(_vkmat_calls(ln)[call](v, device).numpy(), want)


@pytest.mark.parametrize("call", ["forward", "forward_inplace", "forward_add"])
def test_a_vkmat_runs_where_it_lives_whatever_device_the_layer_ran_on_before(call):
    """A numpy call moves the layer to the call's device; a VkMat on another context (here the same GPU opened
    again) then still runs where it lives, as without the numpy call before it (it was refused as living on
    another context than the layer's), and a VkMat on the default device after it."""
    ln = ln_with_weights(4)
    run = lambda v: _vkmat_calls(ln)[call](v, None)  # noqa: E731
    x = np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32)
    want = run(vknorm.to_device(x)).numpy()
    own = vknorm.Context.create(vknorm.to_device(x).context.info["index"])
    for device in (own, None):  # another context, then the default one again
        ln(x)  # numpy on the default device
        v = vknorm.to_device(x, device=device)
        np.testing.assert_array_equal(run(v).numpy(), want)
        assert ln._layer.context is v.context


# ------------------------------------------------------------------------------ messages name the layer

@pytest.mark.parametrize("call, message", [
    (lambda: vknorm.LayerNorm(4).load_param({1: "a"}), "LayerNorm.load_param: param 1 (eps) must be a number, got 'a'"),
    (lambda: vknorm.GroupNorm(2, 8).load_param({2: None}), "GroupNorm.load_param: param 2 (eps) must be a number"),
    (lambda: vknorm.RMSNorm(4).load_param({0: "a"}), "RMSNorm.load_param: param 0 (affine_size)='a' is not an integer"),
    (lambda: vknorm.InstanceNorm(4, eps="1e-5"), "InstanceNorm: param 1 (eps) must be a number, got '1e-5'"),
    (lambda: vknorm.LayerNorm(4, 10 ** 400), "LayerNorm: param 1 (eps)=1.000e+400 does not fit"),  # not OverflowError
    (lambda: vknorm.LayerNorm(4).set_activation("leakyrelu", "a"),
     "LayerNorm.set_activation: alpha must be a finite number within float32's range, got 'a'"),
    (lambda: vknorm.RMSNorm(4).set_activation("leakyrelu", math.nan), "RMSNorm.set_activation: alpha must be a finite"),
    # the kernel's slope is float32: it became inf, and so did every negative output
    (lambda: vknorm.LayerNorm(4).set_activation("leakyrelu", 1e39), "within float32's range, got 1e+39"),
    (lambda: vknorm.LayerNorm(4).set_activation("relu", 10 ** 400), "within float32's range, got 1000"),
    (lambda: vknorm.LayerNorm(4).set_activation("tanh"), "LayerNorm.set_activation: activation 'tanh'"),
    # a bool is a flag (affine), not a count: GroupNorm(group=True) was one group
    (lambda: vknorm.GroupNorm(group=True, channels=4), "GroupNorm: param 0 (group)=True is not an integer (a bool"),
    (lambda: vknorm.LayerNorm.from_param({0: True}), "LayerNorm.from_param: param 0 (affine_size)=True is not an"),
    (lambda: vknorm.InstanceNorm(4).load_param({0: np.bool_(True)}), "is not an integer (a bool: only affine takes one)"),
], ids=["eps-str", "eps-none", "int-str", "ctor-eps-str", "eps-past-float64", "alpha-str", "alpha-nan",
        "alpha-past-float32", "alpha-past-float64", "activation", "bool-group", "bool-affine-size", "bool-channels"])
def test_a_bad_param_or_activation_names_the_layer_the_param_and_the_value(call, message):
    """Not float()'s bare "could not convert string to float: 'a'"."""
    with pytest.raises(ValueError) as e:
        call()
    assert message in str(e.value), str(e.value)


# ------------------------------------------------------------------------------ the host path layer (pyncnn)

HOST_LAYER_REFUSES = """
import sys
import textwrap
import numpy as np, ncnn, vknorm.ncnn
net = ncnn.Net()
reg = vknorm.ncnn.register(net)
assert net.load_param(sys.argv[1]) == 0 and net.load_model(sys.argv[2]) == 0
ex = net.create_extractor()
ex.input("in0", ncnn.Mat(np.ones((8, 6, 11), np.float32)))  # w 11; the model's LayerNorm takes 10
ret, _ = ex.extract("out0")
(name, e), = reg.errors()
print(ret, name, type(e).__name__, e)
"""


def test_a_host_path_layer_that_refused_its_input_keeps_the_error_and_leaks_nothing_at_exit():
    """The kept exception must not keep its traceback: its frames hold the layer, which pyncnn holds from C++,
    and nanobind then reports leaked instances at exit."""
    import_or_missing("ncnn")
    data = Path(__file__).parent / "data"
    r = subprocess.run([sys.executable, "-c", HOST_LAYER_REFUSES, str(data / "layernorm_2d.ncnn.param"),
                        str(data / "layernorm_2d.ncnn.bin")], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, VKNORM_VALIDATION="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    ret, name, kind, message = r.stdout.split(" ", 3)
    assert (ret, name, kind) == ("-1", "ln_1", "ValueError") and "affine_size 60" in message, r.stdout
    assert "leaked" not in r.stderr, r.stderr[-3000:]


def test_a_host_path_layer_that_refused_its_params_keeps_the_error_after_ncnn_destroyed_it(tmp_path):
    """A load_param that fails makes ncnn destroy every layer of the net, the failing one too: its exception, kept on
    the layer, went with it, and only the stderr line said why. The Registration keeps it until the next load."""
    ncnn = import_or_missing("ncnn")
    import vknorm.ncnn

    bad = tmp_path / "bad.param"
    bad.write_text("7767517\n2 2\nInput in0 0 1 in0\nLayerNorm ln 1 1 in0 out0 0=-10 1=1e-5 2=0\n")
    good = Path(__file__).parent / "data" / "layernorm_2d.ncnn.param"
    net = ncnn.Net()
    reg = vknorm.ncnn.register(net)
    assert net.load_param(str(bad)) != 0 and reg.layers == []
    (name, e), = reg.errors()
    assert name == "ln" and isinstance(e, ValueError) and "affine_size must be >= 0, got -10" in str(e), (name, e)
    assert net.load_param(str(good)) == 0 and reg.errors() == [], reg.errors()  # the next load starts afresh

"""The Python face of the layers: ncnn's parameters and lifecycle, numpy in and out."""
from __future__ import annotations

import math
import numbers
import os
from typing import Any, Dict, Literal, Mapping, Optional, Tuple, TypeVar, Union, cast, overload

import numpy as np

from . import _core

_PATHS = ("auto", "subgroup", "workgroup", "split", "cooperative")
_InPlace = TypeVar("_InPlace")  # forward_inplace gives back what it was given


class Option:
    """Per-call choices, as ncnn's Option.

    use_fp16_storage: float16 blob on the device (float32 arithmetic). Default False. As in ncnn, a value past
        float16's range (|x| >= 65520, which rounds past 65504, the largest float16) is stored as +-Inf, and its
        group's outputs are NaN.
    use_packing_layout: ncnn's pack4 layout when channels (dims 3/4) or rows (dims 2) divide by 4.
    path: "auto" (the dispatcher decides; VKNORM_PATH overrides), "subgroup", "workgroup", "split" or
        "cooperative". The paths are the kernel's shape: one dispatch whose team of invocations fits one
        subgroup or spans a workgroup, two or three passes (reduce, [finalize,] apply: on GPUs apply merges the
        partials itself), or one dispatch in which
        workgroups share groups. A forced path that cannot hold the group falls to the next larger one
        (cooperative, whose chunks of a group must all be resident at once: split); the layer's
        ``last_dispatch["path"]`` says what ran.
    use_subgroup_ops: allow subgroup reductions where the device has them (``last_dispatch["subgroup"]``
        says whether a forward used them; a "subgroup" team without them reduces through shared memory).
    max_workgroup_size: cap on invocations per workgroup, rounded down to a power of two (0: the device's choice).
    """

    _FIELDS = ("use_fp16_storage", "use_packing_layout", "path", "use_subgroup_ops", "max_workgroup_size")

    def __init__(self, use_fp16_storage: bool = False, use_packing_layout: bool = True, path: str = "auto",
                 use_subgroup_ops: bool = True, max_workgroup_size: int = 0):
        self.path = path
        self.max_workgroup_size = max_workgroup_size
        self.use_fp16_storage = use_fp16_storage
        self.use_packing_layout = use_packing_layout
        self.use_subgroup_ops = use_subgroup_ops

    def __setattr__(self, name, value):
        """Every field checked as the constructor checks it, also when set later (ncnn style); a misspelt
        field is an AttributeError, not a new attribute no call reads."""
        if name == "path":
            if value not in _PATHS:
                raise ValueError(f"path must be one of {', '.join(_PATHS)}, got {value!r}")
        elif name == "max_workgroup_size":
            if (not isinstance(value, numbers.Integral) or isinstance(value, bool)
                    or not 0 <= value < (1 << 31)):
                raise ValueError(f"max_workgroup_size must be an integer 0..2^31-1 (0: the device's choice), "
                                 f"got {value!r}")
            value = int(value)
        elif name in self._FIELDS:  # a flag: True/False or 1/0 ("false" is not False)
            if not (isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Integral) and value in (0, 1))):
                raise ValueError(f"{name} must be True or False (or 1/0), got {value!r}")
            value = bool(value)
        else:
            raise AttributeError(f"vknorm.Option has no field {name!r} (its fields: {', '.join(self._FIELDS)})")
        object.__setattr__(self, name, value)

    def _native(self) -> _core.Option:
        o = _core.Option()
        o.use_fp16_storage = self.use_fp16_storage
        o.use_packing_layout = self.use_packing_layout
        o.path = _core.parse_path(self.path)
        o.use_subgroup_ops = self.use_subgroup_ops
        o.max_workgroup_size = self.max_workgroup_size
        return o

    @staticmethod
    def _of(option) -> _core.Option:
        """The native option of a call's ``option`` argument (a vknorm.Option), TypeError for anything else."""
        if not isinstance(option, Option):
            raise TypeError(f"option must be a vknorm.Option, got {type(option).__name__} {option!r}")
        return option._native()

    def __eq__(self, other) -> bool:  # the same choices (a mutable value: not hashable)
        if not isinstance(other, Option):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self._FIELDS)

    __hash__ = None  # type: ignore[assignment]  # a mutable value: not hashable

    def __repr__(self) -> str:
        return (f"Option(use_fp16_storage={self.use_fp16_storage}, use_packing_layout={self.use_packing_layout}, "
                f"path={self.path!r}, use_subgroup_ops={self.use_subgroup_ops}, "
                f"max_workgroup_size={self.max_workgroup_size})")


def devices() -> list:
    """Every Vulkan device: name, type, driver, limits (raises VulkanUnavailableError with no driver)."""
    return _core.devices()


def device_info() -> dict:
    """The default device (VKNORM_DEVICE, else discrete > integrated > virtual > cpu)."""
    return _core.Context.default().info


_vulkan_seen = False  # a device once found stays: enumerating on every call cost ~0.3 ms per forward


def _vulkan_available() -> bool:
    global _vulkan_seen
    if _vulkan_seen:
        return True
    try:
        _vulkan_seen = len(_core.devices()) > 0
    except _core.VulkanUnavailableError:
        return False
    return _vulkan_seen


def _ncnn_mat_kind(x) -> str | None:
    """"pyncnn" for pyncnn's ncnn.Mat, "vknorm.graph" for vknorm.graph's (whose buffer export numpy reads as
    pyncnn's), None for anything else (vknorm's own Mat too)."""
    t = type(x)
    if t.__name__ != "Mat":
        return None
    return "pyncnn" if t.__module__.split(".")[0] == "ncnn" else "vknorm.graph" if t.__module__ == "vknorm._graph" \
        else None


def _ncnn_mat_array(m, where: str) -> np.ndarray:
    """numpy's view of a pyncnn Mat or a vknorm.graph Mat (channels cstep apart), after what pyncnn's buffer export
    does not check (it crashed on an empty Mat and on a packed one)."""
    if m.empty():
        raise ValueError(f"{where}: the {_ncnn_mat_kind(m)} Mat is empty")
    if m.elempack != 1 or m.elemsize != 4:
        raise ValueError(f"{where}: a {_ncnn_mat_kind(m)} Mat of elempack {m.elempack} and elemsize {m.elemsize}: "
                         "only unpacked float32 Mats (elempack 1, elemsize 4) convert to numpy")
    return np.asarray(m)


_MAT_ADVICE = ("a vknorm.Mat is host memory in ncnn's layout: pass m.numpy() (a numpy array), or "
               "vknorm.to_device(m.numpy()) for a VkMat that stays on the device")


_MAX_EXTENT = (1 << 31) - 1


def _check_array(x, where: str) -> np.ndarray:
    """numpy in the shapes pyncnn uses: (w), (h, w), (c, h, w), (c, d, h, w); float16/32/64. where: the call,
    for the messages."""
    if isinstance(x, _core.Mat):
        raise TypeError(f"{where} needs a numpy array, got a Mat: {_MAT_ADVICE}")
    if isinstance(x, _core.VkMat):
        raise TypeError(f"{where} needs a numpy array, got a VkMat: it is on the device already (v.numpy() downloads "
                        "it)")
    if x is None:
        raise TypeError(f"{where}: expected a numpy array (or a VkMat), got None")
    a = _ncnn_mat_array(x, where) if _ncnn_mat_kind(x) else np.asarray(x)
    if a.dtype.kind not in "f":
        raise TypeError(f"{where}: expected floating point data (float32 or float16), got dtype {a.dtype}"
                        + (f" ({type(x).__name__})" if not isinstance(x, np.ndarray) else ""))
    if a.ndim < 1 or a.ndim > 4:
        raise ValueError(f"{where}: expected 1-4 dims ((w), (h, w), (c, h, w) or (c, d, h, w)), got {a.ndim} dims "
                         f"{a.shape}")
    if a.size == 0:
        raise ValueError(f"{where}: empty array of shape {a.shape}")
    if max(a.shape) > _MAX_EXTENT:  # before any copy of it (a broadcast view may be far larger than its memory)
        raise ValueError(f"{where}: every dimension must be 1..2^31-1 (ncnn's Mat sizes are int), got shape {a.shape}")
    return a


_indexed_contexts: dict = {}  # device index -> its Context, made once: every call with that index shares it


def _indexed_context(index: int) -> _core.Context:
    if index == _core.default_device_index():  # the default device by its index: the default context itself
        return _core.Context.default()
    ctx = _indexed_contexts.get(index)
    if ctx is None:
        ctx = _indexed_contexts[index] = _core.Context.create(index)
    return ctx


def release_indexed_contexts() -> None:
    """Drop the contexts made for device indices (at exit, while the driver is still whole)."""
    _indexed_contexts.clear()


def _parse_device(device, where: str = ""):
    """A device argument (not None) as "cpu", "vulkan" (the default device), a device index or a Context;
    ValueError for anything else (where: "LayerNorm.forward_inplace: ", for the message)."""
    if isinstance(device, _core.Context):
        return device
    if isinstance(device, numbers.Integral) and not isinstance(device, (bool, np.bool_)) and int(device) >= 0:
        return int(device)
    if isinstance(device, str):
        if device in ("cpu", "vulkan"):
            return device
        if device.startswith("vulkan:") and device[7:].isdigit():
            return int(device[7:])
    if type(device).__name__ == "Option":  # ncnn's argument order (vknorm's, its native one, pyncnn's)
        raise TypeError(f"{where}got an Option where a device goes: pass it as option=... (in a call, the "
                        "argument after x is device=)")
    if isinstance(device, np.ndarray) or type(device).__name__ in ("VkMat", "Mat"):  # ncnn's forward(bottom, top, opt)
        raise TypeError(f"{where}got a {type(device).__name__} where a device goes: forward returns its output "
                        "(no top argument, unlike ncnn's forward(bottom, top, opt)); forward_inplace(x) writes x")
    raise ValueError(f"{where}device must be 'cpu', 'vulkan', 'vulkan:N', an index N >= 0 or a Context, "
                     f"got {device!r}")


def _context_for(device, where: str = "") -> Optional[_core.Context]:
    """None for the CPU reference, else the Vulkan context the call should run on (where: "LayerNorm(): ", for
    the messages)."""
    if device is None:
        return _core.Context.default() if _vulkan_available() else None
    d = _parse_device(device, where)
    if d == "cpu":
        return None
    if d == "vulkan":
        return _core.Context.default()
    if isinstance(d, _core.Context):
        return d
    try:
        return _indexed_context(d)
    except ValueError as e:  # an index past the devices
        raise ValueError(f"{where}{e}") from None


def _check_vkmat_device(device, mats, where: str) -> None:
    """A VkMat runs on the context it lives on; a call's device=, when given, must be a valid device naming
    that one (ignoring it once let device='garbage' or another GPU's index pass unnoticed)."""
    if device is None:
        return
    d = _parse_device(device, f"{where}: ")
    if d == "cpu":
        raise ValueError(f"{where}: a VkMat lives on a Vulkan device; device='cpu' cannot run it")
    for v in mats:
        ctx = v.context
        if isinstance(d, _core.Context):
            if d is not ctx:
                raise ValueError(f"{where}: device= is a Context other than the one the VkMat lives on "
                                 f"({ctx.info['name']}); a VkMat runs where it lives (omit device=, or upload "
                                 "with to_device(..., device=that context))")
            continue
        want = _core.default_device_index() if d == "vulkan" else d
        have = int(ctx.info["index"])
        if want != have:
            count = len(_core.devices())
            if want >= count:
                raise ValueError(f"{where}: device={device!r}: device index {want} out of range ({count} devices)")
            raise ValueError(f"{where}: device={device!r} is device {want}, but the VkMat lives on device {have} "
                             f"({ctx.info['name']}); a VkMat runs where it lives (omit device=, or upload the "
                             "data to the device wanted with to_device(x, device=...))")


def to_device(x, option: Optional[Option] = None, device=None) -> _core.VkMat:
    """Upload a numpy array as a VkMat in the Option's storage and packing."""
    a = _check_array(x, "to_device")
    ctx = _context_for("vulkan" if device is None else device, "to_device: ")
    if ctx is None:
        raise ValueError("to_device needs a Vulkan device, not 'cpu'")
    return _core.VkMat.upload(_as_input(a), ctx, Option._of(Option() if option is None else option))


def _is_float16(a: np.ndarray) -> bool:
    """float16 in either byte order (a big-endian '>f2' array is float16 too, though not np.float16)."""
    return a.dtype.kind == "f" and a.dtype.itemsize == 2


def _available_host_memory() -> Optional[int]:
    """Bytes the kernel says a new allocation can have (MemAvailable), else the physical memory, else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def _require_host_memory(what: str, nbytes: int, why: str) -> None:
    """MemoryError where nbytes exceed the host memory available now: where the kernel overcommits, numpy's
    allocation succeeds, and filling it pages for hours or meets the out-of-memory killer instead of failing."""
    available = _available_host_memory()
    if available is not None and nbytes > available:
        raise MemoryError(f"{what} needs {nbytes / 2**30:.1f} GiB of host memory ({why}); this machine has "
                          f"{available / 2**30:.1f} GiB available")


_COPY_CHECKED_BYTES = 1 << 30  # copies smaller than this go ahead unchecked (the check reads /proc/meminfo)


def _as_input(a: np.ndarray, dtype=None) -> np.ndarray:
    """float16 or float32 (dtype, else a's own float width) in native byte order, contiguous and aligned: a itself
    where it already is (only read). MemoryError for a copy larger than the host memory available (a broadcast
    view takes a few bytes and its copy all of them: where the kernel overcommits, the copy ended in the
    out-of-memory killer, not an error)."""
    dtype = np.dtype(dtype if dtype is not None else np.float16 if _is_float16(a) else np.float32)
    copied = not (a.dtype == dtype and a.flags.c_contiguous and a.flags.aligned)
    need = a.size * dtype.itemsize
    if copied and need >= _COPY_CHECKED_BYTES:
        _require_host_memory(f"an input of shape {a.shape}", need, f"a contiguous {dtype} copy")
    if a.dtype.itemsize <= dtype.itemsize:
        return np.require(a, dtype=dtype, requirements=["C", "A"])
    with np.errstate(over="raise"):  # float64 past float32's range would be Inf, then the group's output NaN
        try:
            return np.require(a, dtype=dtype, requirements=["C", "A"])
        except FloatingPointError:
            at = tuple(int(i) for i in np.argwhere(np.isfinite(a) & (np.abs(a) > np.finfo(dtype).max))[0])
            raise ValueError(f"input element {at} = {a[at]!r} is past {dtype}'s range (the {dtype} the layer computes "
                             "in would hold Inf): scale the input, or give it as Inf where Inf is meant") from None


def _param_int(pid, v, where: str = "", name: str = "") -> int:
    """An int param as ncnn's ParamDict holds it (32-bit); ValueError otherwise, not a C++ bad_cast: 3.7 is not 3,
    and 16.0 is not 16 either (ncnn's ParamDict reads a float where it expects an int as not given, so a .param's
    "0=16.0" is affine_size 0 there). where ("LayerNorm.load_param: ") and name ("affine_size") go into the message."""
    label = f"{where}param {pid}" + (f" ({name})" if name else "")
    if isinstance(v, (bool, np.bool_)) and name != "affine":  # a flag only: GroupNorm(group=True) is no group count
        raise ValueError(f"{label}={v!r} is not an integer (a bool: " +
                         ("only affine takes one)" if name else "param ids are ints)"))
    if not isinstance(v, (numbers.Integral, np.bool_)):  # numpy's bool is no numbers.Integral
        hint = (" (a float: ncnn would read it as not given; write it without a decimal point)"
                if isinstance(v, numbers.Real) and math.isfinite(v) and v == math.floor(v) else "")
        raise ValueError(f"{label}={v!r} is not an integer{hint}") from None
    i = int(v)
    if not -(1 << 31) <= i < (1 << 31):
        raise ValueError(f"{label}={v!r} does not fit ncnn's 32-bit int")
    return i


def _check_params(params, where: str) -> None:
    if not isinstance(params, Mapping):
        raise TypeError(f"{where}: params must be a mapping of ncnn param ids to values ({{0: 768, 1: 1e-5}}), "
                        f"got {type(params).__name__}")
    for k in params:  # a dict matches 1.0 and True to the id 1: such a key is refused, not read as an id
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral):
            raise ValueError(f"{where}: param id {k!r} is not an integer (ids are ncnn's ints: {{0: 768, 1: 1e-5}})")


def _fits_float32(v: numbers.Real) -> bool:
    """v is finite as a float32 (an int past float64, 10**400, is not)."""
    try:
        f = float(v)
    except OverflowError:
        return False
    with np.errstate(over="ignore"):
        return math.isfinite(np.float32(f))


def _param_float(pid, v, where: str, name: str) -> float:
    """A float param (eps): a real number (its range is the core's to check); ValueError naming it otherwise,
    not float()'s bare "could not convert string to float"."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise ValueError(f"{where}param {pid} ({name}) must be a number, got {v!r}")
    finite = isinstance(v, numbers.Integral) or math.isfinite(v)  # NaN and inf are the core's to refuse
    if finite and not _fits_float32(v):  # said as given, not as the inf it would become (a huge int: its magnitude)
        digits = str(abs(int(v))) if isinstance(v, numbers.Integral) else ""
        said = f"{'-' if v < 0 else ''}{digits[0]}.{digits[1:4]}e+{len(digits) - 1}" if len(digits) > 40 else repr(v)
        raise ValueError(f"{where}param {pid} ({name})={said} does not fit ncnn's float32")
    with np.errstate(under="ignore"):
        if v != 0 and np.float32(v) == 0:  # eps=1e-50 would be eps 0: NaN for constant groups
            raise ValueError(f"{where}param {pid} ({name})={v!r} is below float32's smallest value (1.4e-45): it "
                             "would be 0")
    return float(v)


class _Norm:
    _op = ""
    # ncnn ParamDict ids: (id, name, default) in id order; eps and affine as ncnn numbers them per layer.
    _params: Tuple[Tuple[int, str, Union[int, float]], ...] = (
        (0, "affine_size", 0), (1, "eps", 0.001), (2, "affine", 1))

    def __init__(self, affine_size: int = 0, eps: float = 0.001, affine: bool = True, *,
                 option: Optional[Option] = None, device=None):
        self._setup({"affine_size": affine_size, "eps": eps, "affine": affine}, option, device)

    def _setup(self, values: dict, option: Optional[Option], device) -> None:
        self._layer = _core.Norm(self._op)
        if option is not None:
            Option._of(option)  # TypeError for anything but a vknorm.Option
        self.option = Option() if option is None else option
        where = f"{type(self).__name__}: "
        if device is not None:
            d = _parse_device(device, where)  # ValueError now, not at the first forward
            if isinstance(d, int) and _vulkan_available() and d >= (count := len(_core.devices())):
                raise ValueError(f"{where}device index {d} out of range ({count} devices)")
        self.device = device
        params = {}
        for pid, name, _ in self._params:
            v = values[name]
            if name == "affine" and not (isinstance(v, (bool, np.bool_)) or v in (0, 1)):
                raise ValueError(f"{where}affine must be True/False (or 1/0), got {v!r}")
            params[pid] = (_param_float(pid, v, where, name) if name == "eps" else int(bool(v)) if name == "affine"
                           else _param_int(pid, v, where, name))
        self.load_param(params)

    @classmethod
    def from_param(cls, params: Mapping[int, Union[int, float]], **kwargs):
        """ncnn ParamDict ids, as in the layer's .param line (see the class docstring)."""
        _check_params(params, f"{cls.__name__}.from_param")
        known = {pid for pid, _, _ in cls._params}
        unknown = set(params) - known
        if unknown:
            names = ", ".join(f"{pid} {name}" for pid, name, _ in cls._params)
            raise ValueError(f"unknown param ids {sorted(int(k) for k in unknown)}: {cls.__name__} takes {names}")
        values: Dict[str, Any] = {name: params.get(pid, default) for pid, name, default in cls._params}
        for pid, name, _ in cls._params:
            if name != "eps":
                values[name] = _param_int(pid, values[name], f"{cls.__name__}.from_param: ", name)
            if name == "affine":  # as ncnn reads it (and the in-graph layer): weights unless 0
                values[name] = values[name] != 0
        return cls(**values, **kwargs)

    # ncnn's parameters, read-only: load_param / the constructor set them.
    affine_size = property(lambda self: self._layer.affine_size)
    eps = property(lambda self: self._layer.eps)
    affine = property(lambda self: bool(self._layer.affine))

    def load_param(self, params: Mapping[int, Union[int, float]]) -> None:
        """ncnn ParamDict ids, as from_param takes them; ids not given take ncnn's defaults. An id this layer does
        not take is refused (a fused activation's ids belong to vknorm.graph's layers: here, set_activation)."""
        # eps is checked in the core, after affine_size, in load_param's order (a NaN or Inf eps included)
        where = f"{type(self).__name__}.load_param: "
        _check_params(params, where[:-2])
        names = {pid: name for pid, name, _ in self._params}
        native = {}
        for k, v in params.items():
            pid = _param_int("id", k, where)
            if pid not in names:
                takes = ", ".join(f"{i} {n}" for i, n, _ in self._params)
                raise ValueError(f"{where}unknown param id {pid}: {type(self).__name__} takes {takes}"
                                 + (" (a fused activation: set_activation)" if pid in (9, 10)
                                    else " (a fused residual add: forward_add)" if pid == 20 else ""))
            name = names.get(pid, "")
            native[pid] = _param_float(pid, v, where, name) if name == "eps" else _param_int(pid, v, where, name)
        self._layer.load_param(native)

    _weight_count_name = "affine_size"

    def _weights(self, v, name: str) -> np.ndarray:
        where = f"{type(self).__name__}.load_model: "
        a = np.asarray(v)
        if a.dtype.kind not in "fiu":
            raise TypeError(f"{where}{name} must be numeric, got dtype {a.dtype}")
        if a.ndim != 1:
            n = getattr(self, self._weight_count_name)
            raise ValueError(f"{where}{name} must be 1-D of length {self._weight_count_name}={n}, got shape {a.shape}")
        with np.errstate(over="ignore"):
            w = a.astype(np.float32)
        past = np.isfinite(a) & ~np.isfinite(w)
        if past.any():  # said as given, not as the inf it would become
            i = int(np.argmax(past))
            raise ValueError(f"{where}{name}[{i}]={a[i].item()!r} does not fit float32 (weights are float32, as in ncnn)")
        return np.ascontiguousarray(w)

    @property
    def gamma(self) -> np.ndarray:
        return np.asarray(self._layer.gamma_data, dtype=np.float32)

    @property
    def last_dispatch(self) -> dict:
        """What the last Vulkan forward ran: path, dispatches, workgroup size, gpu_us."""
        return self._layer.last_dispatch

    @property
    def gpu_time_us(self) -> float:
        return self._layer.last_dispatch["gpu_us"]

    def _native_option(self, option: Optional[Option]) -> _core.Option:
        """The call's option, else the layer's (TypeError for anything but a vknorm.Option)."""
        return Option._of(self.option if option is None else option)

    def _vkmat_option(self, mats, device, option: Optional[Option], where: str) -> _core.Option:
        """The native option of a call on VkMats, once device= (the call's, else the layer's) is found to name
        their device. A VkMat runs where it lives: the layer moves there (weights uploaded again) if it was on
        another device, as a numpy call moves it to the call's device. One layer shared by threads that run it
        on different devices at once may find itself moved before its forward (ValueError naming the contexts):
        give each device a layer of its own."""
        _check_vkmat_device(self.device if device is None else device, mats, where)
        opt = self._native_option(option)
        ctx = mats[0].context
        if all(v.context is ctx for v in mats) and self._layer.context is not ctx:  # else the forward says they differ
            self._layer.create_pipeline(ctx, opt)
        return opt

    def create_pipeline(self, option: Optional[Option] = None, device=None) -> None:
        device = device if device is not None else self.device
        ctx = _context_for("vulkan" if device is None else device, f"{type(self).__name__}.create_pipeline: ")
        if ctx is None:
            return
        self._layer.create_pipeline(ctx, self._native_option(option))

    def groups(self, shape) -> dict:
        """How an input of this shape splits into groups (ncnn's rules): group_size (elements of one
        group), groups, and planes (channel planes one group spans)."""
        dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in dims):
            raise TypeError(f"shape must be integers, got {shape!r}")
        return self._layer.group_layout([int(v) for v in dims])

    # The types, for type checkers: a VkMat in, a VkMat out; anything else (numpy, an ncnn Mat) gives numpy.
    @overload
    def __call__(  # type: ignore[overload-overlap]  # a VkMat is an object too: the first that matches wins
            self, x: _core.VkMat, device=None, option: Optional[Option] = None) -> _core.VkMat: ...
    @overload
    def __call__(self, x: object, device=None, option: Optional[Option] = None) -> np.ndarray: ...

    def __call__(self, x, device=None, option: Optional[Option] = None):
        """Normalize x into a new array (x is only read); returns float32 (float16 for float16 input). A VkMat
        gives a new VkMat on its device, as ncnn's Layer::forward (device=, if given, must name that device)."""
        return self._forward(x, device, option, f"{type(self).__name__}()")

    @overload
    def forward(  # type: ignore[overload-overlap]
            self, x: _core.VkMat, device=None, option: Optional[Option] = None) -> _core.VkMat: ...
    @overload
    def forward(self, x: object, device=None, option: Optional[Option] = None) -> np.ndarray: ...

    def forward(self, x, device=None, option: Optional[Option] = None):
        return self._forward(x, device, option, f"{type(self).__name__}.forward")

    def _forward(self, x, device, option: Optional[Option], where: str):
        device = self.device if device is None else device  # the call's, else the layer's
        if isinstance(x, _core.VkMat):
            return self._layer.forward(x, self._vkmat_option((x,), device, option, where))
        a = _check_array(x, where)
        ctx = _context_for(device, f"{where}: ")
        if ctx is None:  # ncnn's CPU algorithm, on a Mat of its own
            mat = _core.Mat.from_numpy(_as_input(a))
            self._layer.forward_inplace_cpu(mat)
        else:  # x is read where it lies (after a cast, if it needs one) into the memory the device reads
            opt = self._native_option(option)
            self._layer.create_pipeline(ctx, opt)
            mat = self._layer.forward_numpy(_as_input(a), opt)
        return mat.numpy(copy=False).reshape(a.shape)  # the Mat is this call's own: no copy of it

    def forward_inplace(self, x: _InPlace, device=None, option: Optional[Option] = None) -> _InPlace:
        """In place on a writable numpy array, or on a VkMat (no host round trip). A VkMat runs on the device it
        lives on: device=, if given, must name that device (ValueError otherwise)."""
        where = f"{type(self).__name__}.forward_inplace"
        if isinstance(x, _core.VkMat):
            self._layer.forward_inplace(x, self._vkmat_option((x,), device, option, where))
            return x
        if isinstance(x, _core.Mat):
            raise TypeError(f"{where} needs a numpy array or a VkMat, got a Mat: {_MAT_ADVICE}")
        if _ncnn_mat_kind(x):  # in place through numpy's writable view of its memory
            self.forward_inplace(_ncnn_mat_array(x, where), device, option)
            return x
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{where} needs a numpy array or a VkMat, got {type(x).__name__}")
        a = _check_array(x, where)
        if not a.flags.writeable:
            raise ValueError(f"{where} needs a writable array (this one is read-only: call the layer for a new one)")
        y = self._forward(a, device, option, where)
        np.copyto(a, y, casting="unsafe")
        return cast(_InPlace, a)  # x itself (a writable array passes through _check_array as it is)

    # Fusion: ncnn's activation layers applied as the output is stored (ncnn's CPU formulas).
    ACTIVATIONS = {"none": 0, "relu": 1, "leakyrelu": 2, "sigmoid": 4, "swish": 7, "gelu": 8, "gelu_fast": 9}

    def set_activation(self, activation: Optional[str] = None, alpha: float = 0.0) -> None:
        """Apply an activation to every output of this layer, in the same kernel: "relu" (alpha: its slope for
        negative inputs, as ncnn's ReLU 0=slope; 0 by default), "leakyrelu" (alpha: its slope), "sigmoid", "swish"
        (x * sigmoid(x)), "gelu" (erf form), "gelu_fast" (tanh form), or None. Only the ReLUs take an alpha."""
        where = f"{type(self).__name__}.set_activation: "
        name = "none" if activation is None else str(activation).lower()
        if name not in self.ACTIVATIONS:
            raise ValueError(f"{where}activation {activation!r}: expected one of {', '.join(self.ACTIVATIONS)} or None")
        if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, numbers.Real) or not _fits_float32(alpha):
            # the kernel's slope is float32: 1e39 would be inf
            raise ValueError(f"{where}alpha must be a finite number within float32's range, got {alpha!r}")
        if alpha and name not in ("relu", "leakyrelu"):
            raise ValueError(f"{where}{name} takes no alpha (got {alpha!r}); only relu and leakyrelu have a slope")
        if name == "relu" and alpha:  # ncnn's ReLU with a slope is the leaky one
            name = "leakyrelu"
        self._layer.set_activation(self.ACTIVATIONS[name], float(alpha))

    @property
    def activation(self) -> str:
        return _core.activation_name(self._layer.activation_type)

    @overload
    def forward_add(  # type: ignore[overload-overlap]
            self, x: _core.VkMat, residual: _core.VkMat, return_sum: Literal[False] = False, device=None,
            option: Optional[Option] = None) -> _core.VkMat: ...
    @overload
    def forward_add(  # type: ignore[overload-overlap]
            self, x: _core.VkMat, residual: _core.VkMat, return_sum: Literal[True], device=None,
            option: Optional[Option] = None) -> Tuple[_core.VkMat, _core.VkMat]: ...
    @overload
    def forward_add(self, x: object, residual: object, return_sum: Literal[False] = False, device=None,
                    option: Optional[Option] = None) -> np.ndarray: ...
    @overload
    def forward_add(self, x: object, residual: object, return_sum: Literal[True], device=None,
                    option: Optional[Option] = None) -> Tuple[np.ndarray, np.ndarray]: ...
    @overload  # return_sum known only at run time
    def forward_add(self, x: object, residual: object, return_sum: bool, device=None,
                    option: Optional[Option] = None) -> Union[np.ndarray, _core.VkMat, Tuple[np.ndarray, np.ndarray],
                                                               Tuple[_core.VkMat, _core.VkMat]]: ...

    def forward_add(self, x, residual, return_sum: bool = False, device=None, option: Optional[Option] = None):
        """A residual add and this layer in one kernel: returns the activated norm of x + residual (and
        x + residual itself with return_sum=True) without writing x or residual. numpy arrays (read where
        they lie, one submission, results as float32, or float16 for float16 x) or VkMats (results stay on the
        device). x and residual must have one shape (a broadcasting add is not fused), each within one storage
        buffer binding of the device (the fused add runs in one piece, where the layer alone takes larger tensors
        in pieces: a ValueError says so). VkMats run on the device they live on: device=, if given, must name that
        device (ValueError otherwise)."""
        where = f"{type(self).__name__}.forward_add"
        if not isinstance(return_sum, (bool, np.bool_)):
            raise TypeError(f"{where}: return_sum must be True or False, got {return_sum!r}")
        return_sum = bool(return_sum)
        device = self.device if device is None else device  # the call's, else the layer's
        opt = self._native_option(option)
        if isinstance(x, _core.VkMat) or isinstance(residual, _core.VkMat):
            if not (isinstance(x, _core.VkMat) and isinstance(residual, _core.VkMat)):
                raise TypeError(f"{where}: x and residual must both be VkMats or both numpy arrays")
            vk_opt = self._vkmat_option((x, residual), device, option, where)
            y, s = self._layer.forward_add(x, residual, return_sum, vk_opt)
            return (y, s) if return_sum else y
        a, r = _check_array(x, where), _check_array(residual, where)
        if a.shape != r.shape:
            raise ValueError(f"{where}: x {a.shape} and residual {r.shape} differ in shape (no broadcasting)")
        ctx = _context_for(device, f"{where}: ")
        if ctx is None:  # ncnn's CPU layers: the add in float32, then the norm; float16 input gets float16 back
            s = _as_input(a, np.float32) + _as_input(r, np.float32)
            y = self(s, device="cpu")
            if _is_float16(a):
                with np.errstate(over="ignore"):  # a sum past float16's range is +-Inf, as the Vulkan path gives it
                    y, s = y.astype(np.float16), s.astype(np.float16)
            return (y, s) if return_sum else y
        self._layer.create_pipeline(ctx, opt)
        # One submission; both arrays read where they lie (x of one float type and residual of another: both
        # as float32, the result in x's type).
        same = _is_float16(a) == _is_float16(r)
        xa, ra = (_as_input(a), _as_input(r)) if same else (_as_input(a, np.float32), _as_input(r, np.float32))
        normed, total = self._layer.forward_add_numpy(xa, ra, return_sum, opt)
        like = np.float16 if _is_float16(a) else np.float32

        def back(m):
            return m.numpy(copy=False).astype(like, copy=False).reshape(a.shape)

        return (back(normed), back(total)) if return_sum else back(normed)

    def __copy__(self):
        # A shallow copy would share the native layer (its weights, activation and pipelines) with this one.
        raise TypeError(f"{type(self).__name__} cannot be copied: make another with from_param() and load_model()")

    def __deepcopy__(self, memo):
        return self.__copy__()

    def __reduce_ex__(self, protocol):
        raise TypeError(f"{type(self).__name__} cannot be pickled: save its params (ncnn's .param) and weights (gamma, "
                        "beta), and make it again with from_param() and load_model()")

    def __repr__(self) -> str:
        args = ", ".join(f"{name}={getattr(self, name):g}" if name == "eps" else f"{name}={getattr(self, name)}"
                         for _, name, _ in self._params)
        return f"{type(self).__name__}({args})"


class _GammaBetaNorm(_Norm):
    """Norms that take gamma and beta (all but RMSNorm), each of affine_size or channels values."""

    def load_model(self, gamma=None, beta=None) -> None:
        """gamma and beta (nothing when affine=False)."""
        if not self.affine:
            if gamma is not None or beta is not None:
                raise ValueError(f"{type(self).__name__}.load_model: affine=False: this layer takes no weights")
            return
        if gamma is None or beta is None:
            raise ValueError(f"{type(self).__name__} with affine=True needs gamma and beta")
        self._layer.load_model(self._weights(gamma, "gamma"), self._weights(beta, "beta"))

    @property
    def beta(self) -> np.ndarray:
        return np.asarray(self._layer.beta_data, dtype=np.float32)


class LayerNorm(_GammaBetaNorm):
    """ncnn's LayerNorm: y = (x - mean) / sqrt(var + eps) * gamma + beta over each group; gamma and beta
    of affine_size values.

    ncnn params: 0 affine_size (0), 1 eps (0.001), 2 affine (1). Groups as ncnn's: the whole (w) input, each
    row of (h, w); for (c, h, w) each row where affine_size is w, else each channel's h * w; for (c, d, h, w) each
    row, each h * w, or each channel's d * h * w, whichever affine_size is (``groups(shape)`` says).
    """

    _op = "LayerNorm"


class RMSNorm(_Norm):
    """ncnn's RMSNorm: y = x / sqrt(mean(x^2) + eps) * gamma over each group.

    ncnn params: 0 affine_size (0), 1 eps (0.001), 2 affine (1); groups as LayerNorm's.
    """

    _op = "RMSNorm"

    def load_model(self, gamma=None) -> None:
        """gamma of affine_size values (nothing when affine=False)."""
        if not self.affine:
            if gamma is not None:
                raise ValueError(f"{type(self).__name__}.load_model: affine=False: this layer takes no weights")
            return
        if gamma is None:
            raise ValueError("RMSNorm with affine=True needs gamma")
        self._layer.load_model(self._weights(gamma, "gamma"))


class _ChannelNorm(_GammaBetaNorm):
    """Shared by GroupNorm and InstanceNorm: gamma and beta per channel."""

    _weight_count_name = "channels"
    channels = property(lambda self: self._layer.channels)


class GroupNorm(_ChannelNorm):
    """ncnn's GroupNorm: channels split into `group` groups of channels / group channels; each group is
    normalized over all its elements, then y * gamma[c] + beta[c] per channel.

    ncnn params: 0 group (1), 1 channels (0), 2 eps (0.001), 3 affine (1). Channels are w for a (w)
    input, rows for (h, w), c for (c, h, w) and (c, d, h, w). The defaults are ncnn's ParamDict's: with
    affine on (the default) `channels` must be given (a gamma and beta per channel), else ValueError.
    """

    _op = "GroupNorm"
    _params = ((0, "group", 1), (1, "channels", 0), (2, "eps", 0.001), (3, "affine", 1))
    group = property(lambda self: self._layer.group)

    def __init__(self, group: int = 1, channels: int = 0, eps: float = 0.001, affine: bool = True, *,
                 option: Optional[Option] = None, device=None):
        self._setup({"group": group, "channels": channels, "eps": eps, "affine": affine}, option, device)


class InstanceNorm(_ChannelNorm):
    """ncnn's InstanceNorm: each channel plane normalized on its own, y = (x - mean) / sqrt(var + eps) * gamma[c]
    + beta[c]. ncnn's CPU layer (and ``device="cpu"``, which follows it) computes x * a + b with a = gamma[c] /
    sqrt(var + eps), b = beta[c] - mean * a; the Vulkan kernels scale by gamma after normalizing, so a gamma past
    float32's range after it gives float64's values where ncnn's a overflows and gives NaN (README).

    ncnn params: 0 channels (0), 1 eps (0.001), 2 affine (1). A (w) or (h, w) input is one channel, as
    in ncnn's CPU layer: a layer of more channels refuses it (ValueError), where ncnn would normalize the whole
    blob with the first channel's weights. With affine on (the default) `channels` must be given.
    """

    _op = "InstanceNorm"
    _params = ((0, "channels", 0), (1, "eps", 0.001), (2, "affine", 1))

    def __init__(self, channels: int = 0, eps: float = 0.001, affine: bool = True, *,
                 option: Optional[Option] = None, device=None):
        self._setup({"channels": channels, "eps": eps, "affine": affine}, option, device)

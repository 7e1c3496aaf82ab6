"""Run ncnn models with vknorm's LayerNorm, RMSNorm, GroupNorm and InstanceNorm: pyncnn's custom-layer
override.

    import ncnn, vknorm, vknorm.ncnn
    net = ncnn.Net()
    reg = vknorm.ncnn.register(net, option=vknorm.Option(use_fp16_storage=True))
    net.load_param("model.ncnn.param")      # ncnn parses the params ...
    net.load_model("model.ncnn.bin")        # ... and hands each layer its weights
    # extract as usual: the norms run on vknorm's Vulkan operator, the rest stays ncnn's
    for layer in reg.layers:                # per-layer record of the last forward
        print(layer.name, layer.type, layer.last_shape, layer.last_gpu_us)

How it plugs in: ``register`` calls ``net.register_custom_layer(type, creator, destroyer)`` for
"LayerNorm", "RMSNorm", "GroupNorm" and "InstanceNorm" before ``load_param``; that overrides ncnn's
built-in types for this net only. ncnn then creates our layer for every such line of the .param, gives
it its ParamDict (LayerNorm/RMSNorm 0 affine_size, 1 eps, 2 affine; GroupNorm 0 group, 1 channels,
2 eps, 3 affine; InstanceNorm 0 channels, 1 eps, 2 affine) and its weights (gamma, then beta for all but
RMSNorm: affine_size or channels floats each), and calls ``forward_inplace`` on an unpacked float32
blob, which we normalize on Vulkan.

pyncnn's factory table: pyncnn turns each Python (creator, destroyer) pair into a C function ncnn can
call. Older pyncnn kept a fixed table of 10 such slots per process and raised "python version only
support 10 custom layers now" once they were used up; the pinned pyncnn (1.0.20261020) keeps the pair
with the net and frees it with the net (checked: 300 nets in one process, 14 alive at once, each with
its own creator; the creator's refcount drops back when the net dies). ``register`` therefore makes
one registration per type per net, whose callables (bound methods of the returned ``Registration``)
hold no reference to the net — no cycle, so nets are freed normally — and, should a pyncnn with the
old fixed table run out, raises ``FactoryLimitError`` (a RuntimeError with an explanation), never a
crash. Python exceptions must not cross into ncnn's C++ (it is built without them), so every callback
catches everything, records it on the layer (``layer.error``; ``Registration.errors()`` keeps it after ncnn
destroys the layer, as a failed load_param does) and returns an ncnn error code; and ncnn calls each through
vknorm's C++ (``_core.call_from_cpp``), which drops what Python raises before the callback's own ``try`` (a
KeyboardInterrupt on entering it). Ctrl-C caught so is given back to the main thread: the extract returns -1 and
the interrupt surfaces in the caller's code.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from typing import TYPE_CHECKING, Dict, List, Optional, Type, Union, cast

import ncnn as _ncnn  # type: ignore[import-untyped, import-not-found]  # pyncnn (absolute import): no stubs
import numpy as np

from . import _core
from .layers import GroupNorm, InstanceNorm, LayerNorm, Option, RMSNorm, _context_for

if TYPE_CHECKING:  # for annotations only
    from .layers import _Norm

    _AnyNorm = Union[LayerNorm, RMSNorm, GroupNorm, InstanceNorm]  # a layer's norm: one of TYPES

__all__ = ["register", "layers", "Registration", "VknormLayer", "FactoryLimitError", "TYPES"]

TYPES: Dict[str, Type[_Norm]] = {"LayerNorm": LayerNorm, "RMSNorm": RMSNorm, "GroupNorm": GroupNorm,
                                 "InstanceNorm": InstanceNorm}


class FactoryLimitError(RuntimeError):
    """pyncnn has no custom-layer factory left in this process (older pyncnn: 10 per process)."""


from ._stdio import quiet_stderr  # noqa: E402  (re-exported: check.py uses it from here)


def _call_weakly(method: weakref.WeakMethod, *args) -> int:
    bound = method()
    return -1 if bound is None else bound(*args)


# The methods pyncnn calls from ncnn's C++
_CALLED_FROM_CPP = ("load_param", "load_model", "create_pipeline", "destroy_pipeline", "forward_inplace")


class VknormLayer(_ncnn.Layer):
    """An ncnn layer (LayerNorm, RMSNorm, GroupNorm or InstanceNorm) whose forward runs vknorm's Vulkan
    operator.

    After each forward: ``last_shape`` (numpy order), ``last_gpu_us`` (GPU time of the dispatch, from
    Vulkan timestamps), ``last_dispatch`` (vknorm's dispatch record), ``calls``. ``norm`` is the
    vknorm layer built from ncnn's params; ``error`` holds the exception of a failed callback (type and message;
    its traceback is dropped).
    """

    def __init__(self, op: str, option: Option, device=None):
        super().__init__()
        self.one_blob_only = True
        self.support_inplace = True
        self.op = op
        self.option = option
        self.device = device
        self.norm: Optional[_AnyNorm] = None  # load_param makes it
        self.error: Optional[BaseException] = None
        self.last_shape: Optional[tuple] = None
        self.last_gpu_us: Optional[float] = None
        self.last_dispatch: Optional[dict] = None
        self.calls = 0
        # Each through _core.call_from_cpp, which lets no exception reach ncnn's C++ (a KeyboardInterrupt raised on
        # entering the method, before its try); weakly, so that the layer holds no cycle through itself.
        for name in _CALLED_FROM_CPP:
            method = weakref.WeakMethod(getattr(self, name))
            setattr(self, name, functools.partial(_core.call_from_cpp, _call_weakly, method))

    def _fail(self, e: BaseException, code: int = -1) -> int:
        """Keep the exception and say it on stderr in one line, as ncnn's own layers log theirs: ncnn itself
        only reports the failing return code. The exception is kept without its traceback: the traceback's frames
        hold this layer, which pyncnn holds from C++, and the cycle would outlive the interpreter (nanobind then
        reports leaked instances at exit)."""
        todo: List[Optional[BaseException]]  # a cause or context may be None
        seen, todo = set(), [e]
        while todo:  # the chained ones too (raise ... from, raised while handling another)
            x = todo.pop()
            if x is not None and id(x) not in seen:
                seen.add(id(x))
                x.__traceback__ = None
                todo += [x.__cause__, x.__context__]
        self.error = e
        if isinstance(e, KeyboardInterrupt):
            # Ctrl-C, landed in this callback: the -1 alone would leave the user's extract loop running.
            # _core.call_from_cpp gives it back to the main thread, where it stops the loop as Ctrl-C does.
            print(f"vknorm {self.type or self.op} {self.name}: interrupted", file=sys.stderr)
            raise KeyboardInterrupt from None  # not e: raised again, it would take a traceback holding this layer
        print(f"vknorm {self.type or self.op} {self.name}: {e}", file=sys.stderr)
        return code

    def load_param(self, pd) -> int:
        try:
            cls = TYPES[self.op]
            params = {pid: (float(pd.get(pid, float(default))) if name == "eps" else int(pd.get(pid, int(default))))
                      for pid, name, default in cls._params}
            self.norm = cls.from_param(params, option=self.option, device=self.device)
            return 0
        except BaseException as e:  # noqa: BLE001 - must not reach ncnn's C++
            return self._fail(e)

    def load_model(self, mb) -> int:
        try:
            n = cast("_AnyNorm", self.norm)  # ncnn keeps only layers whose load_param succeeded: set
            if not n.affine:
                return 0
            weights = []
            name = n._weight_count_name
            count = getattr(n, name)
            if count <= 0:  # ncnn reads a float such as 0=8.0 as an int param not given: 0
                return self._fail(ValueError(f"affine with {name} {count}: no weights to read (an int param "
                                             "written as a float, 0=8.0, reads as 0 in ncnn)"), -100)
            for what in (("gamma",) if self.op == "RMSNorm" else ("gamma", "beta")):
                m = mb.load(count, 1)
                if m.empty():  # short read (truncated .bin): ncnn's own answer
                    return self._fail(ValueError(f"could not read {what} ({count} floats) from the .bin"), -100)
                weights.append(np.array(m, dtype=np.float32).reshape(-1).copy())
            n.load_model(*weights)
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail(e)

    def create_pipeline(self, opt) -> int:
        try:
            cast("_AnyNorm", self.norm).create_pipeline(self.option, self.device)  # set (see load_model)
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail(e)

    def destroy_pipeline(self, opt) -> int:
        return 0

    def forward_inplace(self, bottom_top_blob, opt) -> int:
        try:
            a = np.asarray(bottom_top_blob)  # a writable view of the blob (unpacked, float32)
            norm = cast("_AnyNorm", self.norm)  # set (see load_model)
            norm.forward_inplace(a, device="vulkan" if self.device is None else self.device, option=self.option)
            self.last_shape = tuple(int(s) for s in a.shape)
            self.last_dispatch = dict(norm.last_dispatch)
            self.last_gpu_us = float(self.last_dispatch.get("gpu_us", 0.0))
            self.calls += 1
            return 0
        except BaseException as e:  # noqa: BLE001
            return self._fail(e)

    def record(self) -> dict:
        """name, type, shape, gpu_us (last forward) and the group split of that shape."""
        r = {"name": self.name, "type": self.type or self.op,
             "shape": list(self.last_shape) if self.last_shape else None, "gpu_us": self.last_gpu_us}
        if self.last_shape and self.norm is not None:
            g = self.norm.groups(self.last_shape)
            r.update(group_size=int(g["group_size"]), groups=int(g["groups"]))
        return r

    def __repr__(self) -> str:
        return f"VknormLayer({self.type or self.op} {self.name!r}, {self.norm!r})"


class Registration:
    """What ``register`` set up on one net: its option and the vknorm layers ncnn created (in .param order).

    Holds no reference to the net (pyncnn keeps our creator/destroyer with the net; a back reference
    would make a cycle the garbage collector cannot see through C++).
    """

    def __init__(self, option: Option, device=None, types=tuple(TYPES)):
        self.option = option
        self.device = device
        self.types = tuple(types)
        self.layers: List[VknormLayer] = []
        # (name, exception) of layers ncnn destroyed with an error on them: a load_param that fails destroys every
        # layer it made, the failing one too. Kept until the next load makes layers again.
        self._destroyed_errors: List[tuple] = []

    # pyncnn calls these from ncnn's load_param / clear; they must not raise.
    def _create(self, op: str):
        if not self.layers:  # a load starts
            self._destroyed_errors.clear()
        layer = VknormLayer(op, self.option, self.device)
        self.layers.append(layer)  # keeps the Python object (and its C++ layer) alive until destroyed
        return layer

    def _create_layernorm(self):
        return self._create("LayerNorm")

    def _create_rmsnorm(self):
        return self._create("RMSNorm")

    def _create_groupnorm(self):
        return self._create("GroupNorm")

    def _create_instancenorm(self):
        return self._create("InstanceNorm")

    def _destroy(self, layer) -> None:
        for i, mine in enumerate(self.layers):
            if mine is layer:
                if mine.error is not None:
                    self._destroyed_errors.append((mine.name, mine.error))
                del self.layers[i]
                break

    def by_name(self, name: str) -> Optional[VknormLayer]:
        return next((layer for layer in self.layers if layer.name == name), None)

    def records(self) -> list:
        return [layer.record() for layer in self.layers]

    def errors(self) -> list:
        """(name, exception) of each vknorm layer whose callback failed, those ncnn has since destroyed included (a
        failed load_param destroys every layer: its error stays here until the next load)."""
        return self._destroyed_errors + [(layer.name, layer.error) for layer in self.layers if layer.error is not None]

    def __repr__(self) -> str:
        return f"Registration({len(self.layers)} vknorm layers, {self.option!r})"


def register(net, option: Optional[Option] = None, *, device=None, types=tuple(TYPES),
             quiet: bool = True) -> Registration:
    """Make ``net`` (a pyncnn ``ncnn.Net``) run its LayerNorm / RMSNorm / GroupNorm / InstanceNorm layers
    on vknorm's Vulkan operator.

    Call before ``net.load_param``. ``option``: the vknorm.Option for every such layer (e.g.
    ``Option(use_fp16_storage=True)``). ``device``: None (the default Vulkan device), "vulkan:N", an index
    or a Context. ``types``: which of "LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm" to take over. ``quiet`` hides ncnn's
    "overwrite built-in layer type" notice. Returns the Registration (its ``layers`` fill in at load_param).
    Raises VulkanUnavailableError without a Vulkan device, FactoryLimitError when pyncnn has no custom-layer
    factory left.
    """
    if not isinstance(net, _ncnn.Net):
        raise TypeError(f"register needs an ncnn.Net (pyncnn), got {type(net).__name__}")
    if len(net.layers()):  # its layers were made at load_param: registering now would change none of them
        raise RuntimeError("register(net) after net.load_param: the net's layers are made already, stock; call "
                           "register before load_param (or net.clear() first)")
    if isinstance(types, str):  # one type by name
        types = (types,)
    unknown = [t for t in types if t not in TYPES]
    if unknown or not types:
        raise ValueError(f"types must be among {', '.join(TYPES)}, got {list(types)!r}")
    if option is not None and not isinstance(option, Option):
        raise TypeError(f"option must be a vknorm.Option, got {type(option).__name__}")
    # A bad or missing device raises here (ValueError, VulkanUnavailableError) rather than inside ncnn's load_param.
    _context_for("vulkan" if device is None else device, "register: ")
    reg = Registration(option or Option(), device, types)
    creators = {"LayerNorm": reg._create_layernorm, "RMSNorm": reg._create_rmsnorm,
                "GroupNorm": reg._create_groupnorm, "InstanceNorm": reg._create_instancenorm}
    lines: list = []
    for t in types:
        try:
            with (quiet_stderr(lines) if quiet else contextlib.nullcontext()):
                ret = net.register_custom_layer(t, creators[t], reg._destroy)
        except RuntimeError as e:
            if "custom layer" in str(e):
                raise FactoryLimitError(
                    f"pyncnn refused another custom layer ({e}): this pyncnn keeps a fixed per-process table "
                    "of custom-layer factories (ncnn 1.0.20261020 has no such limit); upgrade pyncnn or "
                    "register on fewer nets per process") from e
            raise
        if ret != 0:
            raise RuntimeError(f"ncnn register_custom_layer({t!r}) returned {ret}")
    return reg


def layers(net) -> List[VknormLayer]:
    """The vknorm layers of a loaded net, in .param order (found through ``net.layers()``)."""
    return [layer for layer in net.layers() if isinstance(layer, VknormLayer)]

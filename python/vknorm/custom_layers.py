"""``--custom-layers FILE.py`` of ``vknorm check`` and ``vknorm bench --model``: a model with layer types of its own
(pyncnn's custom Python layers, such as YOLOv5's Focus) runs in every net the command makes.

FILE.py defines ``register(ncnn, net)``, called for each net before the model loads, with that net's module: pyncnn
(check's default engine, bench's vknorm-host) or vknorm.graph (every other run). The two take the same layer code::

    def register(ncnn, net):
        class Focus(ncnn.Layer):
            ...
        net.register_custom_layer("YoloV5Focus", Focus)

A pyncnn net holds no layer it made (one nothing else holds is collected, and pyncnn crashes): ``register`` keeps
them there, in a list that lives as long as the net (vknorm.graph's nets hold their own).
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import traceback
from typing import Any, Callable, Iterator, Optional

from .cli import UsageError, one_line

# The command's FILE.py and its register (one command per process: the CLI sets them, its forked child inherits them)
_path: Optional[str] = None
_register: Optional[Callable[[Any, Any], Any]] = None


def use(path: Optional[str]) -> None:
    """Loads FILE.py for this command's nets (None: no custom layers). UsageError where it cannot be read, does not
    import, or defines no register(ncnn, net)."""
    global _path, _register
    _path, _register = None, None
    if path is None:
        return
    flag = f"--custom-layers {path}"
    if not path.endswith(".py"):
        raise UsageError(f"{flag}: a Python file (FILE.py) defining register(ncnn, net)")
    if not os.path.isfile(path):
        raise UsageError(f"{flag}: no such file")
    spec = importlib.util.spec_from_file_location("vknorm_custom_layers", path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{flag}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its classes' pickling and dataclasses look themselves up there
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file: whatever it raises, said in one line
        del sys.modules[spec.name]
        raise UsageError(f"{flag}: importing it raised {type(e).__name__}: {one_line(e)}") from None
    register = getattr(module, "register", None)
    if not callable(register):
        raise UsageError(f"{flag}: defines no register(ncnn, net) (called for each net the command makes, with that "
                         "net's module, pyncnn or vknorm.graph)")
    _path, _register = path, register


def used() -> Optional[str]:
    """The command's FILE.py, or None."""
    return _path


def apply(ncnn: Any, net: Any) -> None:
    """register(ncnn, net) of the command's FILE.py, if any, on a net before its model loads."""
    if _register is None:
        return
    from ._stdio import quiet_stderr

    try:
        with quiet_stderr():  # ncnn says "overwrite built-in layer type ..." where a type takes over one of its own
            _register(ncnn, net)
    except Exception as e:  # noqa: BLE001 - the user's code: whatever it raises, said in one line
        module = getattr(ncnn, "__name__", "ncnn")
        raise UsageError(f"--custom-layers {_path}: register({module}, net) raised {type(e).__name__}: "
                         f"{one_line(e)}") from None


@contextlib.contextmanager
def layer_errors() -> Iterator[None]:
    """What the command's custom layers raise as they load or run (inside ncnn's load or extract) as a UsageError
    naming FILE.py's line: the model's own code failed, not the command. Anything else passes through."""
    try:
        yield
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - re-raised unless FILE.py's code raised it
        mine = os.path.abspath(_path) if _path is not None else None
        at = [f for f in traceback.extract_tb(e.__traceback__) if mine and os.path.abspath(f.filename) == mine]
        if not at:
            raise
        raise UsageError(f"--custom-layers {_path}: line {at[-1].lineno} ({at[-1].name}) raised "
                         f"{type(e).__name__}: {one_line(e)}") from None

"""``--custom-layers FILE.py`` of ``vknorm check``, ``vknorm bench --model`` and ``vknorm optimize``: a model with layer
types of its own (pyncnn's custom Python layers, such as YOLOv5's Focus) runs in every net the command makes (optimize:
the one that loads the fused model to check it).

FILE.py defines ``register(ncnn, net)``, called for each net before the model loads, with that net's module: pyncnn
(check's default engine, bench's vknorm-host) or vknorm.graph (every other run, and check's look at a GroupNorm's or
InstanceNorm's channels first). The two take the same layer code, written against the ``ncnn`` given::

    KEPT = []  # pyncnn's nets hold no layer they made (one nothing else holds is collected, and pyncnn crashes)

    def register(ncnn, net):
        class Focus(ncnn.Layer):
            ...
        def make():
            KEPT.append(Focus())
            return KEPT[-1]
        net.register_custom_layer("YoloV5Focus", make)

FILE.py is imported where the model runs (check's and bench's worker process, optimize's own). What it or its
layers raise, a layer's return value pyncnn or vknorm.graph cannot take, and anything the commands' own code would
blame on the model are said in one line naming FILE.py (and the line of the layer code that raised). Its prints go
to stderr, not into a report on stdout.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import sysconfig
import traceback
from typing import Any, Callable, Iterator, Optional

from .cli import UsageError, one_line

def help_for(nets: str, modules: str = "pyncnn or vknorm.graph") -> str:
    """The flag's --help, for the nets a command registers the layers in and the modules those nets are of."""
    both = " (write the layers against the ncnn given: the same code serves both)" if " or " in modules else ""
    return ("a model with layer types of its own (pyncnn's custom Python layers): FILE.py defines register(ncnn, "
            f"net), called for {nets} before the model loads, with that net's module, {modules}{both}; pyncnn's "
            "nets hold no layer they made: keep them (a list FILE.py holds). Imported where the model runs; its "
            "prints go to stderr; what it and its layers raise is one error line naming it")

# The command's FILE.py and its register (one command per process: the CLI sets them, its forked worker inherits
# them); _offered: the command takes the flag (check, bench --model, optimize), so its messages may suggest it.
_offered = False
_path: Optional[str] = None
_register: Optional[Callable[[Any, Any], Any]] = None


def use(path: Optional[str]) -> None:
    """The command's FILE.py (None: no custom layers), checked to be one; it is imported by load(), in the worker.
    UsageError where it cannot be."""
    global _offered, _path, _register
    _offered, _path, _register = True, None, None
    if path is None:
        return
    flag = f"--custom-layers {path}"
    if not path.endswith(".py"):
        raise UsageError(f"{flag}: a Python file (FILE.py) defining register(ncnn, net)")
    if os.path.isdir(path):
        raise UsageError(f"{flag}: is a directory")
    if not os.path.isfile(path):
        raise UsageError(f"{flag}: no such file")
    _path = path


def offered() -> bool:
    """True in a command that takes --custom-layers."""
    return _offered


def used() -> Optional[str]:
    """The command's FILE.py, or None."""
    return _path


def _said(e: BaseException) -> str:
    """An exception as 'Type: message' (the type alone where its message is empty), one line."""
    try:
        text = str(e)
    except Exception:  # noqa: BLE001 - an exception whose str() raises: its type says enough
        text = ""
    return f"{type(e).__name__}: {one_line(text)}" if text else type(e).__name__


def load() -> None:
    """Imports the command's FILE.py (once), in the process that runs the model. UsageError where it does not import
    or defines no register(ncnn, net)."""
    global _register
    if _path is None or _register is not None:
        return
    flag = f"--custom-layers {_path}"
    spec = importlib.util.spec_from_file_location("vknorm_custom_layers", _path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{flag}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its classes' pickling and dataclasses look themselves up there
    try:
        with contextlib.redirect_stdout(sys.stderr):
            spec.loader.exec_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - the user's file: whatever it raises (SystemExit too), one line
        del sys.modules[spec.name]
        raise UsageError(f"{flag}: importing it raised {_said(e)}{_where(e)}") from None
    register = getattr(module, "register", None)
    if not callable(register):
        raise UsageError(f"{flag}: defines no register(ncnn, net) (called for each net the command makes, with that "
                         "net's module, pyncnn or vknorm.graph)")
    _register = register


def apply(ncnn: Any, net: Any) -> None:
    """register(ncnn, net) of the command's FILE.py, if any, on a net before its model loads."""
    if _path is None:
        return
    load()
    assert _register is not None
    from ._stdio import process_stderr, without_ncnn_notes

    try:
        # ncnn's "overwrite built-in layer type ..." where a type takes over one of its own: not news here. The
        # prints reach the process's stderr, also where the command captures ncnn's log around the net's load.
        with process_stderr(), without_ncnn_notes("overwrite built-in layer type"), \
                contextlib.redirect_stdout(sys.stderr):
            _register(ncnn, net)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - the user's code: whatever it raises, one line
        module = getattr(ncnn, "__name__", "ncnn")
        raise UsageError(f"--custom-layers {_path}: register({module}, net) raised {_said(e)}{_where(e)}") from None


def suspect(crashed: bool = False) -> str:
    """For a message that blames the model or its --input shapes (an error code from an extract, or ncnn crashing):
    the custom layers as a cause too, where given."""
    if _path is None:
        return ""
    if crashed:
        return (f"; or a layer of --custom-layers {_path} (in pyncnn's runs: a layer nothing else holds is collected "
                "and pyncnn crashes, and an exception in a layer's destroy_pipeline ends pyncnn)")
    return f"; or a layer of --custom-layers {_path} returned it"


def _outside_python() -> tuple:
    """Where Python's own and installed code lives, and vknorm's: not the user's."""
    paths = {os.path.dirname(os.path.abspath(__file__))}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            paths.add(os.path.abspath(path))
    return tuple(p + os.sep for p in paths)


def _user_frame(e: BaseException) -> Optional[traceback.FrameSummary]:
    """The innermost frame of e's traceback in FILE.py, else in code of the user's (a module FILE.py imports)."""
    frames = traceback.extract_tb(e.__traceback__)
    mine = os.path.abspath(_path) if _path else None
    own = [f for f in frames if os.path.abspath(f.filename) == mine]
    if own:
        return own[-1]
    theirs = _outside_python()
    user = [f for f in frames
            if not f.filename.startswith("<") and not os.path.abspath(f.filename).startswith(theirs)]
    return user[-1] if user else None


def _where(e: BaseException) -> str:
    """' at line N (function)' of FILE.py, or ' at FILE:N (function)' of another of the user's files, or ''."""
    f = _user_frame(e)
    if f is None:
        return ""
    mine = _path and os.path.abspath(f.filename) == os.path.abspath(_path)
    return f" at line {f.lineno} ({f.name})" if mine else f" at {f.filename}:{f.lineno} ({f.name})"


# What vknorm.graph notes on an exception of a Python layer's code (and of what it returned); pyncnn's word for a
# layer method's return value it cannot take
_GRAPH_NOTES = ("raised in Python layer", "raised in the creator of Python layer", "raised in the destroyer of Python")
_PYNCNN_CAST = "Unable to cast Python instance"


def _blamed(e: BaseException) -> Optional[str]:
    """The one line for an exception that the command's custom layers caused, or None for any other."""
    notes = [n for n in getattr(e, "__notes__", ()) if isinstance(n, str)]
    where = _where(e)
    if where or any(n.startswith(_GRAPH_NOTES) for n in notes):
        noted = next((f" ({n})" for n in notes if n.startswith(_GRAPH_NOTES)), "")
        return f"--custom-layers {_path}: a layer raised {_said(e)}{where}{noted if not where else ''}"
    if _PYNCNN_CAST in str(e):
        return (f"--custom-layers {_path}: a layer returned what pyncnn cannot take ({_said(e)}): ncnn's layer "
                "methods return an int, 0 on success (a forward fills its top blob)")
    return None


@contextlib.contextmanager
def running() -> Iterator[None]:
    """Around a command's run of the model (in its worker): FILE.py imported, its prints sent to stderr (the report
    may be on stdout), and what its layers raise as they load or run (inside ncnn's load or extract) as a UsageError
    naming it. Anything else passes through."""
    if _path is None:
        yield
        return
    load()
    # What a layer raises where nothing can raise it (a net let go: its layers' destroy_pipeline, the destroyer) is
    # kept, not printed, and said as the command's error
    unraised: list = []
    python_hook = sys.unraisablehook

    def hook(args: Any) -> None:
        if args.exc_value is not None and _blamed(args.exc_value) is not None:
            unraised.append(args.exc_value)
        else:
            python_hook(args)

    sys.unraisablehook = hook
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    except (UsageError, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001 - re-raised unless the custom layers caused it
        blamed = _blamed(e)
        if blamed is None:
            raise
        raise UsageError(blamed) from None
    finally:
        sys.unraisablehook = python_hook
    if unraised:
        raise UsageError(_blamed(unraised[0]) or _said(unraised[0]))

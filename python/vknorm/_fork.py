"""Running a CLI command's work in a forked child, so that ncnn crashing (a SIGFPE or SIGSEGV on input
shapes a model cannot take) becomes one line and exit 2 instead of a dead process. Used by `vknorm check`
and `vknorm bench --model`."""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Dict, Optional

from .cli import UsageError


# Errors cli.main reports as one line and exit 2 (bad settings, memory too small, files it cannot write).
_REPORTED = (ValueError, MemoryError, OSError)

# Likely causes of a crash, by where the worker was (stage's cause).
SHAPES = "do the --input shapes match what the model takes?"
LOADING = "ncnn cannot load this model (no input was given yet)"
VKNORM_CRASH = ("stock ncnn's CPU and Vulkan runs of the same inputs had finished, so the fault is likely vknorm's at "
                "these shapes: please report it with the model")
TIMED_CRASH = "every run had finished once with these inputs: please report it with the model"


def stock_vulkan_crash(cpu_run: str) -> str:
    """The cause of a crash in stock ncnn's Vulkan run after cpu_run ("its CPU run") had finished: ncnn's CPU layers
    check few shapes, so the shapes may still be wrong; where they are right, stock ncnn's own Vulkan layers fail."""
    return (f"{cpu_run} of the same inputs had finished, but ncnn's CPU layers check few shapes: {SHAPES} If they do, "
            "stock ncnn's own Vulkan layers fail at these shapes (`vknorm check` without --vulkan judges vknorm's "
            "layers on their own)")


_stage_fd = None  # the worker's end of its pipe, while run_in_child's fn runs


def stage(what: str, cause: str = SHAPES) -> None:
    """In run_in_child's worker: the run it starts now ("stock ncnn's Vulkan run"), and the likely cause should it
    crash there; a crash message then names both. Does nothing outside a worker."""
    if _stage_fd is not None:
        os.write(_stage_fd, (json.dumps({"stage": [what, cause]}) + "\n").encode())


def fork_is_safe(inprocess_env: str) -> bool:
    """Guard the work in a forked child only while this process has used neither Vulkan nor pyncnn: a
    child must not inherit a live Vulkan device (vknorm and ncnn load libvulkan only when they start one)
    or ncnn's OpenMP pool. ``inprocess_env`` (e.g. VKNORM_CHECK_INPROCESS=1) turns the guard off."""
    from .settings import switch

    try:
        inprocess = switch(inprocess_env)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not hasattr(os, "fork") or inprocess:
        return False
    if "ncnn" in sys.modules:
        return False
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return not any(os.path.basename(line.split()[-1]).startswith("libvulkan")
                           for line in f if ".so" in line)
    except OSError:
        return False


def _die_with_parent(parent: int) -> None:
    """In the child: the kernel kills it when the parent dies (Linux's PR_SET_PDEATHSIG), so a CLI killed by a
    signal leaves no worker running on; a parent gone before that was set: leave at once."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux's libc: the parent's own clean-up below still applies
        pass
    if os.getppid() != parent:
        os._exit(70)


def run_in_child(fn: Callable[[], dict], crashed: Callable[..., str]) -> dict:
    """fn() in a forked child; its JSON-able result comes back through a pipe. UsageError (and
    VulkanUnavailableError, and the RuntimeError of a model ncnn cannot load or run) come back as
    UsageError; the errors the CLI reports in one line when raised in its own process (ValueError,
    MemoryError, OSError) come back as themselves, with the child's message; a child killed by a signal
    becomes UsageError(crashed(signal name, stage)), stage the last (what, cause) fn gave stage() or None;
    anything else a RuntimeError with the child's message (its
    traceback goes to stderr). The child leaves with os._exit; it dies with the parent, and an interrupt
    (KeyboardInterrupt) or any other exception in the parent while it waits kills it first. A worker interrupted
    itself (Ctrl-C) interrupts the parent; one stopped by SIGTERM, SIGHUP or SIGQUIT, or gone with no result, is a
    UsageError saying so."""
    import signal
    import traceback
    import warnings

    rfd, wfd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: "process is multi-threaded"
        pid = os.fork()
    payload: Optional[Dict[str, Any]]  # the child's result (or error) it sends; what the parent reads of it
    if pid == 0:  # child
        global _stage_fd
        code = 0
        try:
            _die_with_parent(parent)
            from .cli import _terminated

            for stop in (signal.SIGTERM, signal.SIGHUP):  # the CLI's handlers are the parent's: a worker told to
                if signal.getsignal(stop) is _terminated:  # stop by a signal dies of it, and the parent says so (one
                    signal.signal(stop, signal.SIG_DFL)    # that was ignored, as under nohup, stays ignored)
            os.close(rfd)
            _stage_fd = wfd
            try:
                payload = {"result": fn()}
            except KeyboardInterrupt:  # Ctrl-C reached the worker (alone, or before the parent)
                payload = {"interrupted": True}
            except UsageError as e:
                payload = {"usage_error": str(e)}
            except Exception as e:
                from . import _core

                if isinstance(e, _core.VulkanUnavailableError):
                    payload = {"usage_error": str(e)}
                elif isinstance(e, OSError) and e.errno is not None:  # its number and file name, for the message
                    payload = {"os_error": [e.errno, e.strerror, e.filename]}
                elif isinstance(e, _REPORTED):
                    payload = {"reported_error": [next(k.__name__ for k in _REPORTED if isinstance(e, k)), str(e)]}
                else:
                    traceback.print_exc()
                    payload = {"internal_error": f"{type(e).__name__}: {e}"}
            _stage_fd = None
            with os.fdopen(wfd, "w", encoding="utf-8") as f:
                json.dump(payload, f)
        except BaseException:  # noqa: BLE001
            code = 70
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(wfd)
    try:
        with os.fdopen(rfd, "r", encoding="utf-8") as f:
            text = f.read()
        _, status = os.waitpid(pid, 0)
    except BaseException:  # an interrupt (SIGINT to this process; a terminal's Ctrl-C reaches the worker too) or
        # anything else: no worker left running
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
        raise
    payload, last_stage = None, None
    for line in text.split("\n"):  # the stages fn went through, one per line, then its result
        try:
            obj = json.loads(line)
        except ValueError:
            payload = None
            break
        if isinstance(obj, dict) and "stage" in obj:
            last_stage = tuple(obj["stage"])
        else:
            payload = obj
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signame = signal.Signals(sig).name
        except ValueError:
            signame = f"signal {sig}"
        if sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):  # told to stop: no crash
            raise UsageError(f"the worker process was stopped by {signame}")
        raise UsageError(crashed(signame, last_stage))
    if not isinstance(payload, dict):
        raise UsageError(f"the worker process exited with status {os.waitstatus_to_exitcode(status)} and no result")
    if payload.get("interrupted"):
        raise KeyboardInterrupt
    if "os_error" in payload:
        raise OSError(*payload["os_error"])
    if "usage_error" in payload:
        raise UsageError(payload["usage_error"])
    if "reported_error" in payload:
        kind, message = payload["reported_error"]
        raise next(k for k in _REPORTED if k.__name__ == kind)(message)
    if "internal_error" in payload:
        raise RuntimeError(payload["internal_error"])
    return payload["result"]


def crashed_running(model: str, specs: dict) -> Callable[..., str]:
    """run_in_child's message for a child dead of a signal while running model on these --input shapes: ncnn
    crashing (in the run the worker last named with stage(), for the cause it gave: by default shapes the model
    does not take), or (SIGKILL) most likely the kernel's out-of-memory killer."""
    def message(signame: str, at=None) -> str:
        what, cause = at if at else (None, SHAPES)
        run = f"in {what} of {model}" if what else f"running {model}"
        if signame == "SIGKILL":
            advice = "" if cause == LOADING else " try smaller --input shapes"
            return (f"the worker {run} with {input_flags(specs)} was killed "
                    f"(SIGKILL: out of host memory?{advice})")
        from . import custom_layers

        also = custom_layers.suspect(crashed=True)
        return f"ncnn crashed ({signame}) {run} with {input_flags(specs)}: {cause}{also}"
    return message


def input_flags(specs: dict) -> str:
    """--input NAME=DIMS ... as the user typed them (for messages)."""
    from .check import dims_text

    return " ".join(f"--input {k}={dims_text(v)}" for k, v in specs.items())

"""The vknorm command: info | check | bench | optimize | demo.

Errors the user can fix (bad files, flags, no driver) print one line and exit 2.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from typing import Dict


class UsageError(Exception):
    """A problem with the command line or its files: one line, exit 2."""


def names_a_directory(path: str) -> bool:
    """Whether `path` can only name a directory: a trailing separator, or a last component . or .. (realpath drops
    them, so a check of the resolved name would pass a path the write then fails on)."""
    return path.endswith(("/", os.sep)) or os.path.basename(path) in (".", "..")


def same_file(a: str, b: str) -> bool:
    """Whether paths a and b name one file: one path once symbolic links are followed, or (both existing) one file
    under two names (a hard link), which a write through either changes."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # either missing (or a name the system refuses): not one existing file
        return False


class OneLineParser(argparse.ArgumentParser):
    """argparse's own errors (an invalid choice, a value that is not a number, a missing argument) as one line,
    exit 2, as the commands' other errors are; --help still prints the whole usage. Subcommands' parsers are
    made of this class too (argparse gives them the parent's)."""

    commands: Dict[str, OneLineParser]  # build_parser sets it: name -> its subcommand's parser

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")

    def print_help(self, file=None):
        # argparse drops a failed write (its _print_message): with standard output unbuffered (PYTHONUNBUFFERED),
        # --help onto a full disk exited 0 having written nothing. Raised here, main says so in one line, exit 2.
        try:
            (file or sys.stdout).write(self.format_help())
        except BrokenPipeError:
            raise
        except OSError as e:
            raise OSError(e.errno, e.strerror, "standard output") from None


# What ends a line for str.splitlines (and so for a reader of stderr in Python), each written as its escape
_LINE_BREAKS = {ord(c): c.encode("unicode_escape").decode() for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


def positive_int(text: str) -> int:
    """An argparse type for counts (the tools' --iters, --rounds, ...): a whole number >= 1, else argparse's one-line
    error naming the flag."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number >= 1")
    return n


def replaced_file_mode(path: str) -> int:
    """The permissions a file written over `path` through a temporary one gets: those of the file it replaces (a
    0600 model stays so), else what open() would give a new file (mkstemp makes 0600)."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        mask = os.umask(0o022)
        os.umask(mask)
        return 0o666 & ~mask


def one_line(message) -> str:
    """An error as the one line it is promised to be: a line break inside it (a file name's) written as \\n."""
    return str(message).translate(_LINE_BREAKS)


def setting_problems() -> list:
    """The VKNORM_ settings set now that vknorm would refuse, {"name", "error"}: the C++ runtime's, then the
    package's own switches."""
    from . import _core
    from .settings import switch

    refused = list(_core.setting_problems())
    for name in ("VKNORM_CHECK_INPROCESS", "VKNORM_BENCH_INPROCESS"):
        try:
            switch(name)
        except ValueError as e:
            refused.append({"name": name, "error": str(e)})
    return refused


def require_settings() -> None:
    """A VKNORM_ setting the runtime would refuse, as one line before a model runs: inside ncnn's graph it would
    surface as that layer's failure (an extract's -1, blamed on the --input shapes)."""
    refused = setting_problems()
    if refused:
        raise UsageError(refused[0]["error"] + " (vknorm info lists the settings)")


def _info(args) -> int:
    from . import _core, settings

    # The settings first: a value the runtime refuses (VKNORM_VULKAN_API=2.0, say) can stop the device list itself.
    set_now, not_read = settings.vknorm_variables(), settings.unknown()
    refused = setting_problems()
    try:
        devs = _core.devices()
    except ValueError as e:  # a capability-profile setting: among those refused
        if not refused:
            raise UsageError(str(e)) from None
        devs = []
    else:
        if not devs:
            raise UsageError("no Vulkan device found: install mesa-vulkan-drivers (CPU) or a GPU driver")
    default, bad_choice = None, None
    if devs:
        try:
            default = _core.default_device_index()
        except ValueError as e:  # VKNORM_DEVICE names no device: the list is what the user needs to fix it
            bad_choice = e
    # A subgroup size the parser takes may still be one the device cannot run: its context says so when made.
    # (Only where nothing else is refused: a context reads the other settings too, and says their errors.)
    if default is not None and "VKNORM_SUBGROUP_SIZE" in set_now and not refused:
        try:
            _core.Context.create(default)
        except Exception as e:  # noqa: BLE001  (a device that cannot be made at all is the device list's matter)
            if str(e).startswith("VKNORM_SUBGROUP_SIZE="):
                refused.append({"name": "VKNORM_SUBGROUP_SIZE", "error": str(e)})
    problems = [p["error"] for p in refused] + ([str(bad_choice)] if bad_choice else [])
    ncnn_devices = _ncnn_devices()
    if args.json:
        print(json.dumps({"default": default, "devices": devs, "ncnn": ncnn_devices, "settings": set_now,
                          "unknown_settings": not_read, "refused_settings": refused}, indent=2))
    else:
        _print_devices(devs, default)
        _print_ncnn_devices(ncnn_devices)
        _print_settings(set_now, not_read, refused)
    if problems:
        more = f" (and {len(problems) - 1} more, listed above)" if len(problems) > 1 else ""
        raise UsageError(problems[0] + more)
    return 0


def _print_devices(devs, default) -> None:
    for d in devs:
        mark = "*" if d["index"] == default else " "
        print(f"{mark} [{d['index']}] {d['name']} ({d['type']})")
        rows = [
            ("driver", f"{d['driver_name'] or '-'} {d['driver_info']}".strip()),
            ("Vulkan API", d["api_version"]),
            ("subgroup size", d["subgroup_size"]),
            ("subgroup ops", ", ".join(d["subgroup_ops"]) or "none"),
            ("16-bit storage", "yes" if d["storage_16bit"] else "no"),
            ("float16 arithmetic", "yes" if d["float16_arithmetic"] else "no"),
            ("max shared memory", f"{d['max_shared_memory']} bytes"),
            ("multiprocessors", str(d["compute_units"]) if d["compute_units"] else "unknown"),
            ("max workgroup invocations", d["max_workgroup_invocations"]),
            ("timestamp period", f"{d['timestamp_period_ns']:g} ns" + ("" if d["timestamps"] else " (no timestamps)")),
        ]
        for k, v in rows:
            print(f"      {k:<27}{v}")
    if devs:
        print("  (* = default device; VKNORM_DEVICE=index|name picks another)")


def _ncnn_devices():
    """The devices as the ncnn inside vknorm.graph sees them, and the one its nets run on by default: on a machine of
    several GPUs not always vknorm's own default (each picks by its own rules). None where vknorm was built without
    ncnn."""
    try:
        from . import graph
    except ImportError:
        return None
    from ._stdio import quiet_stderr

    with quiet_stderr():  # ncnn prints its device banner when it creates its Vulkan instance
        count = graph.get_gpu_count()
        infos = [graph.get_gpu_info(i).as_dict() for i in range(count)]
        default = graph.get_default_gpu_index() if count else None
    for info in infos:
        info["pipeline_cache_uuid"] = info["pipeline_cache_uuid"].hex()
    return {"default": default, "devices": infos}


def _print_ncnn_devices(ncnn_devices) -> None:
    if not ncnn_devices or ncnn_devices["default"] is None:
        return
    d = ncnn_devices["devices"][ncnn_devices["default"]]
    print(f"  ncnn's nets (vknorm.graph, check --vulkan, bench --model) run on ncnn's [{d['device_index']}] "
          f"{d['device_name']}\n  (ncnn's default device; net.set_vulkan_device(i) picks another)")


def _print_settings(set_now, not_read, refused) -> None:
    """What vknorm reads, what it would refuse, and what it was likely meant to read (a misspelled name is
    otherwise ignored)."""
    from . import settings

    if not set_now:
        return
    ignored = {u["name"]: u["meant"] for u in not_read}
    errors = {r["name"]: r["error"] for r in refused}
    print("\nVKNORM_ variables set:")
    for name, value in set_now.items():
        if name in errors:  # the message restates NAME=value
            print(f"  {name}={value}  refused: {errors[name].split(': ', 1)[-1]}")
        elif name not in ignored:
            what = settings.RUNTIME_SETTINGS.get(name, "a tuning knob (docs/benchmarks)")
            if name in settings.SWITCHES and not settings.switch(name):  # set, but to off: it does nothing
                what = f"off ({what}, when on)"
            print(f"  {name}={value}  {what}")
        else:
            meant = f" (meant {ignored[name]}?)" if ignored[name] else ""
            print(f"  {name}={value}  not read by vknorm at run time{meant}")


def _demo(args) -> int:
    """One LayerNorm on the default device against the CPU reference."""
    import numpy as np

    from . import LayerNorm, device_info

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((197, 768)) * 3 + 5).astype(np.float32)
    ln = LayerNorm(affine_size=768, eps=1e-5)
    ln.load_model(1 + 0.1 * rng.standard_normal(768), 0.1 * rng.standard_normal(768))
    y_gpu = ln(x, device="vulkan")
    info = ln.last_dispatch
    y_cpu = ln(x, device="cpu")
    reductions = "subgroup" if info["subgroup"] else "shared-memory"
    print(f"LayerNorm 197x768 on {device_info()['name']}: path {info['path']} ({reductions} reductions), "
          f"{info['dispatches']} dispatch(es), {info['gpu_us']:.1f} us GPU")
    print(f"  max |vulkan - cpu reference| = {float(np.abs(y_gpu - y_cpu).max()):.3e}")
    return 0


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="vknorm", description="Fast, exact LayerNorm, RMSNorm, GroupNorm and InstanceNorm on Vulkan")
    sub = p.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="list Vulkan devices and their capabilities")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=_info)
    demo = sub.add_parser("demo", help="one LayerNorm on the default device vs the CPU reference")
    demo.set_defaults(func=_demo)
    for name, module in (("check", "check"), ("bench", "bench"), ("optimize", "optimize")):
        try:
            mod = __import__(f"vknorm.{module}", fromlist=["add_parser"])
        except ImportError:
            continue
        mod.add_parser(sub)
    p.commands = sub.choices  # name -> its parser: main() says its errors there
    return p


def _terminated(signum, frame):
    """SIGTERM or SIGHUP: leave as an exception, so that what a command cleans up in `finally` (temporary files,
    a worker process) is cleaned up, then exit as the signal would (128 + its number)."""
    raise SystemExit(128 + signum)


def _drop_standard_output() -> None:
    """Point fd 1 at /dev/null: what Python still holds for it then goes nowhere at exit, not into a second error
    ('Exception ignored ... BrokenPipeError')."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # (no stdout at all: nothing held for it)
        pass


def _flush_standard_output() -> None:
    """The report's last buffered bytes out now, inside main's handlers (Python's own flush at exit can only print
    'Exception ignored'); a failure names standard output."""
    try:
        if sys.stdout is not None:  # (closed at start-up: `>&-`)
            sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        raise OSError(e.errno, e.strerror, "standard output") from None


def _standard_output_failing() -> bool:
    """Whether standard output cannot take what it holds (a write that failed keeps its bytes buffered)."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
        return False
    except OSError:
        return True


def main(argv=None) -> int:
    """The CLI: one line on stderr and exit 2 for what the user can fix, 130 on Ctrl-C, 141 when the reader of
    standard output left, 128 + the signal for SIGTERM and SIGHUP (after the command's clean-up)."""
    import signal
    import threading

    restore = {}
    if threading.current_thread() is threading.main_thread():  # (signal handlers are the main thread's to set)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) == signal.SIG_DFL:
                restore[sig] = signal.signal(sig, _terminated)
    # A file name is bytes: one that is not UTF-8 reaches Python as surrogates, which a UTF-8 locale's standard
    # output refuses (every report names its model). Written back as the bytes they were, as ls writes them.
    stdout_errors = getattr(sys.stdout, "errors", None)
    if stdout_errors == "strict" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="surrogateescape")
    try:
        try:
            code = _main(argv)
        except SystemExit:  # argparse's --help and usage errors, a signal: what they printed goes out now
            _flush_standard_output()
            raise
        try:  # an error's exit (a report half printed, then the error line): its rest goes out now too
            _flush_standard_output()
        except OSError:
            if not code:
                raise
            _drop_standard_output()  # the error line said what went wrong first
        return code
    except KeyboardInterrupt:  # while parsing or importing, before the command's own handlers
        return 130
    except BrokenPipeError:
        _drop_standard_output()
        return 141
    except OSError as e:  # (only standard output's flush after --help or a command's end gets here)
        _drop_standard_output()
        print(f"vknorm: error: {one_line(f'writing {e.filename}: {e.strerror or e}')}", file=sys.stderr)
        return 2
    finally:
        for sig, handler in restore.items():
            signal.signal(sig, handler)
        if stdout_errors == "strict" and hasattr(sys.stdout, "reconfigure"):
            try:
                sys.stdout.reconfigure(errors=stdout_errors)
            except (OSError, ValueError):  # (what it held could not be written: said above)
                pass


def _main(argv) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    # flags alone, no command (argparse would say only that the command is missing); -h, --help and their
    # abbreviations are argparse's, and a word that is not a command is its invalid choice
    helping = any(a == "-h" or (len(a) > 2 and "--help".startswith(a)) for a in argv)
    if argv and all(a.startswith("-") and a != "-" for a in argv) and not helping:
        parser.error(f"unrecognized arguments: {' '.join(argv)}; commands: {', '.join(parser.commands)}")
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the parser they were given to: the subcommand's, unless they came before its name
        before = argv[:argv.index(args.command)] if args.command in argv else []
        owner = parser if any(e in before for e in extra) else parser.commands[args.command]
        owner.error(f"unrecognized arguments: {' '.join(extra)}")
    from . import _core

    # Python sets a stream closed at start-up (`>&-`) to None: the report (or an error) would have nowhere to go
    closed = [name for name, stream in (("standard output", sys.stdout), ("standard error", sys.stderr)) if stream is None]
    if closed:
        if sys.stderr is not None:
            print(f"vknorm {args.command}: error: {closed[0]} is closed: nowhere to write the report", file=sys.stderr)
        return 2
    try:
        code = int(args.func(args) or 0)
        _flush_standard_output()
        return code
    except UsageError as e:
        print(f"vknorm {args.command}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except (_core.VulkanUnavailableError, ValueError) as e:  # no driver, VKNORM_DEVICE/VKNORM_PATH wrong
        print(f"vknorm {args.command}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except MemoryError as e:  # host or device memory (VKNORM_MAX_DEVICE_BYTES) too small for the shapes asked
        why = f" ({one_line(e)})" if str(e) else ""
        print(f"vknorm {args.command}: error: out of memory{why}: try smaller shapes", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `vknorm info | head -3`: the reader left; stop quietly, as other tools do
        _drop_standard_output()
        return 141
    except OSError as e:  # a file the command writes (--json, --plot) cannot be written: disk full, a dangling link
        # without a file name: standard output, where a write's error says so (the files the commands write are
        # named in theirs) or it cannot take what it holds (`--json - > /dev/full`); else what the system said (no
        # usable temporary directory, ...)
        full = e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO)
        where = e.filename if e.filename is not None else "standard output" if full or _standard_output_failing() \
            else None
        if where == "standard output":
            _drop_standard_output()
        said = f"writing {where}: {e.strerror or e}" if where else str(e.strerror or e)
        print(f"vknorm {args.command}: error: {one_line(said)}", file=sys.stderr)
        return 2

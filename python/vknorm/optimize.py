"""`vknorm optimize`: fuse an ncnn model offline, in the spirit of ncnnoptimize.

    vknorm optimize IN.param IN.bin OUT.param OUT.bin [--custom-layers FILE.py] [--json]

Every norm vknorm runs (LayerNorm, RMSNorm, GroupNorm, InstanceNorm) takes in the two-input BinaryOp add
that feeds it (directly, or through a Split output only the norm reads, whose other outputs are read after
the norm: the fused layer then also writes the sum) and the ReLU (leaky too) / Sigmoid / Swish / GELU that is
its only consumer. The fused
layers are vknorm's types (vknorm.LayerNorm, ...): the model loads wherever vknorm's layers are
registered (vknorm.graph.Net(), vknorm::ncnn::register_layers), and nowhere else. The weights keep
their order, so OUT.bin is IN.bin. vknorm.graph.Net() does the same rewrite at load time
(Net(fuse=False) turns it off); this command writes it down.

Nothing is written unless everything succeeds: the fused model is loaded once (CPU net) before the two
files are moved into place. An output may be its own input (IN.param as OUT.param: fused in place), never
the other one; a symbolic link as an output is written through.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from typing import Dict, List, Tuple

from . import custom_layers
from ._stdio import quiet_stderr, without_ncnn_notes


def add_parser(sub) -> None:
    p = sub.add_parser("optimize", help="fuse add -> norm -> activation into vknorm's layers (offline)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("param", metavar="IN.param")
    p.add_argument("bin", metavar="IN.bin")
    p.add_argument("out_param", metavar="OUT.param")
    p.add_argument("out_bin", metavar="OUT.bin")
    p.add_argument("--custom-layers", metavar="FILE.py",
                   help=custom_layers.help_for("the net that loads the fused model to check it", "vknorm.graph"))
    p.add_argument("--json", action="store_true", help="print what was fused as JSON")
    p.set_defaults(func=run)


def _read_param(path: str) -> Tuple[bytes, str]:
    """The .param's bytes and its text."""
    from .check import read_param_bytes, refuse_binary_params
    from .cli import UsageError

    data = read_param_bytes(path)
    refuse_binary_params(path, data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not an ncnn text .param (binary data: byte {e.start} is not UTF-8)") from None
    if "\0" in text:  # the rewrite reads C strings: its message would end at the NUL
        raise UsageError(f"{path}: not an ncnn text .param (binary data: a NUL byte at byte {data.index(0)})")
    return data, text


def fuse_files(param: str, bin_path: str, out_param: str, out_bin: str) -> Tuple[List[dict], List[str]]:
    """Fuse param/bin into out_param/out_bin (atomically, both or neither). Returns what was fused and
    warnings (a .bin longer than the model reads: one for another model?); UsageError on a missing, garbled
    or inconsistent input (a .bin shorter than the model reads among them)."""
    from .check import (load_failure, parse_param, require_distinct, require_file, trailing_bytes_warning,
                        unread_text_warnings)
    from .cli import UsageError, replaced_file_mode

    data, text = _read_param(param)
    require_file(bin_path, "weights .bin")
    require_distinct(param, bin_path)
    size = os.path.getsize(bin_path)
    try:
        from . import graph
    except ImportError as e:
        raise UsageError(str(e)) from None
    try:
        with quiet_stderr():  # ncnn's ParamDict logs a value it cannot read; the error below says it in one line
            fused_text, fused = graph._graph.fuse_param(text)
    except ValueError as e:
        raise UsageError(f"{param}: {e}") from None
    # what the rewrite lets through, refused as check and bench refuse it
    model = parse_param(param, allow_fused=True, raw=data)

    reals = _check_targets(out_param, out_bin, param, bin_path)
    staged = []
    try:
        for target, real, write in ((out_param, reals[0], lambda f: f.write(fused_text.encode())),
                                    (out_bin, reals[1], lambda f: _copy_into(bin_path, f))):
            d = os.path.dirname(real)
            if not os.path.isdir(d):
                raise UsageError(f"{target}: no such directory {d!r}")
            try:
                fd, tmp = tempfile.mkstemp(prefix=".vknorm-optimize-", dir=d)
            except OSError as e:
                raise UsageError(f"{target}: cannot be written ({e.strerror})") from None
            staged.append((tmp, real))
            # a file replaced keeps its permissions (an in-place run must not make a 0600 model world-readable);
            # a new one gets what open() would give it (mkstemp makes 0600)
            os.fchmod(fd, replaced_file_mode(real))
            try:
                with os.fdopen(fd, "wb") as f:
                    write(f)
            except OSError as e:  # (a full disk, a file size limit: the file, not standard output)
                raise UsageError(f"{target}: cannot be written ({e.strerror or e})") from None
        # The fused model must load where vknorm's layers are registered (a CPU net: no device needed).
        with quiet_stderr():  # registering vknorm's layers: ncnn says "overwrite built-in layer type ..."
            net = graph.configure(graph.Net(vknorm=True, fuse=False), vulkan=False)
        log: List[str] = []
        with custom_layers.running():  # the model's own layer types (--custom-layers): loaded, then let go
            custom_layers.apply(graph, net)
            with quiet_stderr(log):
                param_ret = net.load_param(staged[0][0])
                bin_ret = net.load_model(staged[1][0]) if param_ret == 0 else 0
            read = net.model_bytes_read
            with without_ncnn_notes("layer destroy_pipeline failed"):  # the error a layer raised says it
                net.clear()
        if param_ret != 0 or bin_ret != 0:
            what = "the fused model" if fused else "the model"
            if param_ret != 0:
                raise UsageError(f"{param}: {what} does not load (its layers){load_failure(model, log)}")
            # the weights: named first, as the file to fix
            why = f": {log[-1]}" if log else ""
            hint = "a .bin for another .param?" if read < size else "too few for the model?"
            raise UsageError(f"{bin_path}: {what} of {param} does not load (the weights, {size} bytes; {hint}){why}")
        # (the rewrite writes the layers ncnn reads: text past them is not in OUT.param)
        warnings = [w + "; OUT.param leaves it out" for w in unread_text_warnings(model)]
        warnings += [trailing_bytes_warning(bin_path, size - read, param) + "; OUT.bin is IN.bin as it is"] \
            if read < size else []
        _replace_both(staged, (out_param, out_bin))
        staged = []
    finally:
        for tmp, _ in staged:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return fused, warnings


def _replace_both(staged: List[Tuple[str, str]], names: Tuple[str, str]) -> None:
    """Moves each staged temporary file onto its target, both or neither: what a target held before is kept
    (a hard link beside it) until the other has been replaced too, and put back if that fails (an in-place
    run would otherwise leave IN.param fused beside a failed OUT.bin)."""
    from .cli import UsageError

    backups: List[Tuple[str, str]] = []  # (backup or "", target): "" where the target did not exist
    try:
        for i, (tmp, real) in enumerate(staged):
            backup = ""
            if os.path.exists(real):
                fd, backup = tempfile.mkstemp(prefix=".vknorm-optimize-old-", dir=os.path.dirname(real))
                os.close(fd)
                os.unlink(backup)  # a name of this process's own; link() will not follow anything put there since
                try:
                    os.link(real, backup)
                except OSError:  # a file system without hard links: a copy
                    try:
                        shutil.copy2(real, backup)
                    except OSError as e:
                        raise UsageError(f"{names[i]}: cannot be replaced safely ({e.strerror})") from None
            try:
                os.replace(tmp, real)
            except OSError as e:
                if backup:
                    os.unlink(backup)
                raise UsageError(f"{names[i]}: cannot be written ({e.strerror})") from None
            backups.append((backup, real))
        done, backups = backups, []
        for backup, _ in done:
            if backup:
                os.unlink(backup)
    finally:
        for backup, real in reversed(backups):  # a later target failed: the earlier ones as they were
            try:
                if backup:
                    os.replace(backup, real)
                else:
                    os.unlink(real)
            except OSError as e:  # said, not swallowed: that file is left as the fused output
                print(f"vknorm optimize: {real} could not be put back as it was ({e.strerror})"
                      + (f"; its old content is {backup}" if backup else ""), file=sys.stderr)


def _check_targets(out_param: str, out_bin: str, in_param: str, in_bin: str) -> Tuple[str, str]:
    """Both outputs are new or regular files, and two different ones: what is there is replaced whole at the
    end, so a directory, a device (/dev/null) or one file named twice is refused before anything is written.
    An output may replace its own input (IN.param by OUT.param, in place), never the other one, nor the
    --custom-layers file. Returns the
    paths to write: each output's real path (a symbolic link is written through)."""
    from .cli import UsageError, names_a_directory

    same = lambda a, b: os.path.realpath(a) == os.path.realpath(b)  # noqa: E731
    for flag, target in (("OUT.param", out_param), ("OUT.bin", out_bin)):
        if not target:
            raise UsageError(f"{flag}: empty file name; name a file")
        if names_a_directory(target):  # realpath drops a trailing / or /.: it would write a file of that name
            raise UsageError(f"{target}: a directory path (trailing /, . or ..); name a file to write")
    if same(out_param, out_bin):
        raise UsageError(f"OUT.param and OUT.bin are the same file ({out_param}): name two files")
    if same(out_param, in_bin):
        raise UsageError(f"OUT.param {out_param} is the input IN.bin: it would replace the weights with the param text")
    if same(out_bin, in_param):
        raise UsageError(f"OUT.bin {out_bin} is the input IN.param: it would replace the param text with the weights")
    code = custom_layers.used()
    for flag, target in (("OUT.param", out_param), ("OUT.bin", out_bin)):
        if code and same(target, code):
            raise UsageError(f"{flag} {target} is the --custom-layers file: the model would replace its code")
    reals = (os.path.realpath(out_param), os.path.realpath(out_bin))  # what is written: a symbolic link's target
    for target, real in zip((out_param, out_bin), reals):
        # device and process files (/dev/stdout too, wherever it leads; /dev/shm holds files like any directory)
        special = any(os.path.dirname(p) == "/dev" or p.startswith(("/proc/", "/sys/"))
                      for p in (real, os.path.abspath(target)))
        if os.path.lexists(real) and not os.path.isfile(real) or special:
            kind = "a directory" if os.path.isdir(real) else "not a regular file"
            raise UsageError(f"{target}: {kind}; name a file to write (it is replaced whole)")
    return reals


def _copy_into(src: str, f) -> None:
    from .cli import UsageError

    try:
        s = open(src, "rb")
    except OSError as e:  # the CLI's generic OSError line would say "writing" of the file read
        raise UsageError(f"{src}: cannot be read ({e.strerror})") from None
    with s:
        shutil.copyfileobj(s, f)


def run(args) -> int:
    from .cli import UsageError

    custom_layers.use(args.custom_layers)
    fused, warnings = fuse_files(args.param, args.bin, args.out_param, args.out_bin)
    try:
        _report(args, fused, warnings)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:  # the model is written (both files, atomically): only the report is lost
        raise UsageError(f"wrote {args.out_param} and {args.out_bin}, but not the report: writing standard output: "
                         f"{e.strerror or e}") from None
    return 0


def custom_type_indexes(param_text: str) -> Dict[str, int]:
    """The type indexes ncnn2mem gives a .param's types that are not ncnn's own (vknorm's fused types among them),
    which binary params name them by: LayerType::CustomBit | j (256 | j), j counting them in the order they first
    appear. For a .param of one layer per line, as fuse_param writes it."""
    from . import graph

    indexes: Dict[str, int] = {}
    for line in param_text.splitlines()[2:]:
        words = line.split()
        if words and words[0] not in indexes and graph.layer_to_index(words[0]) == -1:
            indexes[words[0]] = 256 | len(indexes)
    return indexes


def _report(args, fused, warnings) -> None:
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    with open(args.out_param, encoding="utf-8", errors="replace") as f:
        indexes = custom_type_indexes(f.read())
    if args.json:
        print(json.dumps({"param": args.out_param, "bin": args.out_bin, "fused": fused, "warnings": warnings,
                          "custom_type_indexes": indexes}, indent=1))
        return
    if not fused:
        print(f"{args.param}: nothing to fuse; wrote the model unchanged to {args.out_param}, {args.out_bin}"
              if not warnings else f"{args.param}: nothing to fuse; wrote the model's layers to {args.out_param}, "
              f"{args.out_bin}")
        return
    print(f"fused {len(fused)} pattern(s) into vknorm's layers -> {args.out_param}, {args.out_bin}")
    for f in fused:
        print(f"  {f['pattern']:<30} {', '.join(f['layers'])}")
    print("load it with vknorm's layers registered: vknorm.graph.Net() or vknorm::ncnn::register_layers")
    vknorm_types = {t: i for t, i in indexes.items() if t.startswith("vknorm.")}
    if vknorm_types:  # ncnn2mem's binary params name types by index alone
        print("converted to binary params by ncnn2mem, also: " + "; ".join(
            f'vknorm::ncnn::register_layer(net, {i}, "{t}")' for t, i in vknorm_types.items()) +
              " (Python: " + "; ".join(f'net.register_layer({i}, "{t}")' for t, i in vknorm_types.items()) + ")")

"""`vknorm check`: run an ncnn model stock and with vknorm, compare every norm layer's output (LayerNorm,
RMSNorm, GroupNorm, InstanceNorm).

    vknorm check MODEL.param MODEL.bin --input NAME=DIMS [--input NAME=DIMS ...] [--fp16] [--seed N]
                 [--atol X] [--custom-layers FILE.py] [--json]

Both runs are ncnn's CPU path in float32 (pyncnn, lightmode off so any blob can be extracted) on the same
seeded standard-normal inputs; the second has vknorm registered (vknorm.ncnn.register), so its
norm layers run on vknorm's Vulkan operator (with float16 storage under --fp16). The vknorm
run is done twice: the first warms up the device (pipelines, driver caches), the second is compared and
timed. The stock run is done twice too, in nets of their own, and must give every blob bit for bit again: a
layer reading past its blob (input shapes the model does not take) gives whatever memory holds. Per norm layer:
max |error| against the stock run on the same blob (max_abs_err), and the error the pass rule judges (below).
Exit 0 when every norm layer passes, 1 when one does not, 2 for a problem with the files or flags, or with what
the model makes of the inputs (stock runs that differ, a norm whose every input value is NaN/inf, ncnn
crashing) (one line on stderr).

Pass rule, the same for both engines (judge_layer): each vknorm layer against float64 computed from the
input it saw in the vknorm run, with its own params and weights (the stock run's input can already differ
by what ran upstream, which is not that layer's doing), each element's error over max(1, |its float64 value|,
|gamma x^| + |beta|) (float32's own rounding grows with the value and with the terms summed into it): fp32,
within --atol (1e-4); fp16, the input rounded to float16 first and half the float16 spacing at the output's
value allowed for the output rounding, the rest within --atol (1e-3). --vulkan also fails a vknorm layer that ran on the host.

    vknorm check MODEL.param MODEL.bin --input NAME=DIMS [...] --vulkan [--no-fuse] [--fp16] [--seed N] [--atol X]
                 [--custom-layers FILE.py] [--json]

--vulkan checks vknorm inside ncnn's Vulkan graph instead (vknorm.graph: one ncnn, compiled from source,
for all three runs): stock ncnn CPU fp32 (the reference, run twice in nets of its own as above), stock ncnn
Vulkan, and ncnn Vulkan with vknorm's layers recorded into ncnn's command buffer (--fp16: float16 storage in both
Vulkan runs). Per norm layer:
vknorm's and stock ncnn Vulkan's max |error| against the CPU run on the same blob, and vknorm's kernel
time for that blob measured on vknorm's own Vulkan context (ncnn's graph has no per-layer timestamps);
per model output: both Vulkan runs' error; the whole-model wall time of both Vulkan runs. Pass rule: the
one above (the CPU run's input already carries the stock Vulkan layers' differences upstream), each model
output's error within twice stock ncnn Vulkan's + --atol x max(1, its largest |value|), and no vknorm layer ran
on the host (host_round_trips 0; a layer the model keeps off Vulkan with featmask 31=16 runs on the CPU by
design: "kept_off_vulkan", and a warning). The vknorm net is fused as vknorm.graph fuses it (--no-fuse:
not): "fused" lists each pattern and its ncnn layers; a fused layer is judged on its output blob, and the sum
it writes for the add's other readers against the add's value (sum_err, which must be 0).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import re
import stat
import struct
import sys
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union, cast

from . import custom_layers
from ._stdio import quiet_stderr
from .cli import UsageError, require_settings

if TYPE_CHECKING:  # for annotations only
    from .layers import _GammaBetaNorm

NORM_TYPES = ("LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm")


def _param_kinds(type_: str):
    """(id, int or float) of each ncnn param of a norm type, from the layer classes' own id tables."""
    return tuple((pid, float if name == "eps" else int) for pid, name, _ in _layer_class(type_)._params)


def _layer_class(type_: str):
    from . import layers

    return getattr(layers, type_)


ATOL_FP32 = 1e-4
ATOL_FP16 = 1e-3  # both engines: against float64 of the float16 input, after output rounding (judge_layer)
ATOL_VULKAN_FP16 = ATOL_FP16  # the former name of the --vulkan default; one rule now
MAGIC = 7767517
MAX_INPUT_ELEMENTS = 1 << 28  # 1 GiB of float32 per input: anything larger is a typo

_DIMS_HELP = ("DIMS in numpy/pnnx order without batch: 197x192 (h x w), 96x28x28 (c x h x w), 4x3x5x8 (c x d x h x w), "
              "64 (w); empty: an empty Mat, a decoder's past kv cache at its first step")
# --input NAME=empty: an empty Mat, what a decoder's first step gives its past kv caches (dims ())
EMPTY = "empty"


RULE_HELP = (
    "Pass rule (exit 1 otherwise), both engines: each vknorm layer is judged against float64 computed from "
    "the very input that layer saw in the vknorm run, with its params and weights (the stock run's input can "
    "already differ by what ran upstream, which is not that layer's doing), each element's error over max(1, |its "
    "float64 value|, |gamma x^| + |beta|) (float32's own rounding grows with the value and the terms summed into "
    "it): fp32: <= --atol (default 1e-4); fp16: the input "
    "rounded to float16 first, and the error less float16 output rounding (half the float16 spacing at the "
    "output's value) <= --atol (default 1e-3)."
)

VULKAN_HELP = (
    "check vknorm inside ncnn's Vulkan graph (vknorm.graph; needs vknorm built with ncnn): the model runs "
    "three times on the same inputs in one ncnn: stock ncnn CPU fp32 (the reference), stock ncnn Vulkan, "
    "and ncnn Vulkan with vknorm's layers inside (--fp16: float16 storage in both Vulkan runs). Per "
    "norm layer (LayerNorm, RMSNorm, GroupNorm, InstanceNorm): vknorm's and stock ncnn Vulkan's max abs error against the CPU run on the same "
    "blob, and gpu_us: vknorm's kernel time for that blob, one dispatch at a time (its shape, storage, params and weights; a fused "
    "layer's whole kernel, the add and the sum it writes included) on vknorm's own Vulkan context, since ncnn's graph has no per-layer timestamps; per model output: both "
    "Vulkan runs' error; the whole-model wall ms per inference of both Vulkan runs (median after a warm-up, "
    "lightmode on); the device. Pass rule: the one above, the same for both engines (here the CPU run's "
    "input already differs by the stock Vulkan layers upstream), no vknorm layer ran on the host "
    "(host_round_trips 0; layers the model keeps off Vulkan with featmask 31=16 excepted), and each model "
    "output's error against the CPU run is at most twice stock ncnn Vulkan's plus --atol times the output's "
    "largest magnitude (at least 1), on the elements where stock's output is as finite as the CPU's: what "
    "shows a wrong fusion or layer that each layer's own judgement cannot. "
    "The rule applied is printed."
)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "check",
        help="run an ncnn model stock and with vknorm; compare every norm layer's output",
        description="Run an ncnn model (.param + .bin) twice in pyncnn on the same seeded random inputs, "
                    "stock and with vknorm's Vulkan LayerNorm/RMSNorm/GroupNorm/InstanceNorm, and compare every norm "
                    "output and every model output. Exit 0: every vknorm layer passes; 1: one does not, or (--vulkan) "
                    "a model output is past its bound or a blob went through the host; 2: bad files or flags. --vulkan: vknorm inside ncnn's Vulkan graph instead, three runs "
                    "in one ncnn (see --vulkan). " + RULE_HELP,
        epilog=_DIMS_HELP + ".",
    )
    p.add_argument("param", metavar="MODEL.param", help="ncnn text .param")
    p.add_argument("bin", metavar="MODEL.bin", help="ncnn .bin weights")
    p.add_argument("--input", action="append", default=[], metavar="NAME=DIMS",
                   help="an input blob and its shape (repeat for each input; DIMS: below)")
    p.add_argument("--fp16", action="store_true",
                   help="vknorm layers use float16 storage (default tolerance 1e-3, after the float16 "
                        "rounding of input and output: see the pass rule above); with --vulkan: float16 "
                        "storage in both Vulkan runs")
    p.add_argument("--seed", default="0", metavar="N", help="seed of the random inputs (default 0)")
    p.add_argument("--atol", default=None, metavar="X",
                   help="tolerance of the pass rule, relative to max(1, |each output's float64 value|, "
                        "|gamma x^| + |beta|) "
                        "(default 1e-4, with --fp16 1e-3)")
    p.add_argument("--vulkan", action="store_true", help=VULKAN_HELP)
    p.add_argument("--no-fuse", action="store_true",
                   help="--vulkan: run the model as it is, without vknorm's add -> norm -> activation fusion "
                        "(vknorm.graph.Net(fuse=False))")
    p.add_argument("--custom-layers", metavar="FILE.py", help=custom_layers.help_for("each net the command makes"))
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=run_check)
    return p


# ---------------------------------------------------------------------------------------------- flags

class DimsTooLarge(ValueError):
    """Well-formed DIMS of more elements than an input may have."""


def parse_dims(text: str) -> Tuple[int, ...]:
    """'197x192' -> (197, 192); '96x28x28' -> (96, 28, 28); '64' -> (64,); 'empty' -> () (an empty Mat).
    ValueError when malformed, DimsTooLarge when well formed but past MAX_INPUT_ELEMENTS."""
    if text.strip().lower() == EMPTY:
        return ()
    parts = text.strip().lower().split("x")
    if not 1 <= len(parts) <= 4 or not all(re.fullmatch(r"[0-9]+", p) for p in parts):
        raise ValueError("expected 1 to 4 positive integers joined by 'x'")
    dims = tuple(int(p) for p in parts)
    if any(d <= 0 for d in dims):
        raise ValueError("every dimension must be at least 1")
    if math.prod(dims) > MAX_INPUT_ELEMENTS:
        raise DimsTooLarge(f"{math.prod(dims)} elements is more than the {MAX_INPUT_ELEMENTS} allowed")
    return dims


def dims_text(dims) -> str:
    """DIMS as typed: 16x64, or empty."""
    return "x".join(map(str, dims)) if len(dims) else EMPTY


def random_inputs(rng, input_specs: Dict[str, Tuple[int, ...]], names: List[str]) -> dict:
    """Seeded standard-normal float32 inputs of the --input shapes, in the model's input order; an empty input
    is a float32 array of no elements (input_mat makes it ncnn's empty Mat)."""
    import numpy as np

    return {name: np.ascontiguousarray(rng.standard_normal(input_specs[name], dtype=np.float32))
            if input_specs[name] else np.empty((0,), np.float32) for name in names}


def input_mat(mat_type, arr):
    """arr as a Mat of mat_type (pyncnn's or vknorm.graph's), no elements being the empty Mat."""
    return mat_type(arr) if arr.size else mat_type()


def parse_inputs(specs: List[str]) -> Dict[str, Tuple[int, ...]]:
    out: Dict[str, Tuple[int, ...]] = {}
    for spec in specs:
        name, eq, dims = spec.rpartition("=")  # DIMS hold no '=', a blob name may (ncnn takes any bytes but spaces)
        name = name.strip()
        if not eq or not name:
            raise UsageError(f"--input {spec!r}: expected NAME=DIMS, e.g. in0=16x64")
        try:
            out_dims = parse_dims(dims)
        except DimsTooLarge as e:
            raise UsageError(f"--input {spec!r}: DIMS {dims!r}: {e}") from None
        except ValueError as e:
            raise UsageError(f"--input {spec!r}: malformed DIMS {dims!r}: {e} ({_DIMS_HELP})") from None
        if name in out:
            raise UsageError(f"--input {spec!r}: input {name!r} given twice")
        out[name] = out_dims
    return out


def _parse_seed(text: str) -> int:
    try:
        seed = int(str(text).strip(), 10)
    except ValueError:
        raise UsageError(f"--seed {text!r}: expected a non-negative integer") from None
    if seed < 0:
        raise UsageError(f"--seed {text!r}: expected a non-negative integer")
    return seed


def _parse_atol(text: Optional[str], fp16: bool) -> float:
    if text is None:
        return ATOL_FP16 if fp16 else ATOL_FP32
    try:
        atol = float(str(text).strip())
    except ValueError:
        raise UsageError(f"--atol {text!r}: expected a number >= 0, e.g. 1e-4") from None
    if not math.isfinite(atol) or atol < 0:
        raise UsageError(f"--atol {text!r}: expected a finite number >= 0")
    return atol


# ---------------------------------------------------------------------------------------------- .param

class Layer:
    __slots__ = ("type", "name", "bottoms", "tops", "params", "line", "norm")

    def __init__(self, type_, name, bottoms, tops, params, line, norm=None):
        self.type, self.name, self.bottoms, self.tops, self.params, self.line = type_, name, bottoms, tops, params, line
        self.norm = norm  # a norm layer's params as vknorm's layer holds them (no weights)


class Model:
    def __init__(self, path: str, text: str, layers: List[Layer], unread_line: Optional[int] = None):
        self.path = path
        self.text = text
        self.layers = layers
        self.unread_line = unread_line  # where text past the header's count of layers starts (ncnn reads none of it)
        self.inputs = [t for layer in layers if layer.type == "Input" for t in layer.tops]
        self.norms = [layer for layer in layers if layer.type in NORM_TYPES]


# A line's params as ncnn reads them: a value that starts with a double quote (5="a b": a string param) runs to the
# closing quote, spaces and all; a quote anywhere else is a character like any other. Types, names and blob names
# are whitespace-separated words (a quote in y="a is part of the name).
# ncnn reads a .param's bytes with C's whitespace (space, \t, \n, \v, \f, \r), so re.ASCII: Unicode spaces (a no-break
# space, U+2028) are part of a name there, and only \r and \n end a line.
_C_SPACE = " \t\n\v\f\r"
_C_LINES = re.compile(r"\r\n|[\r\n]")
_TOKEN = re.compile(r'[^\s=]+="[^"]*(?:"\S*|$)|\S+', re.ASCII)
_PARAM = re.compile(r'([-+]?[0-9]+)=(.+)', re.S)  # ids as ncnn reads them (%d: "+0" and "00" are 0)
_NAME_MAX = 255  # ncnn's longest layer type, layer name and blob name
_MAX_NET_COUNT = 1000000  # ncnn's limit on the header's counts and a layer's bottom and top counts
_NET_VALUE_MAX_CHARS = 31  # ncnn reads a number's word with %31s and refuses a longer one


def _net_value(word: str) -> Optional[int]:
    """A number as ncnn's load_param reads the magic number and the counts (a sign, then digits: +5, -0, 007; at
    most 31 characters, within int), None where it refuses the word."""
    if len(word) > _NET_VALUE_MAX_CHARS or not re.fullmatch(r"[+-]?[0-9]+", word, re.ASCII):
        return None
    value = int(word)
    return value if -2 ** 31 <= value < 2 ** 31 else None


def _count(word: str) -> Optional[int]:
    """A layer's bottom or top count as ncnn takes it (0 to _MAX_NET_COUNT), None otherwise."""
    value = _net_value(word)
    return value if value is not None and 0 <= value <= _MAX_NET_COUNT else None


class _Words:
    """A .param's text as ncnn reads it: words (scanf's %s, C's white space, across line breaks) for the header and
    each layer's type, name, counts and blob names; the rest of the current line for a layer's params (ParamDict)."""

    _WORD = re.compile(r"[^ \t\v\f]+")

    def __init__(self, text: str):
        self.lines = _C_LINES.split(text)
        self.i, self.at = 0, 0

    def next(self) -> Optional[Tuple[int, str]]:
        """(line number, word), None at the end of the text."""
        while self.i < len(self.lines):
            m = self._WORD.search(self.lines[self.i], self.at)
            if m:
                self.at = m.end()
                return self.i + 1, m.group()
            self.i, self.at = self.i + 1, 0
        return None

    def line_text(self) -> str:
        """The line the last word was read from."""
        return self.lines[min(self.i, len(self.lines) - 1)].strip(_C_SPACE)

    def rest_of_line(self) -> str:
        rest = self.lines[self.i][self.at:] if self.i < len(self.lines) else ""
        self.i, self.at = self.i + 1, 0
        return rest



def _require_regular(path: str, mode: int, what: str) -> None:
    if stat.S_ISDIR(mode):
        raise UsageError(f"{path}: is a directory, not the {what}")
    if not stat.S_ISREG(mode):  # /dev/zero reads without end, a named pipe waits for a writer: refuse both up front
        kind = ("a named pipe" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise UsageError(f"{path}: {kind}, not the {what} (name a regular file)")


def require_file(path: str, what: str) -> None:
    """UsageError unless path is a regular file (what: "model .param", "weights .bin")."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(f"{path}: no such file ({what})") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    except ValueError:  # a NUL in the name
        raise UsageError(f"{path!r}: not a file name ({what})") from None
    _require_regular(path, mode, what)


def require_distinct(param_path: str, bin_path: str) -> None:
    """UsageError where the weights .bin named is the .param itself (a slip when typing the two): said as such, not
    as weights too short for the model."""
    try:
        same = os.path.samefile(param_path, bin_path)
    except (OSError, ValueError):  # a missing or unreadable one is said by the checks that follow
        return
    if same:
        raise UsageError(f"{bin_path}: the weights .bin is the model .param itself; give the model's .bin")


# A .param is read in blocks of this many bytes up to its first token, and on only where that token is ncnn's
# magic number: a weights file given as the .param (the arguments swapped) is refused from its first bytes
# instead of read whole.
PARAM_HEAD_BYTES = 64


def _starts_as_text_param(head: bytes) -> Optional[bool]:
    """Whether a .param's first bytes begin with ncnn's magic number as a word of its own (7767517, or as ncnn
    reads that number: +7767517, 007767517); None while they hold too little of the first word to tell."""
    text = head.lstrip()
    word = cast("re.Match[bytes]", re.match(rb"[^ \t\n\v\f\r]*", text)).group()  # a * pattern always matches
    if len(word) == len(text) and len(word) <= _NET_VALUE_MAX_CHARS:  # the word may go on past these bytes
        digits = re.fullmatch(rb"[+-]?0*([0-9]*)", word)
        return None if digits and b"7767517".startswith(digits.group(1)) else False
    return _net_value(word.decode("latin-1")) == MAGIC


def _read_file(path: str, what: str, head_check=None) -> bytes:
    """The whole of a regular file (UsageError for anything else, before reading a byte of it). head_check:
    blocks of PARAM_HEAD_BYTES are read until it answers (True, False; None: read another), and the rest
    only on True (else what was read is returned)."""
    require_file(path, what)
    try:
        # O_NONBLOCK: should a pipe replace the file after the check, open() returns instead of waiting
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file ({what})") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        _require_regular(path, os.fstat(fd).st_mode, what)
        try:
            if head_check is None:
                return f.read()
            head, verdict = b"", None
            while verdict is None:
                block = f.read(PARAM_HEAD_BYTES)
                head += block
                verdict = head_check(head)
                if not block:  # the end: all of it is read
                    return head
            return head + f.read() if verdict else head
        except OSError as e:
            raise UsageError(f"{path}: cannot read the {what} ({e.strerror or e})") from None


def read_param_bytes(path: str) -> bytes:
    """A .param's bytes: the whole file where it starts as ncnn's text .param does, else its first bytes,
    which parse_param refuses."""
    return _read_file(path, "model .param", head_check=_starts_as_text_param)


def refuse_binary_params(path: str, raw: bytes) -> None:
    """UsageError for ncnn2mem's binary params (its magic number as a binary int), which name no layer or blob."""
    if raw[:4] == struct.pack("<i", MAGIC):
        raise UsageError(f"{path}: a binary .param.bin (ncnn2mem's); vknorm check, bench --model and optimize read "
                         "ncnn's text .param: give the one it was made from (vknorm.graph's Net.load_param_bin loads "
                         "binary params)")


def parse_param(path: str, allow_fused: bool = False, raw: Optional[bytes] = None) -> Model:
    """Read and validate an ncnn text .param (UsageError naming the file and line when it is garbled).
    allow_fused: take vknorm's fused layer types (vknorm optimize's output) as any other layer. raw: the
    file's bytes (read_param_bytes), where the caller has read them already."""
    if raw is None:
        raw = read_param_bytes(path)

    def bad(msg: str, line: Optional[int] = None) -> UsageError:
        where = f"{path}: line {line}: " if line else f"{path}: "
        return UsageError(f"{where}{msg}")

    refuse_binary_params(path, raw)
    if not raw.strip():
        raise bad("empty file, not an ncnn .param")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        # ncnn takes any bytes; pyncnn and vknorm's tools name layers and blobs by Python strings, UTF-8
        if b"\0" not in raw:
            raise bad(f"byte 0x{raw[e.start]:02x} is not UTF-8 text: vknorm reads layer and blob names as UTF-8",
                      len(_C_LINES.split(raw[:e.start].decode("utf-8")))) from None
        raise bad("not an ncnn text .param (binary data)") from None
    if "\0" in text:
        raise bad("not an ncnn text .param (binary data)")
    words = _Words(text)
    magic = words.next()
    if magic is None or _net_value(magic[1]) != MAGIC:
        raise bad(f"not an ncnn .param (it must start with the magic number {MAGIC})", magic[0] if magic else 1)
    header = [words.next(), words.next()]
    if header[0] is None:
        raise bad("garbled .param: no 'layer_count blob_count' line after the magic number")
    read = [h for h in header if h is not None]
    if len(read) < 2 or any(_net_value(w) is None for _, w in read):
        where = next((n for n, w in read if _net_value(w) is None), read[-1][0])
        raise bad(f"garbled .param: expected 'layer_count blob_count', got {' '.join(w for _, w in read)[:40]!r}",
                  where)
    assert header[0] is not None and header[1] is not None  # both read: len(read) is 2
    header_line = header[1][0]
    layer_count, blob_count = _net_value(header[0][1]), _net_value(header[1][1])
    assert layer_count is not None and blob_count is not None  # both numbers: checked above
    out_of_range = [n for (n, _), v in zip(cast("List[Tuple[int, str]]", header), (layer_count, blob_count))
                    if not 1 <= v <= _MAX_NET_COUNT]
    if out_of_range:
        raise bad(f"garbled .param: the header's layer and blob counts must be 1 to {_MAX_NET_COUNT} (ncnn refuses "
                  f"others), got {layer_count} and {blob_count}", out_of_range[0])
    produced: Dict[str, str] = {}
    layers: List[Layer] = []
    names = set()
    for k in range(layer_count):  # ncnn reads the header's count of layers and nothing after them
        first = words.next()
        if first is None:
            raise bad(f"garbled or truncated .param: the header says {layer_count} layers, the file has {k} layer "
                      "lines", header[0][0])
        n, line_text = first[0], words.line_text()
        read = [first] + [w for w in (words.next() for _ in range(3)) if w is not None]
        head = [w for _, w in read]
        wrong = next((line for line, w in read[2:] if _count(w) is None), None)
        if len(head) < 4 or wrong:
            raise bad(f"garbled layer line (expected 'type name bottom_count top_count ...'): {line_text[:60]!r}",
                      wrong or n)
        nb, nt = _count(head[2]), _count(head[3])
        assert nb is not None and nt is not None  # counts: checked (wrong) above
        blobs: List[str] = []
        params_line = n  # where the params are: the line of the layer's last word
        while len(blobs) < nb + nt and (w := words.next()) is not None:
            params_line = w[0]
            blobs.append(w[1])
        # type, name, counts and blob names, then the params: the rest of the line the last of those is on
        tok = head + blobs + _TOKEN.findall(words.rest_of_line())
        type_, name = tok[0], tok[1]
        if type_.startswith("vknorm.") and not allow_fused:  # stock ncnn, which check and bench --model run beside vknorm, cannot
            raise bad(f"layer {name!r} is {type_}, written by vknorm optimize: stock ncnn cannot run a fused "
                      f"model, so give the model from before vknorm optimize (check --vulkan and bench --model "
                      f"fuse it themselves as vknorm.graph does)", n)
        if len(blobs) < nb + nt:
            raise bad(f"garbled layer {name!r}: {nb} bottom and {nt} top blob names expected", n)
        bottoms, tops = tok[4:4 + nb], tok[4 + nb:4 + nb + nt]
        for what, word in [("type", type_), ("name", name)] + [("blob name", b) for b in bottoms + tops]:
            if len(word) > _NAME_MAX:  # ncnn reads each with %255s: the rest would be read as the next field
                whose = "a layer" if what == "name" else f"layer {name[:40]!r}{'...' if len(name) > 40 else ''}"
                raise bad(f"{whose}: its {what} {word[:40]!r}... is {len(word)} characters; ncnn reads at most "
                          f"{_NAME_MAX}", n)
        params: Dict[int, str] = {}
        for p in tok[4 + nb + nt:]:
            pm = _PARAM.fullmatch(p)
            if not pm:
                raise bad(f"garbled layer {name!r}: {p[:30]!r} is not a blob name or an id=value param "
                          f"(blob counts {nb} {nt} do not match the names?)", params_line)
            params[int(pm.group(1))] = pm.group(2)
        if name in names:
            raise bad(f"layer name {name!r} used twice", n)
        names.add(name)
        for b in bottoms:
            if b not in produced:
                raise bad(f"layer {name!r} reads blob {b!r}, which no earlier layer produces (a misspelt name? ncnn "
                          f"would take it as an input to fill: give it an Input layer for vknorm check, bench "
                          f"--model and optimize)", n)
        for t in tops:
            if t in produced:
                raise bad(f"layer {name!r} produces blob {t!r}, already produced by {produced[t]!r}", n)
            produced[t] = name
        norm = None
        if type_ in NORM_TYPES:
            if nb != 1 or nt != 1:
                raise bad(f"{type_} {name!r} must have one bottom and one top blob", n)
            values = {}
            for pid, kind in _param_kinds(type_):
                if pid in params:
                    try:
                        values[pid] = kind(params[pid])
                    except ValueError:
                        raise bad(f"{type_} {name!r}: param {pid}={params[pid]!r} is not "
                                  f"{'an integer' if kind is int else 'a number'}", n) from None
            # The values too, as vknorm's layers take them: stock ncnn runs some that are wrong (GroupNorm with
            # channels not divisible by group leaves channels out) and crashes on others (a negative affine_size)
            try:
                norm = _layer_class(type_).from_param(values)
            except ValueError as e:
                raise bad(f"{type_} {name!r}: {e}", n) from None
        layers.append(Layer(type_, name, bottoms, tops, params, n, norm))
    if len(produced) > blob_count:
        raise bad(f"garbled .param: the header says {blob_count} blobs, the layers produce {len(produced)}",
                  header_line)
    unread = words.next()
    return Model(path, text, layers, unread[0] if unread else None)


def unread_text_warnings(model: Model) -> List[str]:
    """A warning for text past the header's count of layers: ncnn loads the model without it, silently."""
    if model.unread_line is None:
        return []
    return [f"{model.path}: line {model.unread_line}: text after the header's {len(model.layers)} layers, which ncnn "
            "does not read (the header's layer count too small?)"]


# ---------------------------------------------------------------------------------------------- .bin

_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _bin_reader(data):
    """An ncnn.DataReader over the .bin bytes that counts what ncnn asks for (truncation = a short read)."""
    import ncnn  # type: ignore[import-untyped, import-not-found]  # pyncnn: no types, optional
    import numpy as np

    class BinReader(ncnn.DataReader):
        def __init__(self):
            super().__init__()
            self.buf = np.frombuffer(data, dtype=np.uint8)
            self.pos = 0
            self.short = False
            self.wanted = 0  # bytes ncnn asked for in total

        def read(self, buf, size):
            try:
                size = int(size)
                self.wanted += size
                n = max(0, min(size, self.buf.size - self.pos))
                if n < size:
                    self.short = True
                if n:
                    dst = _capsule_pointer(buf, _capsule_name(buf))
                    ctypes.memmove(dst, self.buf.ctypes.data + self.pos, n)
                self.pos += n
                return n
            except BaseException:  # noqa: BLE001 - must not reach ncnn's C++
                self.short = True
                return 0

        def scan(self, fmt, p):
            return 0

    return BinReader()


# ---------------------------------------------------------------------------------------------- runs

def _new_net(ncnn):
    net = ncnn.Net()
    o = net.opt
    o.use_vulkan_compute = False  # the reference is ncnn's CPU path
    o.lightmode = False  # keep every blob, so any blob can be extracted in any order
    o.use_fp16_packed = False
    o.use_fp16_storage = False
    o.use_fp16_arithmetic = False
    o.use_bf16_storage = False
    custom_layers.apply(ncnn, net)  # the model's own layer types (--custom-layers)
    return net


def _load(net, model: Model, bin_path: str, data: bytes, label: str) -> List[str]:
    """load_param + load_model; UsageError naming the file when ncnn refuses it. Returns warnings."""
    from .ncnn import quiet_stderr

    log: List[str] = []
    with quiet_stderr(log):
        ret = net.load_param_mem(model.text)
    if ret != 0:
        raise UsageError(f"{model.path}: ncnn could not load it (load_param returned {ret}){load_failure(model, log)}")
    reader = _bin_reader(data)
    log = []
    with quiet_stderr(log):
        ret = net.load_model(reader)
    if reader.short:
        failed = next((ln for ln in log if "layer load_model" in ln), None)
        at = f"; {failed}" if failed else ""
        raise UsageError(f"{bin_path}: truncated: {model.path} needs more than its {len(data)} bytes{at}")
    if ret != 0:
        why = f": {log[-1]}" if log else ""
        raise UsageError(f"{bin_path}: ncnn could not load the weights for {model.path} "
                         f"(load_model returned {ret}, {label} run){why}")
    return [trailing_bytes_warning(bin_path, len(data) - reader.pos, model.path)] if reader.pos < len(data) else []


_UNKNOWN_TYPE = re.compile(r"layer (\S+) not exists or registered")


def load_failure(model: Model, log: List[str]) -> str:
    """What ncnn's load_param said last, as ": ..." (or ""), a layer type ncnn does not have named by its line and
    layer (ncnn names the type alone)."""
    if not log:
        return ""
    m = _UNKNOWN_TYPE.search(log[-1])
    layer = next((layer for layer in model.layers if m and layer.type == m.group(1)), None)
    if layer is None:
        return f": {log[-1]}"
    if custom_layers.used():
        hint = f" (nor vknorm's layers; --custom-layers {custom_layers.used()} did not register it)"
    elif custom_layers.offered():  # check, bench --model, optimize: the flag that registers it
        hint = " (nor vknorm's layers) (--custom-layers FILE.py registers a model's own types)"
    else:
        hint = " (nor vknorm's layers)"
    return f": line {layer.line}: layer {layer.name!r} is of type {layer.type!r}, which this ncnn does not have{hint}"


def trailing_bytes_warning(bin_path: str, extra: int, param_path: str) -> str:
    """What a .bin holding more than its .param's layers read says (check, optimize)."""
    return f"{bin_path}: {extra} bytes after the weights {param_path} reads (a .bin for another .param?)"


def _last_line(captured) -> str:
    """": <the last line ncnn logged so far>", or "" (captured: quiet_stderr's function)."""
    lines = captured()
    return f": {lines[-1]}" if lines else ""


def _extract(net, inputs: dict, blobs: List[str], label: str, reg=None) -> dict:
    import ncnn
    import numpy as np

    from .ncnn import quiet_stderr

    out = {}
    ex = net.create_extractor()
    try:
        mats = {}
        with quiet_stderr() as captured:
            for name, arr in inputs.items():
                mats[name] = input_mat(ncnn.Mat, arr).clone()
                ret = ex.input(name, mats[name])
                if ret != 0:
                    raise UsageError(f"--input {name}: ncnn refused the input (returned {ret})")
            for b in blobs:
                if b in out:
                    continue
                ret, mat = ex.extract(b)
                if ret != 0:
                    errs = reg.errors() if reg is not None else []
                    if errs:
                        lname, e = errs[0]
                        raise UsageError(f"vknorm layer {lname!r} failed ({label} run, {_input_shapes(inputs)}): "
                                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                    raise UsageError(f"ncnn could not run the model on the given --input shapes "
                                     f"({label} run, extracting blob {b!r} returned {ret}){_last_line(captured)}"
                                     f"{custom_layers.suspect()}")
                out[b] = np.array(mat, dtype=np.float32, copy=True)
                del mat
    finally:
        del ex
    return out


def _abs_diff(a, b):
    """|a - b| element by element in float64 (same shapes): 0 where equal or both NaN, inf where one side alone
    is NaN/inf."""
    import numpy as np

    a = a.astype(np.float64)
    b = b.astype(np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, made inf below
        d = np.where(same, 0.0, np.abs(a - b))
    return np.where(np.isnan(d), np.inf, d)


def _nonfinite_warnings(ref: dict, blobs: List[str]) -> List[str]:
    """Blobs that stock ncnn's CPU run itself leaves NaN/inf (bad weights or inputs): where another run has
    them too they count as equal, so an "ok" there says nothing of those values; the report says so."""
    import numpy as np

    out = []
    for b in dict.fromkeys(blobs):
        bad = int(np.count_nonzero(~np.isfinite(ref[b])))
        if bad:
            out.append(f"blob {b!r}: {bad} of {ref[b].size} values are NaN/inf in stock ncnn's CPU run itself (the "
                       "weights? the inputs?); where the other runs have them too they count as equal")
    return out


def _input_shapes(inputs: dict) -> str:
    """The --input flags that made these arrays, as a crash in the forked child names them too."""
    from ._fork import input_flags

    return input_flags({k: v.shape if v.size else () for k, v in inputs.items()})


def require_repeatable(ref: dict, again: dict, inputs: dict) -> None:
    """Stock ncnn's CPU layers give every blob bit for bit again on the same input, or the --input shapes do not
    fit the model (a layer reading past its blob gives whatever memory holds, differing from run to run):
    UsageError."""
    import numpy as np

    for b, a in ref.items():
        if a.shape != again[b].shape or not np.array_equal(a, again[b], equal_nan=True):
            raise UsageError(f"blob {b!r} differs between two runs of stock ncnn's CPU layers on the same input "
                             f"({_input_shapes(inputs)}), so a layer reads memory it was not given: do the --input "
                             "shapes match what the model takes?")


def _require_finite_norm_inputs(model: Model, ref: dict, inputs: dict) -> None:
    """Every norm layer has some finite input in stock ncnn's CPU run, or there is nothing to judge it on (--input
    shapes the model does not take, or NaN/inf weights upstream): UsageError."""
    import numpy as np

    for layer in model.norms:
        if not np.isfinite(ref[layer.bottoms[0]]).any():
            raise UsageError(f"{layer.type} {layer.name!r}: every value of its input {layer.bottoms[0]!r} is NaN/inf "
                             f"in stock ncnn's CPU run ({_input_shapes(inputs)}): nothing to judge it on (NaN/inf "
                             "weights upstream? do the --input shapes match what the model takes?)")


def max_abs_err(a, b) -> float:
    """max |a - b|; inf when shapes differ or one side alone is NaN/inf."""
    if a.shape != b.shape:
        return math.inf
    d = _abs_diff(a, b)
    return float(d.max()) if d.size else 0.0


def _prepare(param_path: str, bin_path: str, input_specs: Dict[str, Tuple[int, ...]]) -> Tuple[Model, bytes]:
    """Parse the .param, match the --input names to its inputs, read the .bin (UsageError otherwise)."""
    model = parse_model_inputs(param_path, input_specs)
    require_distinct(param_path, bin_path)
    data = _read_file(bin_path, "model .bin")
    return model, data


def parse_model_inputs(param_path: str, input_specs: Dict[str, Tuple[int, ...]]) -> Model:
    """Parse the .param and check that the --input names are exactly its inputs (UsageError otherwise)."""
    model = parse_param(param_path)
    for name in input_specs:
        if name not in model.inputs:
            have = ", ".join(model.inputs) or "none"
            raise UsageError(f"--input {name}={dims_text(input_specs[name])}: {param_path} has no input "
                             f"named {name!r} (its inputs: {have})")
    missing = [name for name in model.inputs if name not in input_specs]
    if missing:
        raise UsageError(f"--input: no shape for the model's input {missing[0]!r}; give --input "
                         f"{missing[0]}=DIMS ({_DIMS_HELP})")
    _check_past_kv_caches(model, input_specs)
    _check_layers_on_inputs(model, input_specs)
    return model


def _is_kv_cache_layer(layer: Layer) -> bool:
    """ncnn's kv-cache form of SDPA or MultiHeadAttention (7=1, kv_cache on): three tops, its output and the two
    caches it grows, the past caches read as its last two bottoms. (vknorm.graph, which has ncnn's loaded layers and
    not their params, reads kv_cache from the flag it sets, support_batch.)"""
    return (layer.type in ("SDPA", "MultiHeadAttention") and _int_param(layer, 7, 0) not in (0, None)
            and len(layer.tops) == 3 and len(layer.bottoms) >= 3)


def kv_cache_outputs(model: Model) -> set:
    """The kv caches the model's attention layers grow (their second and third tops): on the CPU in ncnn's own layout
    (x86 packs the keys in panels, their unused slots never written), pyncnn's Vulkan MultiHeadAttention's still
    packed by 4; a decoder gives them back to its next step as they came, never reads them as values."""
    return {t for layer in model.layers if _is_kv_cache_layer(layer) for t in layer.tops[1:]}


def split_outputs(model: Model, net) -> Tuple[List[str], List[str]]:
    """The net's outputs to judge, and those that are the kv caches it grows (kv_cache_outputs): not values to
    compare (a result lists them as "kv_caches")."""
    caches = kv_cache_outputs(model)
    outputs = list(net.output_names())
    return [b for b in outputs if b not in caches], [b for b in outputs if b in caches]


def judged_outputs(model: Model, net) -> List[str]:
    return split_outputs(model, net)[0]


def kv_caches_line(result: dict) -> List[str]:
    caches = result.get("kv_caches")
    return [f"kv caches not judged (ncnn's own layout on the CPU; a decoder gives them back): {', '.join(caches)}"] \
        if caches else []


def _readers(model: Model) -> Dict[str, List[Layer]]:
    """The layers reading each blob, in model order."""
    readers: Dict[str, List[Layer]] = {}
    for layer in model.layers:
        for b in layer.bottoms:
            readers.setdefault(b, []).append(layer)
    return readers


def _reads_as_past(layer: Layer, blob: str) -> bool:
    """Whether the layer reads blob (one of its bottoms) only as a past kv cache: among its last two bottoms alone."""
    return _is_kv_cache_layer(layer) and blob not in layer.bottoms[:-2]


def past_kv_caches(model: Model) -> Dict[str, Layer]:
    """The blobs read only as a past kv cache (_is_kv_cache_layer), by the layer reading them."""
    return {b: r[0] for b, r in _readers(model).items() if all(_reads_as_past(layer, b) for layer in r)}


def _check_past_kv_caches(model: Model, input_specs: Dict[str, Tuple[int, ...]]) -> None:
    """An empty input only where ncnn's kv-cache layer reads it as its past (any other layer crashes on it), and
    a past kv cache only empty: ncnn lays a cache out its own way (on x86 the keys in panels, read past the rows a
    random array has), so the one a tool can give is a decoder's first step's (UsageError otherwise)."""
    readers = _readers(model)
    for layer in model.layers:  # ncnn frees kv-cache memory as layers read it: their blobs could not all be compared
        for t in layer.tops[1:] if _is_kv_cache_layer(layer) else []:
            if t in readers:
                reader = readers[t][0]
                raise UsageError(f"{reader.type} {reader.name!r} ({model.path} line {reader.line}) reads the kv cache "
                                 f"{t!r} of {layer.type} {layer.name!r}: check and bench --model do not run models "
                                 "whose kv caches feed other layers (ncnn frees kv-cache memory as it is read)")
    past = past_kv_caches(model)
    for name, dims in input_specs.items():
        if not dims and name not in past:
            first = readers.get(name, [None])[0]
            by = f"{first.type} {first.name!r} reads it" if first else "no layer reads it"
            raise UsageError(f"--input {name}=empty: only a past kv cache may be empty (read alone as one of the last "
                             f"two inputs of an SDPA or MultiHeadAttention with kv_cache on); {by}")
        if dims and name in past:
            layer = past[name]
            raise UsageError(f"--input {name}={dims_text(dims)}: {layer.type} {layer.name!r} ({model.path} line "
                             f"{layer.line}) reads it as a past kv cache, which ncnn lays out its own way (an earlier "
                             f"step's cache, given back as it came); run a decoder's first step: --input {name}=empty")


# Layers whose one output has their one input's shape: a norm after them still reads the --input shape.
_SHAPE_KEEPING = {"Split", "ReLU", "Sigmoid", "Swish", "GELU", "TanH", "Clip", "Dropout", "ELU", "SELU", "HardSigmoid",
                  "HardSwish", "Mish", "UnaryOp", "AbsVal", "BNLL", "Noop", "BatchNorm", "Power", "Exp", "Log",
                  "Threshold", "PReLU", "Erf", "Softplus"}


def _int_param(layer: Layer, pid: int, default: int) -> Optional[int]:
    """An integer param as ncnn reads it, None where it is not one (ncnn then refuses or defaults: not judged)."""
    text = layer.params.get(pid)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        return None


def _weights_read(layer: Layer, shape: Tuple[int, ...]) -> Optional[Tuple[int, int, str]]:
    """For a layer with weights that ncnn indexes by its input's size: (what the weights take, what the blob of
    this shape gives, in what), or None where they agree or the layer is not one of these. InnerProduct takes
    weight_data_size / num_output values per row of a dims-2 blob, or the whole blob flattened; Convolution and
    ConvolutionDepthWise, on a dims-3 blob, weight_data_size / (kernel_w * kernel_h * num_output) channels
    (times group for the depthwise); BatchNorm, and PReLU of more than one slope, a value per channel (param 0).
    ncnn's CPU layers index their weights by the blob, so any other size reads past them or misses some:
    garbage, NaN or a crash, never an error."""
    num_output = _int_param(layer, 0, 0)
    if layer.type == "InnerProduct":
        size = _int_param(layer, 2, 0)
        if not num_output or not size or num_output <= 0 or size <= 0 or size % num_output:
            return None  # ncnn refuses the load itself
        takes = size // num_output
        gives = shape[-1] if len(shape) == 2 and shape[-1] == takes else math.prod(shape)
        return None if gives == takes else (takes, gives, "values")
    if layer.type in ("BatchNorm", "PReLU"):  # a weight per channel (ncnn's: w, h or c, the outermost extent)
        count = _int_param(layer, 0, 0)
        if count is None or count <= (1 if layer.type == "PReLU" else 0):
            return None  # PReLU's one slope serves every channel
        return None if shape[0] == count else (count, shape[0], "channels")
    if layer.type in ("Convolution", "ConvolutionDepthWise") and len(shape) == 3 and _int_param(layer, 19, 0) == 0:
        # (19=1: dynamic weights, a second input, which the params do not describe)
        kernel_w = _int_param(layer, 1, 0)
        kernel_h = _int_param(layer, 11, kernel_w or 0)
        size = _int_param(layer, 6, 0)
        group = _int_param(layer, 7, 1) if layer.type == "ConvolutionDepthWise" else 1
        # min sees no None (the `None in` test comes first), which mypy cannot narrow: ignored there, asserted below
        if (None in (num_output, kernel_w, kernel_h, size, group)
                or min(num_output, kernel_w, kernel_h, size, group) <= 0):  # type: ignore[type-var, operator, misc]
            return None
        assert num_output is not None and kernel_w is not None and kernel_h is not None
        assert size is not None and group is not None
        per_channel = kernel_w * kernel_h * num_output
        if (size * group) % per_channel:
            return None
        takes = size * group // per_channel
        return None if shape[0] == takes else (takes, shape[0], "channels")
    return None


def _check_layers_on_inputs(model: Model, input_specs: Dict[str, Tuple[int, ...]]) -> None:
    """A layer that stock ncnn would run past its blob or its weights, fed the --input shape (directly, or
    through Splits and element-wise layers), is refused first, naming the layer and both sizes (UsageError).
    Stock ncnn's layers read past their blobs: its GroupNorm reads as many channels as its param says (fewer in
    the blob: it hangs or crashes; behind layers this does not follow, refuse_norm_channel_mismatch),
    its InstanceNorm with weights reads a gamma per channel of the blob (more channels than its param: past gamma),
    an InnerProduct, a convolution, BatchNorm or PReLU reads its weights by the blob's size (_weights_read), and a
    MultiHeadAttention reads a dims-3/4 blob by its rows alone (what lies past them decided the outcome, run to
    run). Other mismatches are vknorm's layers' to report when they run."""
    from .layers import GroupNorm, InstanceNorm

    source = {name: name for name in input_specs}  # blob -> the input whose shape it has
    for layer in model.layers:  # in the .param's order: producers first
        if not layer.bottoms or layer.bottoms[0] not in source:
            continue
        given = source[layer.bottoms[0]]
        shape = input_specs[given]
        dims = "x".join(map(str, shape))
        where = f"{layer.type} {layer.name!r} ({model.path} line {layer.line})"
        if layer.type in _SHAPE_KEEPING and len(layer.bottoms) == 1:
            source.update((t, given) for t in layer.tops)
        elif layer.type in ("LayerNorm", "RMSNorm"):  # shape-keeping; their own mismatches are theirs to report
            source.update((t, given) for t in layer.tops)
        elif layer.type == "MultiHeadAttention" and len(shape) > 2:
            # ncnn's attention takes a sequence of rows: of a dims-3/4 blob it reads as much as its rows say, and
            # whatever lies past them decides the result (a crash, runs that differ, NaN, or a verdict on garbage)
            raise UsageError(f"--input {given}={dims}: {where} takes a sequence of rows (dims 1-2), this shape has "
                             f"{len(shape)} dims: do the --input shapes match what the model takes?")
        elif layer.type in ("GroupNorm", "InstanceNorm"):
            norm = layer.norm
            # the blob's channels as ncnn's layer counts them (numpy order): GroupNorm's are w, the rows or c, the
            # outermost extent in every dims; InstanceNorm's c, a dims 1-2 blob being one channel
            has = 1 if isinstance(norm, InstanceNorm) and len(shape) <= 2 else shape[0]
            past = has < norm.channels if isinstance(norm, GroupNorm) else (norm.affine and has > norm.channels)
            if past:
                raise UsageError(f"--input {given}={dims}: {where} reads it as {has} channel(s), its param says "
                                 f"{norm.channels}: stock ncnn would read past the blob")
        if layer.type in ("InnerProduct", "Convolution", "ConvolutionDepthWise", "BatchNorm", "PReLU"):
            wrong = _weights_read(layer, shape)
            if wrong:
                takes, gives, what = wrong
                per_row = " (per row of a 2-dims input, or in all)" if layer.type == "InnerProduct" else ""
                raise UsageError(f"--input {given}={dims}: {where}: its weights take {takes} input {what}{per_row}, "
                                 f"this shape gives {gives}: stock ncnn would read past or short of them")


def check_model(param_path: str, bin_path: str, input_specs: Dict[str, Tuple[int, ...]], fp16: bool = False,
                seed: int = 0, atol: Optional[float] = None) -> dict:
    """The whole check; returns the JSON-able result (UsageError for file/flag problems)."""
    import numpy as np

    if atol is None:
        atol = ATOL_FP16 if fp16 else ATOL_FP32
    model, data = _prepare(param_path, bin_path, input_specs)
    require_settings()  # vknorm's layers read them in the vknorm run: a bad one, said as itself

    try:
        import ncnn
    except ImportError as e:  # pragma: no cover - ncnn is a dependency of the check
        raise UsageError(f"vknorm check needs pyncnn: pip install ncnn ({e})") from None
    from . import _core
    from . import ncnn as vkncnn
    from .layers import Option, device_info

    result: Dict[str, Any]  # the JSON report
    result = {"ok": True, "device": None, "layers": [], "outputs": {}, "model": param_path, "weights": bin_path,
              "inputs": {k: list(v) for k, v in input_specs.items()}, "fp16": bool(fp16), "seed": seed,
              "atol": atol, "warnings": unread_text_warnings(model), "rule": _rule(fp16, atol, vulkan=False)}

    if fp16 and model.norms:
        device = device_info()
        if not device["storage_16bit"]:
            # vknorm's layers would store float32 there: judged by the float16 rule, the run would be mislabelled
            raise UsageError(f"--fp16: {device['name']} has no 16-bit storage (vknorm's layers would store float32); "
                             "check without --fp16, or with --vulkan to run ncnn's own float16 choice")
    stock = _new_net(ncnn)
    try:
        result["warnings"] += _load(stock, model, bin_path, data, "stock")
        if not model.norms:
            result["note"] = f"{param_path}: no LayerNorm, RMSNorm, GroupNorm or InstanceNorm layers, nothing to check"
            try:
                result["device"] = device_info()["name"]
            except (_core.VulkanUnavailableError, ValueError):
                result["device"] = "none"
            return result
        outputs, caches = split_outputs(model, stock)
        if caches:
            result["kv_caches"] = caches
        rng = np.random.default_rng(seed)
        inputs = random_inputs(rng, input_specs, model.inputs)
        norm_blobs = [layer.tops[0] for layer in model.norms]
        seen = list(dict.fromkeys([layer.bottoms[0] for layer in model.norms] + norm_blobs + outputs))
        refuse_norm_channel_mismatch(model, bin_path, len(data), inputs)
        ref = _extract(stock, inputs, seen, "stock")
        # again in a net of its own (fresh blob memory: a read past a blob finds other bytes than the first run's)
        again = _new_net(ncnn)
        try:
            _load(again, model, bin_path, data, "stock")
            require_repeatable(ref, _extract(again, inputs, seen, "stock, again"), inputs)
        finally:
            with vkncnn.quiet_stderr():
                again.clear()
            del again
        _require_finite_norm_inputs(model, ref, inputs)
        result["warnings"] += _nonfinite_warnings(ref, norm_blobs + outputs)
    finally:
        with vkncnn.quiet_stderr():  # ncnn may complain here about a forward that failed ("pool allocator ...")
            stock.clear()
        del stock

    try:
        result["device"] = device_info()["name"]
    except ValueError as e:  # e.g. VKNORM_DEVICE names no device
        raise UsageError(str(e)) from None
    net = _new_net(ncnn)
    try:
        try:
            reg = vkncnn.register(net, Option(use_fp16_storage=fp16))
        except vkncnn.FactoryLimitError as e:
            raise UsageError(str(e)) from None
        try:
            _load(net, model, bin_path, data, "vknorm")
        finally:
            bad = reg.errors()
            if bad:  # our layer refused its params / weights / pipeline: say which and why
                error = bad[0][1]
                raise UsageError(f"vknorm layer {bad[0][0]!r} could not load: {type(error).__name__}: "
                                 f"{(str(error).splitlines() or [''])[0]}") from None
        # The bottoms too: the input each vknorm layer saw, which the pass rule judges it on (judge_layer).
        vk_blobs = [layer.bottoms[0] for layer in model.norms] + norm_blobs + outputs
        _extract(net, inputs, vk_blobs, "vknorm warm-up", reg)  # pipelines, driver caches
        got = _extract(net, inputs, vk_blobs, "vknorm", reg)
        for layer in model.norms:
            vk = reg.by_name(layer.name)
            rec = vk.record() if vk is not None else {"name": layer.name, "type": layer.type, "shape": None,
                                                      "gpu_us": None}
            blob = layer.tops[0]
            err = max_abs_err(ref[blob], got[blob])
            rec["shape"] = list(ref[blob].shape)
            rec["max_abs_err"] = err if math.isfinite(err) else None
            rec["ok"] = False
            norm = vk.norm if vk is not None else None
            if norm is None:
                result["warnings"].append(f"layer {layer.name!r}: ncnn did not create vknorm's {layer.type} for it")
            else:
                has_beta = layer.type != "RMSNorm"  # then norm is one with a beta (the cast below)
                f64, judged, rec["ok"] = judge_layer(
                    got[blob], got[layer.bottoms[0]], layer.type, float(norm.eps), int(norm.affine_size),
                    norm.gamma if norm.affine else None,
                    cast("_GammaBetaNorm", norm).beta if norm.affine and has_beta else None, fp16, atol,
                    group=int(getattr(norm, "group", 1)))
                rec["f64_abs_err"], rec["judged_err"] = _finite_or_none(f64), _finite_or_none(judged)
            result["layers"].append({k: rec.get(k) for k in ("name", "type", "shape", "group_size", "groups",
                                                               "max_abs_err", "f64_abs_err", "judged_err",
                                                               "gpu_us", "ok")})
        for name in outputs:
            err = max_abs_err(ref[name], got[name])
            result["outputs"][name] = err if math.isfinite(err) else None
    finally:
        with vkncnn.quiet_stderr():
            net.clear()
        del net
    result["ok"] = all(rec["ok"] for rec in result["layers"])
    if _core.validation_enabled():
        result["validation_messages"] = len(_core.validation_messages())
    return result


# ---------------------------------------------------------------------------------------------- --vulkan

def _import_graph():
    """vknorm.graph (ncnn compiled into vknorm); UsageError when vknorm was built without it."""
    try:
        from . import graph
    except ImportError as e:
        msg = (str(e).splitlines() or [""])[0]
        if "built without" not in msg:
            msg = f"vknorm was built without its ncnn layers (vknorm.graph: {msg or type(e).__name__})"
        raise UsageError(f"--vulkan needs vknorm.graph: {msg}") from None
    return graph


def _rule(fp16: bool, atol: float, vulkan: bool = True) -> str:
    """judge_layer's rule in words (and, for --vulkan, no host round trips)."""
    tail = (f"; no host round trips; each model output within {OUTPUT_SLACK:g}x stock ncnn Vulkan's max |error| "
            f"against the CPU run + atol x max(1, max |CPU output|)" if vulkan else "")
    if fp16:
        return (f"fp16: each vknorm layer's max |y - float64 of the float16-rounded input it saw| less float16 "
                f"output rounding (half the float16 spacing at the output's value), over max(1, |float64 value|, |gamma x^| + |beta|), <= "
                f"atol {atol:g}{tail}")
    return (f"fp32: each vknorm layer's max |y - float64 of the input it saw| over max(1, |float64 value|, |gamma x^| + |beta|) <= atol "
            f"{atol:g}{tail}")


def _graph_load(graph, model: Model, bin_path: str, nbytes: int, *, vknorm: bool, vulkan: bool, fp16: bool,
                label: str, fuse: bool = False):
    """A vknorm.graph net (lightmode off: every blob stays extractable) with the model loaded."""
    with quiet_stderr():  # registering vknorm's layers: ncnn says "overwrite built-in layer type ..."
        net = graph.configure(graph.Net(vknorm=vknorm, fuse=fuse), vulkan=vulkan, fp16=fp16, lightmode=False)
    custom_layers.apply(graph, net)  # the model's own layer types (--custom-layers)
    log: List[str] = []
    with quiet_stderr(log):
        ret = net.load_param(model.path)
    if ret != 0:
        raise UsageError(f"{model.path}: ncnn could not load it (load_param returned {ret}, {label} run)"
                         f"{load_failure(model, log)}")
    log = []
    with quiet_stderr(log):
        ret = net.load_model(bin_path)
    if ret != 0:
        failed = next((ln for ln in log if "layer load_model" in ln), None)
        at = f"; {failed}" if failed else ""
        if any("ModelBin read" in ln for ln in log):
            raise UsageError(f"{bin_path}: truncated: {model.path} needs more than its {nbytes} bytes{at}")
        why = f": {log[-1]}" if log else ""
        raise UsageError(f"{bin_path}: ncnn could not load the weights for {model.path} "
                         f"(load_model returned {ret}, {label} run){why}")
    return net


def _graph_extract(graph, net, inputs: dict, blobs: List[str], label: str) -> dict:
    import numpy as np

    out = {}
    ex = net.create_extractor()
    try:
        with quiet_stderr() as captured:
            for name, arr in inputs.items():
                ret = ex.input(name, input_mat(graph.Mat, arr))
                if ret != 0:
                    raise UsageError(f"--input {name}: ncnn refused the input (returned {ret}, {label} run)")
            for b in blobs:
                if b in out:
                    continue
                ret, mat = ex.extract(b)
                if ret != 0:
                    said = _last_line(captured)
                    if said.startswith(": vknorm "):  # one of vknorm's layers refused: it says why
                        raise UsageError(f"a vknorm layer refused the model ({label} run, extracting blob {b!r} "
                                         f"returned {ret}){said}")
                    raise UsageError(f"ncnn could not run the model on the given --input shapes "
                                     f"({label} run, extracting blob {b!r} returned {ret}){said}"
                                     f"{custom_layers.suspect()}")
                out[b] = np.array(mat).astype(np.float32, copy=True)
                del mat
    finally:
        del ex
    return out


def stock_cpu_reference(graph, cpu, model: Model, bin_path: str, nbytes: int, inputs: dict, blobs: List[str]) -> dict:
    """Stock ncnn's CPU run of the inputs on `cpu` (a vknorm.graph net, lightmode off), `blobs` extracted, judged as
    check judges it: the same run in a net of its own, loaded beside `cpu` (fresh blob memory: a read past a blob
    finds other bytes than the first run's) and gone after, must give every blob bit for bit again
    (require_repeatable), and every norm's input must hold some finite value (_require_finite_norm_inputs). Either
    failing means --input shapes the model does not take: UsageError."""
    ref = _graph_extract(graph, cpu, inputs, blobs, "ncnn CPU")
    again = _graph_load(graph, model, bin_path, nbytes, vknorm=False, vulkan=False, fp16=False, label="ncnn CPU, again")
    try:
        require_repeatable(ref, _graph_extract(graph, again, inputs, blobs, "ncnn CPU, again"), inputs)
    finally:
        with quiet_stderr():
            again.clear()
    _require_finite_norm_inputs(model, ref, inputs)
    return ref


def refuse_unrepeatable_stock_run(model: Model, bin_path: str, nbytes: int, inputs: dict) -> None:
    """What check refuses to judge, bench --model refuses to time: stock_cpu_reference of every blob a norm reads or
    writes and every output (UsageError)."""
    from . import graph
    from ._fork import SHAPES, stage

    stage("stock ncnn's CPU runs", SHAPES)
    cpu = _graph_load(graph, model, bin_path, nbytes, vknorm=False, vulkan=False, fp16=False, label="ncnn CPU")
    try:
        blobs = [b for layer in model.norms for b in (layer.bottoms[0], layer.tops[0])] + judged_outputs(model, cpu)
        stock_cpu_reference(graph, cpu, model, bin_path, nbytes, inputs, blobs)
    finally:
        with quiet_stderr():
            cpu.clear()


def refuse_norm_channel_mismatch(model: Model, bin_path: str, nbytes: int, inputs: dict) -> None:
    """Where a model has a GroupNorm or InstanceNorm: one inference with vknorm's layers on ncnn's CPU before any
    stock run. vknorm's layers refuse a blob of other channels than their params say (UsageError naming the layer
    and both counts), where stock ncnn's read past it, a crash or a spin in OpenMP that never returns, and the
    --input shape can reach them through layers that _check_layers_on_inputs does not follow (a Concat). The net
    is gone before the stock nets run. Nothing to do without vknorm.graph (a build without ncnn)."""
    if not any(layer.type in ("GroupNorm", "InstanceNorm") for layer in model.norms):
        return
    try:
        from . import graph
    except ImportError:
        return
    from ._fork import SHAPES, stage

    label = "vknorm's channel check on ncnn's CPU"
    stage(label, SHAPES)
    net = _graph_load(graph, model, bin_path, nbytes, vknorm=True, vulkan=False, fp16=False, label=label)
    try:
        _graph_extract(graph, net, inputs, judged_outputs(model, net), label)
    finally:
        with quiet_stderr():
            net.clear()
        del net


def _time_inferences(graph, nets: Dict[str, Any], inputs: dict, outputs: List[str], min_rounds: int = 3,
                     max_rounds: int = 15, budget_s: float = 1.0) -> Tuple[Dict[str, float], int]:
    """Wall ms per inference of each net (lightmode on): a new extractor, the inputs from numpy, every
    output back to numpy; one warm-up each, then interleaved rounds (at least min_rounds, more while
    under budget_s, at most max_rounds); the median."""
    import statistics
    import time

    import numpy as np

    def once(label, net):
        ex = net.create_extractor()
        try:
            for name, x in inputs.items():
                if ex.input(name, input_mat(graph.Mat, x)) != 0:
                    raise UsageError(f"--input {name}: ncnn refused the input ({label} timing run)")
            for name in outputs:
                ret, m = ex.extract(name)
                if ret != 0:
                    raise UsageError(f"ncnn could not run the model ({label} timing run, extracting {name!r} "
                                     f"returned {ret})")
                np.array(m)
        finally:
            del ex

    for net in nets.values():
        net.opt.lightmode = True  # each extractor copies the net's options when it is created
    with quiet_stderr():
        for label, net in nets.items():
            once(label, net)
        samples: Dict[str, List[float]] = {k: [] for k in nets}
        start = time.perf_counter()
        rounds = 0
        while rounds < max_rounds and (rounds < min_rounds or time.perf_counter() - start < budget_s):
            for label, net in nets.items():
                t0 = time.perf_counter()
                once(label, net)
                samples[label].append((time.perf_counter() - t0) * 1e3)
            rounds += 1
    return {k: round(statistics.median(v), 4) for k, v in samples.items()}, rounds


def _timing_context(device_name: str):
    """vknorm's own Vulkan context on the device ncnn runs on (by name); (context, warning or None)."""
    from . import _core

    devs = _core.devices()
    idx = next((d["index"] for d in devs if d["name"] == device_name), None)
    if idx is None:
        ctx = _core.Context.default()
        return ctx, (f"vknorm's kernel times (gpu_us) are on {ctx.info['name']}: no vknorm device is named "
                     f"{device_name!r}, ncnn's device")
    if idx == _core.default_device_index():
        return _core.Context.default(), None
    return _core.Context.create(idx), None


def _norm_of(info: dict, opt, ctx):
    """vknorm's layer for a layer record of the in-graph run (its params, weights and fused activation)."""
    from .layers import GroupNorm, InstanceNorm, LayerNorm, RMSNorm

    common = dict(eps=float(info["eps"]), affine=bool(info["affine"]), option=opt, device=ctx)
    norm: Union[GroupNorm, InstanceNorm, LayerNorm, RMSNorm]
    if info["type"] == "GroupNorm":
        norm = GroupNorm(group=int(info["group"]), channels=int(info["channels"]), **common)
    elif info["type"] == "InstanceNorm":
        norm = InstanceNorm(channels=int(info["channels"]), **common)
    else:
        norm = (LayerNorm if info["type"] == "LayerNorm" else RMSNorm)(affine_size=int(info["affine_size"]), **common)
    if norm.affine:
        if info["type"] == "RMSNorm":
            norm.load_model(info["gamma"])
        else:  # not RMSNorm: gamma and beta
            cast("Union[GroupNorm, InstanceNorm, LayerNorm]", norm).load_model(info["gamma"], info["beta"])
    if int(info.get("activation_type", 0)):  # a fused layer's activation, in the same kernel
        names = {v: k for k, v in norm.ACTIVATIONS.items()}
        norm.set_activation(names[int(info["activation_type"])], float(info.get("activation_alpha", 0.0)))
    return norm


def _groups_of(info: dict, x) -> dict:
    """The group split of the blob x by the layer's params (no device memory)."""
    from .layers import Option

    return _norm_of(info, Option(), "cpu").groups(x.shape)


def _kernel_gpu_us(info: dict, x, fp16: bool, ctx, repeats: int = 3, residual=None,
                   write_sum: bool = False) -> Optional[float]:
    """vknorm's kernel time for the blob x with the layer's params and weights, on vknorm's own context:
    to_device + forward_inplace (a fused add: forward_add of x and residual, writing the sum where the layer
    does), median of ``repeats`` after one warm-up."""
    import statistics

    import numpy as np

    from .layers import Option, to_device

    opt = Option(use_fp16_storage=fp16)
    norm = _norm_of(info, opt, ctx)
    norm.create_pipeline(opt, ctx)
    x = np.ascontiguousarray(x, dtype=np.float32)
    r = None if residual is None else to_device(np.ascontiguousarray(residual, dtype=np.float32), opt, device=ctx)
    times = []
    for i in range(repeats + 1):
        vk = to_device(x, opt, device=ctx)
        if r is None:
            norm.forward_inplace(vk, option=opt)
        else:
            out = norm.forward_add(vk, r, return_sum=write_sum, option=opt)
            del out
        if i:
            times.append(float(norm.last_dispatch["gpu_us"]))
        del vk
    return statistics.median(times) if times else None


def _ncnn_group_size(shape, affine_size: int) -> int:
    """ncnn's LayerNorm/RMSNorm group for a numpy shape (w), (h, w), (c, h, w), (c, d, h, w)."""
    if len(shape) <= 2:
        return shape[-1]
    w, h = shape[-1], shape[-2]
    if affine_size == w:
        return w
    if len(shape) == 4 and affine_size == w * h:
        return w * h
    return math.prod(shape[1:])


def _reference64(x, op: str, eps: float, affine_size: int, gamma=None, beta=None, group: int = 1,
                 with_terms: bool = False):
    """float64 of one norm layer on x, grouped as ncnn groups it (independent of vknorm's own grouping).
    with_terms: also |gamma x^| + |beta| per element, the terms the output sums (|y| without weights)."""
    import numpy as np

    x = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        if op in ("GroupNorm", "InstanceNorm"):
            # channels: w (dims 1), rows (dims 2), c (dims 3/4); InstanceNorm: a dims 1-2 blob is one channel
            c = 1 if op == "InstanceNorm" and x.ndim <= 2 else x.shape[0]
            g = x.reshape(c if op == "InstanceNorm" else group, -1)
            y = ((g - g.mean(1, keepdims=True)) / np.sqrt(g.var(1, keepdims=True) + eps)).reshape(c, -1)
            w, b = (None, None) if gamma is None else (np.asarray(gamma, np.float64)[:c, None],
                                                       np.asarray(beta, np.float64)[:c, None])
        else:
            g = x.reshape(-1, _ncnn_group_size(x.shape, affine_size))
            if op == "LayerNorm":
                y = (g - g.mean(1, keepdims=True)) / np.sqrt(g.var(1, keepdims=True) + eps)
            else:
                y = g / np.sqrt((g * g).mean(1, keepdims=True) + eps)
            w = None if gamma is None else np.asarray(gamma, np.float64)
            b = None if gamma is None or op != "LayerNorm" or beta is None else np.asarray(beta, np.float64)
        scaled = y if w is None else y * w
        out = (scaled if b is None else scaled + b).reshape(x.shape)
        if not with_terms:
            return out
        return out, (np.abs(scaled) + (0.0 if b is None else np.abs(b))).reshape(x.shape)
    g = x.reshape(-1, _ncnn_group_size(x.shape, affine_size))
    with np.errstate(all="ignore"):
        if op == "LayerNorm":
            y = (g - g.mean(1, keepdims=True)) / np.sqrt(g.var(1, keepdims=True) + eps)
        else:
            y = g / np.sqrt((g * g).mean(1, keepdims=True) + eps)
        if gamma is not None:
            y = y * np.asarray(gamma, np.float64)
            if op == "LayerNorm" and beta is not None:
                y = y + np.asarray(beta, np.float64)
    return y.reshape(x.shape)


def half_fp16_spacing(ref):
    """Half the float16 spacing at each |ref| (the most that rounding ref to float16 moves it): 2^(e - 11)
    in the binade [2^e, 2^(e+1)), 2^-25 among float16's subnormals (below 2^-14)."""
    import numpy as np

    a = np.abs(np.asarray(ref, np.float64))
    with np.errstate(all="ignore"):
        e = np.floor(np.log2(np.maximum(a, 2.0 ** -14)))
    return np.where(np.isfinite(a), np.exp2(e - 11.0), np.inf)


def _excess(y, ref, rounding=0.0, relative: bool = False, terms=0.0) -> float:
    """max(|y - ref| - rounding, 0): the error that output storage (float16: rounding = half_fp16_spacing(y);
    float32: 0) does not explain; relative: each element's over max(1, |ref|, terms) (float32's own rounding grows
    with the value, and with the terms that summed to it: terms, per element, where they cancel); inf when shapes
    differ or one side alone is NaN/inf."""
    import numpy as np

    if y.shape != ref.shape:
        return math.inf
    y = y.astype(np.float64)
    with np.errstate(all="ignore"):
        same = (y == ref) | (np.isnan(y) & np.isnan(ref))
        d = np.where(same, 0.0, np.abs(y - ref) - rounding)
        if relative:
            d = d / np.fmax(np.fmax(1.0, np.abs(ref)), terms)  # (fmax: a NaN reference, matched by y, keeps its 0)
    d = np.where(np.isnan(d), np.inf, d)
    return max(0.0, float(d.max())) if d.size else 0.0


def _activation64(y, activation_type: int, alpha: float):
    """ncnn's activation layers in float64 (the fused layers' activation_type numbering)."""
    import numpy as np

    with np.errstate(all="ignore"):
        if activation_type == 1:
            return np.where(y < 0, 0.0, y)
        if activation_type == 2:
            return np.where(y < 0, y * alpha, y)
        if activation_type == 4:
            return 1.0 / (1.0 + np.exp(-y))
        if activation_type == 7:
            return y / (1.0 + np.exp(-y))
        if activation_type == 8:
            erf = np.vectorize(math.erf, otypes=[np.float64])
            return 0.5 * y * (1.0 + erf(y / math.sqrt(2.0)))
        if activation_type == 9:
            return 0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y ** 3)))
    return y


def judge_layer(y, x_seen, op: str, eps: float, affine_size: int, gamma, beta, fp16: bool, atol: float,
                group: int = 1, activation: Tuple[int, float] = (0, 0.0)) -> Tuple[float, float, bool]:
    """The pass rule of `vknorm check`, both engines, for one vknorm layer: its output y against float64
    computed from x_seen, the very input that layer received in the vknorm run, with the layer's own eps,
    affine_size (GroupNorm: group) and weights (judging against the stock run instead would charge the layer with whatever
    ran upstream), each element's error relative to max(1, |ref|, |gamma x^| + |beta|): float32's own rounding grows
    with the value (gamma 1000 puts outputs where one float32 step is 1.2e-4: an absolute 1e-4 would fail exact
    arithmetic) and with the terms that sum to it (gamma = beta = 1000 gives outputs near 0 that carry the rounding
    of terms near 1000), and a bound per element keeps one large output from loosening the others'. fp32:
    max |y - ref| / max(1, |ref|, |gamma x^| + |beta|) <= atol. fp16 storage: x_seen rounded to float16 first (what the layer uploads), and half a float16 spacing at y
    allowed for the output rounding (rounding moved y from the kernel's float32 value by at most that: never into
    a lower binade); the excess over max(1, |ref|, |gamma x^| + |beta|) <= atol.
    A fused layer's activation (activation_type, alpha) is applied to the float64 reference.
    Returns (f64_abs_err, judged_err, ok); an error is inf when shapes differ or one side alone is NaN/inf."""
    import numpy as np

    with np.errstate(over="ignore"):  # beyond float16's range: inf, as the layer's own upload makes it
        xin = np.asarray(x_seen).astype(np.float16).astype(np.float32) if fp16 else x_seen
    norm64, terms = _reference64(xin, op, eps, affine_size, gamma, beta, group, with_terms=True)
    ref64 = _activation64(norm64, *activation)
    f64 = _excess(y, ref64, 0.0)
    judged = _excess(y, ref64, half_fp16_spacing(y) if fp16 else 0.0, relative=True, terms=terms)
    return f64, judged, bool(math.isfinite(judged) and judged <= atol)


# A model output of the vknorm run may differ from the CPU fp32 run by up to this many times what stock ncnn
# Vulkan's output differs (its layers round as stock's do, in another order), plus the layer rule's atol at the
# output's scale: a wrong vknorm layer or fusion shows there even where each layer passes on the input it saw.
OUTPUT_SLACK = 2.0


def output_bound(ref, ncnn_err: float, atol: float) -> float:
    """The most a model output of the vknorm run may differ from the CPU run (ref): OUTPUT_SLACK x stock ncnn
    Vulkan's difference + atol x max(1, max finite |ref|)."""
    import numpy as np

    finite = np.abs(ref[np.isfinite(ref)]) if ref.size else np.zeros(0)
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    return OUTPUT_SLACK * ncnn_err + atol * scale


def judge_output(ref, got, got_stock, atol: float) -> dict:
    """One model output of the vknorm run (got) against the CPU run (ref), beside stock ncnn Vulkan's (got_stock).
    Judged on the elements where stock's output is as finite as the CPU's (where it alone is NaN/inf, the
    model's own Vulkan layers left float32 there: not vknorm's doing, and not a reason to judge nothing):
    vknorm's largest difference there ("judged_err") within output_bound of stock's largest there. "unjudged":
    how many elements that leaves out. A vknorm output of another shape fails; stock's has ref's shape
    (check_model_vulkan refuses runs where stock's two disagree)."""
    import numpy as np

    if got.shape != ref.shape:
        return {"judged_err": math.inf, "bound": None, "unjudged": 0, "ok": False}
    d_stock = _abs_diff(ref, got_stock)
    judged = np.isfinite(d_stock)
    d = _abs_diff(ref, got)[judged]
    err = float(d.max()) if d.size else 0.0
    bound = output_bound(ref, float(d_stock[judged].max()) if d.size else 0.0, atol)
    return {"judged_err": err, "bound": bound, "unjudged": int(judged.size - d.size), "ok": err <= bound}


def _output_ok(result: dict, name: str) -> bool:
    """An output's judgement as the JSON holds it (results without one: within)."""
    return result.get("output_judgements", {}).get(name, {}).get("ok", True)


def _finite_or_none(v: Optional[float]) -> Optional[float]:
    return v if v is not None and math.isfinite(v) else None


def _fused_blobs(graph, model: Model, fused: List[dict]) -> Dict[str, dict]:
    """Per fused norm (by name): the blob it writes ("out": the activation's output when one was fused),
    the blobs it reads ("ins": the add's two inputs, or the norm's input) and the sum it writes ("sum"),
    as the fused graph names them (names the unfused graph has too, with the same values)."""
    patterns = {next(n for n in f["layers"] if n in {layer.name for layer in model.norms}): f["pattern"]
                for f in fused}
    text, _ = graph._graph.fuse_param(model.text)
    out = {}
    # read as ncnn reads it (C's white space: a no-break space inside a name is part of it)
    for layer in parse_param(model.path, allow_fused=True, raw=text.encode()).layers:
        if layer.type.startswith("vknorm.") and layer.name in patterns:
            out[layer.name] = {"pattern": patterns[layer.name], "out": layer.tops[0], "ins": layer.bottoms,
                               "sum": layer.tops[1] if len(layer.tops) == 2 else None}
    return out


def _ncnn_add(graph, a, b, fp16: bool):
    """ncnn's Vulkan BinaryOp add of a and b in the run's storage: what a fused layer in a Vulkan net
    normalizes when its two inputs differ in shape (it runs that BinaryOp for them, with ncnn's
    broadcasting, not numpy's; ncnn's CPU BinaryOp broadcasts some shape pairs differently)."""
    import tempfile

    import numpy as np

    with tempfile.TemporaryDirectory() as d:
        path, weights = os.path.join(d, "add.param"), os.path.join(d, "add.bin")
        with open(path, "w") as f:
            f.write("7767517\n3 3\nInput a 0 1 a\nInput b 0 1 b\nBinaryOp add 2 1 a b s 0=0\n")
        open(weights, "wb").close()  # no weights; load_model still prepares the layers, as ncnn needs
        net = graph.configure(graph.Net(vknorm=False, fuse=False), vulkan=True, fp16=fp16, lightmode=False)

        def add_once():  # the extractor and its Mat (memory of the net's pool) end with this frame
            ex = net.create_extractor()
            ex.input("a", graph.Mat(np.ascontiguousarray(a, np.float32)))
            ex.input("b", graph.Mat(np.ascontiguousarray(b, np.float32)))
            ret, m = ex.extract("s")
            return ret, (np.array(m, np.float32) if ret == 0 else None)

        try:
            if net.load_param(path) != 0 or net.load_model(weights) != 0:
                raise UsageError("ncnn could not load a BinaryOp add (to judge a fused layer)")
            ret, s = add_once()
        finally:
            net.clear()
        if ret != 0:
            raise UsageError(f"ncnn could not add blobs of shapes {a.shape} and {b.shape} (returned {ret})")
        return s


def _clear_all(nets: list) -> None:
    """Clears every net (ncnn's notes quiet), then raises the first error a clear raised (a custom layer's
    destroy_pipeline), unless one is on its way already: the others are cleared still, not left to the garbage
    collector, whose errors nothing would raise."""
    first: Optional[Exception] = None
    with quiet_stderr():
        for net in nets:
            try:
                net.clear()
            except Exception as e:  # noqa: BLE001 - raised below, after the other nets
                first = first or e
    del nets[:]
    if first is not None and sys.exc_info()[1] is None:
        raise first


def check_model_vulkan(param_path: str, bin_path: str, input_specs: Dict[str, Tuple[int, ...]],
                       fp16: bool = False, seed: int = 0, atol: Optional[float] = None, fuse: bool = True) -> dict:
    """`vknorm check --vulkan`: stock ncnn CPU fp32, stock ncnn Vulkan and ncnn Vulkan with vknorm inside,
    all three in vknorm.graph's ncnn; returns the JSON-able result (UsageError for file/flag problems)."""
    import numpy as np

    if atol is None:
        atol = ATOL_FP16 if fp16 else ATOL_FP32
    model, data = _prepare(param_path, bin_path, input_specs)
    graph = _import_graph()
    from . import _core

    # vknorm's settings (VKNORM_MAX_SHARED_MEMORY, VKNORM_VULKAN_API, ...) read as vknorm's layers inside ncnn read
    # them: a ValueError naming the variable, not a create_pipeline failure blamed on the model's weights
    _core.devices()
    require_settings()
    result: Dict[str, Any]  # the JSON report
    result = {"ok": True, "device": None, "layers": [], "outputs": {}, "model": param_path, "weights": bin_path,
              "inputs": {k: list(v) for k, v in input_specs.items()}, "fp16": bool(fp16), "seed": seed,
              "atol": atol, "warnings": unread_text_warnings(model), "engine": "vulkan", "rule": _rule(fp16, atol),
              "host_round_trips": 0,
              "ncnn_outputs": {}, "output_bounds": {}, "output_judgements": {}, "outputs_ok": True, "model_ms": {}, "timing_rounds": 0,
              "fuse": bool(fuse), "fused": []}
    with quiet_stderr():  # ncnn prints its device banner when it creates its Vulkan instance
        device = graph.gpu_name() if graph.gpu_count() > 0 else None
    if not device:
        raise UsageError("--vulkan: ncnn finds no Vulkan device (install mesa-vulkan-drivers for lavapipe, "
                         "or a GPU driver)")
    result["device"] = device

    from ._fork import LOADING, TIMED_CRASH, VKNORM_CRASH, stage, stock_vulkan_crash

    nets = []
    try:
        stage("stock ncnn's CPU load", LOADING)
        cpu = _graph_load(graph, model, bin_path, len(data), vknorm=False, vulkan=False, fp16=False,
                          label="ncnn CPU")
        nets.append(cpu)
        if cpu.model_bytes_read < len(data):
            result["warnings"].append(trailing_bytes_warning(bin_path, len(data) - cpu.model_bytes_read, param_path))
        if not model.norms:
            result["note"] = f"{param_path}: no LayerNorm, RMSNorm, GroupNorm or InstanceNorm layers, nothing to check"
            return result
        outputs, caches = split_outputs(model, cpu)
        if caches:
            result["kv_caches"] = caches
        rng = np.random.default_rng(seed)  # the same inputs as the check without --vulkan
        inputs = random_inputs(rng, input_specs, model.inputs)
        stage("the load of the net with vknorm inside", LOADING)
        vk = _graph_load(graph, model, bin_path, len(data), vknorm=True, vulkan=True, fp16=fp16,
                         label="vknorm Vulkan", fuse=fuse)
        nets.append(vk)
        result["fused"] = [dict(f) for f in vk.fused()]
        fused = _fused_blobs(graph, model, result["fused"])
        # What each norm reads and writes, named as in the unfused model (a fused layer's output is its
        # activation's, its input the add's two inputs; the blobs in between no longer exist).
        io = {layer.name: fused.get(layer.name) or {"pattern": None, "out": layer.tops[0], "ins": [layer.bottoms[0]],
                                                    "sum": None} for layer in model.norms}
        sums = [f["sum"] for f in io.values() if f["sum"]]
        vk_blobs = list(dict.fromkeys([b for f in io.values() for b in f["ins"] + [f["out"]]] + sums + outputs))
        blobs = list(dict.fromkeys(vk_blobs + [layer.bottoms[0] for layer in model.norms]
                                   + [layer.tops[0] for layer in model.norms]))
        refuse_norm_channel_mismatch(model, bin_path, len(data), inputs)
        stage("stock ncnn's CPU run")
        ref = stock_cpu_reference(graph, cpu, model, bin_path, len(data), inputs, blobs)
        result["warnings"] += _nonfinite_warnings(ref, [layer.tops[0] for layer in model.norms] + outputs)
        stage("stock ncnn's Vulkan load", LOADING)
        stock = _graph_load(graph, model, bin_path, len(data), vknorm=False, vulkan=True, fp16=fp16,
                            label="ncnn Vulkan")
        stage("stock ncnn's Vulkan run", stock_vulkan_crash("its CPU run"))
        nets.append(stock)
        got_stock = _graph_extract(graph, stock, inputs, blobs, "ncnn Vulkan")
        # Stock ncnn's two runs agree on every blob's shape, or the --input shapes do not fit the model (ncnn
        # checks few of them: a BinaryOp of shapes that do not broadcast gives one shape on the CPU, another
        # on Vulkan), and there is nothing to judge vknorm against.
        dims = lambda a: "x".join(map(str, a.shape)) or "a scalar"  # noqa: E731
        for b in blobs:
            if ref[b].shape != got_stock[b].shape:
                raise UsageError(f"blob {b!r} comes out {dims(ref[b])} from stock ncnn's CPU run and "
                                 f"{dims(got_stock[b])} from its Vulkan run: do the --input shapes match what the "
                                 "model takes?")
        stage("the run with vknorm inside", VKNORM_CRASH)
        got = _graph_extract(graph, vk, inputs, vk_blobs, "vknorm Vulkan")
        stage("the timed runs", TIMED_CRASH)
        infos = {i["name"]: i for i in vk.vknorm_layers()}

        try:
            ctx, warning = _timing_context(device)
        except ValueError as e:  # e.g. VKNORM_DEVICE names no device
            raise UsageError(str(e)) from None
        if warning:
            result["warnings"].append(warning)
        for layer in model.norms:
            f = io[layer.name]
            top = f["out"]
            err = max_abs_err(ref[top], got[top])
            rec = {"name": layer.name, "type": layer.type, "fused": f["pattern"], "blob": top,
                   "shape": list(got[top].shape), "group_size": None,
                   "groups": None, "max_abs_err": _finite_or_none(err),
                   "ncnn_abs_err": _finite_or_none(max_abs_err(ref[top], got_stock[top])), "f64_abs_err": None,
                   "judged_err": None, "sum_blob": None, "sum_abs_err": None, "sum_err": None,
                   "gpu_us": None, "ok": False, "vulkan_forwards": 0, "cpu_forwards": 0}
            info = infos.get(layer.name)
            # Float16 storage: what the layer read is float16. A blob some layer wrote comes back that way; a
            # model input comes back as it was given, so it is rounded here as ncnn's upload rounds it.
            ins = [got[b].astype(np.float16).astype(np.float32) if fp16 else got[b] for b in f["ins"]]
            # The input this layer saw in the vknorm run (float16 storage rounds what it uploads; a fused
            # add's sum is float32 before that rounding, as the kernel forms it). Judging against float64
            # of it isolates the kernel: the CPU run's input already differs by every stock Vulkan layer
            # upstream (ncnn_abs_err shows that share). Inputs of two shapes went through ncnn's BinaryOp.
            x_seen = (ins[0] if len(ins) == 1 else ins[0] + ins[1] if ins[0].shape == ins[1].shape
                      else _ncnn_add(graph, ins[0], ins[1], fp16))
            if info is None:
                result["warnings"].append(f"layer {layer.name!r}: ncnn did not create vknorm's {layer.type} for it")
            elif x_seen.shape != got[top].shape:
                result["warnings"].append(
                    f"layer {layer.name!r}: its input cannot be rebuilt (the fused add's inputs {ins[0].shape} and "
                    f"{ins[1].shape} broadcast to {x_seen.shape} in ncnn's BinaryOp, the layer wrote {got[top].shape}); "
                    "--no-fuse judges the layer on its own input")
            else:
                activation = (int(info.get("activation_type", 0)), float(info.get("activation_alpha", 0.0)))
                f64, judged, rec["ok"] = judge_layer(
                    got[top], x_seen, layer.type, float(info["eps"]), int(info["affine_size"]),
                    info["gamma"] if info["affine"] else None, info["beta"] if info["affine"] else None, fp16, atol,
                    group=int(info.get("group", 1)), activation=activation)
                rec["f64_abs_err"] = _finite_or_none(f64)
                rec["judged_err"] = _finite_or_none(judged)
                if f["sum"] in got:  # the written sum: BinaryOp add's value exactly (float16: one rounding)
                    sum_seen = x_seen.astype(np.float16).astype(np.float32) if fp16 else x_seen
                    rec["sum_blob"] = f["sum"]
                    rec["sum_abs_err"] = _finite_or_none(max_abs_err(ref[f["sum"]], got[f["sum"]]))
                    rec["sum_err"] = _finite_or_none(max_abs_err(sum_seen, got[f["sum"]]))
                    if rec["sum_err"] is None or rec["sum_err"] > 0:
                        rec["ok"] = False
                # the kernel as it ran: a fused add reads both inputs (and writes the sum where it does)
                fused_add = len(ins) == 2 and ins[0].shape == ins[1].shape
                g = _groups_of(info, ins[0] if fused_add else x_seen)
                try:
                    gpu_us = _kernel_gpu_us(info, ins[0] if fused_add else x_seen, fp16, ctx,
                                            residual=ins[1] if fused_add else None, write_sum=f["sum"] in got)
                except MemoryError as e:  # the time is an aside, on vknorm's own context: the verdict stands
                    gpu_us = None
                    result["warnings"].append(f"layer {layer.name!r}: its kernel time (gpu_us) was not measured on "
                                              f"vknorm's own context: {(str(e).splitlines() or [''])[0]}")
                rec["gpu_us"] = gpu_us
                rec["group_size"], rec["groups"] = int(g["group_size"]), int(g["groups"])
            result["layers"].append(rec)
        for o in outputs:
            result["outputs"][o] = _finite_or_none(max_abs_err(ref[o], got[o]))
            result["ncnn_outputs"][o] = _finite_or_none(max_abs_err(ref[o], got_stock[o]))
            j = judge_output(ref[o], got[o], got_stock[o], atol)
            j["judged_err"], j["bound"] = _finite_or_none(j["judged_err"]), _finite_or_none(j["bound"])
            result["output_judgements"][o] = j
            result["output_bounds"][o] = j["bound"]
            result["outputs_ok"] = result["outputs_ok"] and j["ok"]

        # a whole inference: every output, a decoder's kv caches included (as bench --model times it)
        result["model_ms"], result["timing_rounds"] = _time_inferences(
            graph, {"ncnn_vulkan": stock, "vknorm": vk}, inputs, list(cpu.output_names()))

        infos = {i["name"]: i for i in vk.vknorm_layers()}  # the counters after every vknorm run
        # a layer the model keeps off Vulkan (featmask bit 4, param 31=16) runs on the CPU by design
        off_vulkan = {name for name, _, mine, on_vulkan in vk.layers() if mine and not on_vulkan}
        for rec in result["layers"]:
            info = infos.get(rec["name"])
            if info is not None:
                rec["vulkan_forwards"], rec["cpu_forwards"] = int(info["vulkan_forwards"]), int(info["cpu_forwards"])
                if rec["name"] in off_vulkan:
                    rec["kept_off_vulkan"] = True
                elif rec["cpu_forwards"] or not rec["vulkan_forwards"]:
                    rec["ok"] = False
        result["host_round_trips"] = int(sum(i["cpu_forwards"] for n, i in infos.items() if n not in off_vulkan))
        if off_vulkan:
            result["warnings"].append("kept off Vulkan by the model (featmask 31=16), run on the CPU: "
                                      + ", ".join(sorted(off_vulkan)))
    finally:
        _clear_all(nets)
    result["ok"] = (all(rec["ok"] for rec in result["layers"]) and result["host_round_trips"] == 0
                    and result["outputs_ok"])
    if _core.validation_enabled():
        result["validation_messages"] = len(_core.validation_messages())
    return result


# ---------------------------------------------------------------------------------------------- output

def _fmt_err(v) -> str:
    return "inf/nan" if v is None else f"{v:.2e}"


def _table(rows: List[List[str]], right: set) -> List[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
    return out


# The judged column's legend, by storage (False: float32, True: float16).
JUDGED_HELP = {False: "judged: the same, each element's over max(1, |its float64 value|, |gamma x^| + |beta|) (what the rule judges)",
               True: "judged: the same less float16 output rounding, each element's over max(1, |its float64 value|, |gamma x^| + |beta|) "
                     "(what the rule judges)"}


def _note_text(result: dict) -> str:
    """A run with nothing to check: its note, and the warnings about the files."""
    return "\n".join([result["note"]] + [f"warning: {w}" for w in result["warnings"]])


def format_text(result: dict) -> str:
    if "note" in result:
        return _note_text(result)
    mode = "fp16 storage" if result["fp16"] else "fp32"
    ins = ", ".join(f"{k}={dims_text(v)}" for k, v in result["inputs"].items())
    lines = [f"vknorm check {result['model']} ({ins}; {mode}, seed {result['seed']}, atol {result['atol']:g})", ""]
    fp16 = result["fp16"]
    judged = ("f64_abs_err", "judged_err")
    head = ["layer", "type", "shape", "group_size", "groups", "max_abs_err", "f64_err", "judged"]
    rows = [head + ["gpu_us", ""]]
    for r in result["layers"]:
        rows.append([r["name"], r["type"], "x".join(map(str, r["shape"] or [])) or "-",
                     str(r.get("group_size", "-")), str(r.get("groups", "-")), _fmt_err(r["max_abs_err"])]
                    + ["-" if r.get("group_size") is None else _fmt_err(r.get(k)) for k in judged]  # "-": not vknorm's
                    + ["-" if r["gpu_us"] is None else f"{r['gpu_us']:.1f}", "" if r["ok"] else "FAIL"])
    lines += _table(rows, set(range(3, len(head) + 1)))
    lines.append("")
    rows = [["output", "max_abs_err"]] + [[k, _fmt_err(v)] for k, v in result["outputs"].items()]
    lines += _table(rows, {1})
    lines.append("")
    lines.append("max_abs_err: max |vknorm run - stock run| on the same blob; "
                 + ("f64_err: max |error| against float64 of the float16-rounded input the layer saw; " if fp16 else
                    "f64_err: max |error| against float64 of the input the layer saw; ") + JUDGED_HELP[fp16])
    lines += [f"device: {result['device']}"] + kv_caches_line(result)
    if "rule" in result:
        lines.append(f"rule: {result['rule']}")
    for w in result["warnings"]:
        lines.append(f"warning: {w}")
    n = len(result["layers"])
    rule = "fp16" if result["fp16"] else "fp32"
    if result["ok"]:
        lines.append(f"ok: all {n} norm outputs within atol {result['atol']:g} ({rule} rule)")
    else:
        failed = [r["name"] for r in result["layers"] if not r["ok"]]
        lines.append(f"FAIL: {len(failed)} of {n} norm outputs above atol {result['atol']:g} "
                     f"({rule} rule): " + ", ".join(failed))
    return "\n".join(lines)


def format_text_vulkan(result: dict) -> str:
    if "note" in result:
        return _note_text(result)
    fp16 = result["fp16"]
    mode = "fp16 storage" if fp16 else "fp32"
    ins = ", ".join(f"{k}={dims_text(v)}" for k, v in result["inputs"].items())
    lines = [f"vknorm check --vulkan {result['model']} ({ins}; {mode}, seed {result['seed']}, atol {result['atol']:g})",
             "runs: ncnn CPU fp32 (the reference), ncnn Vulkan, ncnn Vulkan with vknorm inside"
             + (" (float16 storage in both Vulkan runs)" if fp16 else "")
             + "; *_err: max |run - CPU| on the same blob", ""]
    head = ["layer", "type", "shape", "group_size", "groups", "vknorm_err", "ncnn_vk_err", "f64_err", "judged"]
    writes_sums = any(r.get("sum_blob") for r in result["layers"])
    if writes_sums:
        head.append("sum_err")
    rows = [head + ["gpu_us", ""]]
    for r in result["layers"]:
        row = [r["name"], r["type"], "x".join(map(str, r["shape"] or [])) or "-",
               "-" if r.get("group_size") is None else str(r["group_size"]),
               "-" if r.get("groups") is None else str(r["groups"]),
               _fmt_err(r["max_abs_err"]), _fmt_err(r["ncnn_abs_err"])]
        for k in ("f64_abs_err", "judged_err"):
            row.append("-" if r.get("group_size") is None else _fmt_err(r[k]))  # "-": not vknorm's layer
        if writes_sums:
            row.append(_fmt_err(r["sum_err"]) if r.get("sum_blob") else "-")
        row += ["-" if r["gpu_us"] is None else f"{r['gpu_us']:.1f}", "" if r["ok"] else "FAIL"]
        rows.append(row)
    lines += _table(rows, set(range(3, len(head) + 1)))
    lines.append("")
    bounds = result.get("output_bounds", {})
    rows = [["output", "vknorm_err", "ncnn_vk_err", "bound", ""]]
    rows += [[k, _fmt_err(v), _fmt_err(result["ncnn_outputs"].get(k)), _fmt_err(bounds.get(k)),
              "" if _output_ok(result, k) else "FAIL"]
             for k, v in result["outputs"].items()]
    lines += _table(rows, {1, 2, 3})
    lines += kv_caches_line(result)
    for k, j in result.get("output_judgements", {}).items():
        if j["unjudged"]:
            lines.append(f"{k}: {j['unjudged']} elements where stock ncnn Vulkan's output alone is not finite are not "
                         f"judged; vknorm_err on the rest: {_fmt_err(j['judged_err'])}")
    lines.append("")
    ms = result["model_ms"]
    if ms:
        speed = (f" (speed-up {ms['ncnn_vulkan'] / ms['vknorm']:.2f}x)"
                 if ms.get("vknorm") and ms.get("ncnn_vulkan") else "")
        lines.append(f"model wall ms/inference (median of {result['timing_rounds']} after a warm-up, lightmode on): "
                     f"ncnn Vulkan {ms['ncnn_vulkan']:.3f}, vknorm {ms['vknorm']:.3f}{speed}")
    lines.append("gpu_us: vknorm's kernel time for that blob on vknorm's own Vulkan context, one dispatch at a time "
                 "(vknorm bench times kernels back to back); a fused layer: its whole kernel, the add included; ncnn's "
                 "graph has no per-layer timestamps")
    lines.append(("f64_err: vknorm's max |error| against float64 of the float16-rounded input it saw (" if fp16 else
                  "f64_err: vknorm's max |error| against float64 of the input it saw (") +
                 "the *_err columns also carry the stock Vulkan layers' differences upstream); " + JUDGED_HELP[fp16])
    if result.get("fused"):
        lines.append(f"fused ({len(result['fused'])}): " + "; ".join(
            f"{f['pattern']} ({', '.join(f['layers'])})" for f in result["fused"]))
        adds = any(f["pattern"].startswith("BinaryOp") for f in result["fused"])
        lines.append("a fused layer is judged on its output blob (the activation's, when one was fused) from "
                     + ("the sum it read (an add fused) or " if adds else "") + "the input it read" + ("; sum_err: max |the sum it wrote for the add's other consumers - the add's value| "
                                  "(must be 0)" if writes_sums else ""))
        bad_sums = [r["name"] for r in result["layers"] if r.get("sum_blob") and r.get("sum_err") != 0]
        if bad_sums:
            lines.append("written sums differ from the add's: " + ", ".join(bad_sums))
    elif result.get("fuse") is False:
        lines.append("fusion off (--no-fuse)")
    lines.append(f"device: {result['device']}")
    lines.append(f"host round trips: {result['host_round_trips']}")
    lines.append(f"rule: {result['rule']}")
    for w in result["warnings"]:
        lines.append(f"warning: {w}")
    n = len(result["layers"])
    rule = "fp16" if fp16 else "fp32"
    if result["ok"]:
        lines.append(f"ok: all {n} norm layers within atol {result['atol']:g} ({rule} rule), "
                     f"no host round trips, every model output within its bound")
    else:
        failed = [r["name"] for r in result["layers"] if not r["ok"]]
        reasons = []
        if failed:
            reasons.append(f"{len(failed)} of {n} norm layers above atol {result['atol']:g} ({rule} rule): "
                           + ", ".join(failed))
        if result["host_round_trips"]:
            reasons.append(f"{result['host_round_trips']} host round trip(s)")
        off = [k for k in result["outputs"] if not _output_ok(result, k)]
        if off:
            reasons.append("model outputs past their bound: " + ", ".join(off))
        lines.append("FAIL: " + "; ".join(reasons))
    return "\n".join(lines)


def _check_in_child(param_path, bin_path, specs, fp16, seed, atol, vulkan=False, fuse=True) -> dict:
    """check_model in a forked child (_fork.run_in_child), so that ncnn crashing (a SIGFPE or SIGSEGV on
    input shapes the model cannot take) becomes one line and exit 2 instead of a dead process. The parent
    has touched neither Vulkan nor ncnn yet, so the child starts clean."""
    from ._fork import crashed_running, run_in_child

    return run_in_child(lambda: _check(param_path, bin_path, specs, fp16, seed, atol, vulkan, fuse),
                        crashed_running(param_path, specs))


def _check(param_path, bin_path, specs, fp16, seed, atol, vulkan, fuse) -> dict:
    """check_model or check_model_vulkan; what the model's custom layers raise, as a UsageError naming their line."""
    with custom_layers.running():
        if vulkan:
            result = check_model_vulkan(param_path, bin_path, specs, fp16=fp16, seed=seed, atol=atol, fuse=fuse)
        else:
            result = check_model(param_path, bin_path, specs, fp16=fp16, seed=seed, atol=atol)
    if custom_layers.used():  # the key only where the flag was given: the report is otherwise as it was
        result["custom_layers"] = custom_layers.used()
    return result


def _fork_is_safe() -> bool:
    """See _fork.fork_is_safe; VKNORM_CHECK_INPROCESS=1 turns the guard off."""
    from ._fork import fork_is_safe

    return fork_is_safe("VKNORM_CHECK_INPROCESS")


def run_check(args) -> int:
    vulkan = bool(getattr(args, "vulkan", False))
    specs = parse_inputs(args.input)
    seed = _parse_seed(args.seed)
    atol = _parse_atol(args.atol, args.fp16)
    fuse = not getattr(args, "no_fuse", False)
    if not vulkan and not fuse:
        raise UsageError("--no-fuse goes with --vulkan (the pyncnn engine runs no fused layers)")
    custom_layers.use(getattr(args, "custom_layers", None))
    if _fork_is_safe():
        result = _check_in_child(args.param, args.bin, specs, args.fp16, seed, atol, vulkan, fuse)
    else:
        result = _check(args.param, args.bin, specs, args.fp16, seed, atol, vulkan, fuse)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_text_vulkan(result) if vulkan else format_text(result))
    nval = result.get("validation_messages", 0)
    if nval:
        print(f"vknorm check: warning: {nval} Vulkan validation message(s)", file=sys.stderr)
    sys.stdout.flush()
    return 0 if result["ok"] else 1

"""C-level stderr capture: ncnn logs with NCNN_LOGE straight to fd 2."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from typing import Optional

# fd 2 is the process's: two threads swapping it at once could leave it on one's deleted temporary file for good.
_swap_lock = threading.RLock()
# The fd 2 each open quiet_stderr block saved, outermost first (blocks nest on one thread, under _swap_lock).
_saved: list = []


def _lines(tmp) -> list:
    tmp.seek(0)
    return [line for line in tmp.read().decode("utf-8", "replace").splitlines() if line.strip()]


@contextlib.contextmanager
def quiet_stderr(sink: Optional[list] = None):
    """Silence C-level stderr (ncnn's NCNN_LOGE lines) for the block; captured lines go to ``sink`` when
    it ends. The block gets a function returning the lines captured so far (for an error raised inside).
    Blocks on several threads run one after another."""
    with _swap_lock:
        with _quiet_stderr(sink) as captured:
            yield captured


def _flush_stderr() -> None:
    """Python's buffered stderr out before fd 2 moves (a closed one: nothing to flush)."""
    try:
        sys.stderr.flush()
    except Exception:  # pragma: no cover - closed stderr
        pass


@contextlib.contextmanager
def _quiet_stderr(sink: Optional[list]):
    _flush_stderr()
    try:
        saved = os.dup(2)
    except OSError:  # pragma: no cover - no fd 2
        yield lambda: []
        return
    _saved.append(saved)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)

        def captured() -> list:
            _flush_stderr()
            lines = _lines(tmp)
            tmp.seek(0, os.SEEK_END)  # the fd shares this offset: later writes must append
            return lines

        try:
            yield captured
        finally:
            _flush_stderr()
            os.dup2(saved, 2)
            _saved.remove(saved)
            os.close(saved)
            if sink is not None:
                sink.extend(_lines(tmp))


@contextlib.contextmanager
def process_stderr():
    """C-level stderr for the block as the process had it before any quiet_stderr block around it: a user's own
    code (--custom-layers' register) prints there, not into a capture of ncnn's log."""
    with _swap_lock:
        if not _saved:
            yield
            return
        _flush_stderr()
        quiet = os.dup(2)
        os.dup2(_saved[0], 2)
        try:
            yield
        finally:
            _flush_stderr()
            os.dup2(quiet, 2)
            os.close(quiet)


@contextlib.contextmanager
def without_ncnn_notes(*notes: str):
    """C-level stderr for the block as it is, less ncnn's lines that start with one of ``notes`` (said better by the
    caller): the rest (a custom Python layer's prints among them) written out when the block ends."""
    said: list = []
    try:
        with quiet_stderr(said):
            yield
    finally:
        for line in said:
            if not line.startswith(notes):
                print(line, file=sys.stderr)

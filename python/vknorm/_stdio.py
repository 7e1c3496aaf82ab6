"""C-level stderr capture: ncnn logs with NCNN_LOGE straight to fd 2."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import Optional


@contextlib.contextmanager
def quiet_stderr(sink: Optional[list] = None):
    """Silence C-level stderr (ncnn's NCNN_LOGE lines) for the block; captured lines go to ``sink``."""
    try:
        sys.stderr.flush()
    except Exception:  # pragma: no cover - closed stderr
        pass
    try:
        saved = os.dup(2)
    except OSError:  # pragma: no cover - no fd 2
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except Exception:  # pragma: no cover
                pass
            os.dup2(saved, 2)
            os.close(saved)
            if sink is not None:
                tmp.seek(0)
                sink.extend(line for line in tmp.read().decode("utf-8", "replace").splitlines() if line.strip())

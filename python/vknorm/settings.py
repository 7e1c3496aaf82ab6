"""The environment variables vknorm reads at run time, and which of those set now it does not know.

A misspelled setting (``VKNORM_VALIDATON=1``) is otherwise ignored without a word: ``vknorm info`` lists the
VKNORM_ variables set, says which it does not read and names the setting each was likely meant to be."""
from __future__ import annotations

import difflib
import os
from typing import Dict, List, Mapping, Optional

# Every VKNORM_ variable vknorm's runtime reads (its C++ core, its ncnn layers and its Python package), with what it
# does; the VKNORM_TUNE_ prefix holds the dispatcher's measurement knobs (docs/benchmarks, "Tuning knobs").
RUNTIME_SETTINGS: Dict[str, str] = {
    "VKNORM_DEVICE": "the device of vknorm's own context (index or name substring)",
    "VKNORM_PATH": "force a kernel (auto, subgroup, workgroup, split, cooperative)",
    "VKNORM_VALIDATION": "Khronos validation layer on (1)",
    "VKNORM_VALIDATION_PRINT": "validation messages also printed to stderr (1)",
    "VKNORM_MAX_DEVICE_BYTES": "cap on a context's device memory, its buffer cache included",
    "VKNORM_BUFFER_CACHE_BYTES": "what a context keeps of freed buffers for reuse (default 256 MiB)",
    "VKNORM_PIPELINE_CACHE_COUNT": "how many pipelines a context keeps, the most recently used (default 128)",
    "VKNORM_FENCE_SPIN_US": "how long a submission's fence is polled before blocking on it",
    "VKNORM_MAX_BUFFER_BYTES": "plan as if storage buffers were that small (pieces)",
    "VKNORM_NO_FP16_STORAGE": "capability profile: no 16-bit storage",
    "VKNORM_NO_SUBGROUP": "capability profile: no subgroup operations",
    "VKNORM_VULKAN_API": "capability profile: plan for this Vulkan version (1.0 to 1.3)",
    "VKNORM_MAX_SHARED_MEMORY": "capability profile: this much shared memory at most",
    "VKNORM_SUBGROUP_SIZE": "subgroup pipelines of vknorm's own context require this subgroup size",
    "VKNORM_COOPERATIVE_WORKGROUPS": "workgroups the device keeps resident (the cooperative kernel's)",
    "VKNORM_PIPELINE_STATS": "print each pipeline's driver statistics (1)",
    "VKNORM_CHECK_INPROCESS": "vknorm check without its forked child (1)",
    "VKNORM_BENCH_INPROCESS": "vknorm bench --model without its forked child (1)",
    "VKNORM_DEBUG_LEAK_BUFFER": "leak one buffer on purpose (the leak tests' negative control)",
}
TUNING_PREFIX = "VKNORM_TUNE_"


def vknorm_variables(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The VKNORM_ variables set, by name."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in sorted(env.items()) if k.startswith("VKNORM_")}


def unknown(environ: Optional[Mapping[str, str]] = None) -> List[dict]:
    """The VKNORM_ variables set that the runtime does not read: {"name", "meant"} ("meant": the closest setting's
    name, or None). Build and test scripts read some VKNORM_ variables of their own (VKNORM_CACHE, ...): they show
    here too, with no likely meaning."""
    out = []
    for name in vknorm_variables(environ):
        if name in RUNTIME_SETTINGS or (name.startswith(TUNING_PREFIX) and len(name) > len(TUNING_PREFIX)):
            continue
        close = difflib.get_close_matches(name, list(RUNTIME_SETTINGS), n=1, cutoff=0.85)
        out.append({"name": name, "meant": close[0] if close else None})
    return out

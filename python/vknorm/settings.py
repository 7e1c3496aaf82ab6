"""The environment variables vknorm reads at run time, and which of those set now it does not know.

A misspelled setting (``VKNORM_VALIDATON=1``) is otherwise ignored without a word: ``vknorm info`` lists the
VKNORM_ variables set, says which it does not read and names the setting each was likely meant to be."""
from __future__ import annotations

import difflib
import os
from typing import Dict, List, Mapping, Optional

# Every VKNORM_ variable vknorm's runtime reads (its C++ core, its ncnn layers and its Python package) but the tuning
# knobs below, with what it does.
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
# Those read as switches (switch(), the runtime's env_flag): on for 1/true/on/yes, off for 0/false/off/no or empty.
SWITCHES = frozenset({"VKNORM_VALIDATION", "VKNORM_VALIDATION_PRINT", "VKNORM_NO_FP16_STORAGE", "VKNORM_NO_SUBGROUP",
                      "VKNORM_PIPELINE_STATS", "VKNORM_CHECK_INPROCESS", "VKNORM_BENCH_INPROCESS",
                      "VKNORM_TUNE_UNCACHED_MAPPING"})
TUNING_PREFIX = "VKNORM_TUNE_"
# The dispatcher's and the converters' measurement knobs (docs/benchmarks, "Tuning knobs").
TUNING_KNOBS = frozenset(TUNING_PREFIX + n for n in (
    "APPLY_LAST_FIRST", "APPLY_MERGES", "CONVERSION_BYTES_PER_THREAD", "CONVERSION_THREADS",
    "COOPERATIVE_MAX_PER_UNIT", "COOPERATIVE_MAX_PER_UNIT_FULL_TEAMS", "COOPERATIVE_MIN_GROUP",
    "COOPERATIVE_MIN_WORKGROUP", "COUNTER_STRIDE", "FEW_GROUP_ANY_SIZE", "FEW_GROUP_ITEMS", "FEW_GROUP_MIN_TEAM",
    "FEW_WIDE_TEAM_GROUPS", "FEW_WIDE_TEAM_ITEMS", "FRESH_COMMAND_BUFFERS", "FULL_TEAM_MAX_ITEMS",
    "FULL_TEAM_SPILL_ITEMS", "FULL_TEAM_SPILL_ITEMS_HELD", "HOLD_REDUCE", "HOLD_STORAGE", "ITEMS_TARGET",
    "ITEMS_TARGET_CHANNELS", "ITEMS_TARGET_COOPERATIVE", "ITEMS_TARGET_COOPERATIVE_CHANNELS", "ITEMS_TARGET_FP16",
    "ITEMS_TARGET_REDUCE", "ITEMS_TARGET_SMALL", "LANE_GROUPS", "LATENCY_ITEMS", "LATENCY_TEAM", "LATENCY_THREADS",
    "MANY_PLANES", "MAX_ITEMS", "MAX_ITEMS_HELD", "MAX_TEAM_HELD", "MAX_TEAM_HELD_LAYERNORM", "ONE_REDUCTION",
    "PLANE_WEIGHTS", "POLL_LOADS", "SMALL_GROUP", "SPECIALIZE", "UNCACHED_MAPPING", "WAIT_ROUNDS", "WORKGROUP",
))


def switch(name: str) -> bool:
    """A switch as the runtime reads one (its env_flag): on for 1/true/on/yes, off for 0/false/off/no (any case),
    unset or empty; ValueError naming the variable for anything else (VKNORM_CHECK_INPROCESS=false had read as on)."""
    from . import _core

    return _core.env_flag(name)


def vknorm_variables(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The VKNORM_ variables set (any case), by name."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in sorted(env.items()) if k.upper().startswith("VKNORM_")}


def unknown(environ: Optional[Mapping[str, str]] = None) -> List[dict]:
    """The VKNORM_ variables set that the runtime does not read (any case: variable names are case-sensitive):
    {"name", "meant"}, "meant" the setting or knob it likely stood for, or None. Build and test scripts read some
    VKNORM_ variables of their own (VKNORM_CACHE, ...): they show here too, with no likely meaning."""
    env = os.environ if environ is None else environ
    known = {**RUNTIME_SETTINGS, **{k: "" for k in TUNING_KNOBS}}
    out = []
    for name in sorted(k for k in env if k.upper().startswith("VKNORM_")):
        if name not in known:
            out.append({"name": name, "meant": _meant(name, known)})
    return out


def _meant(name: str, known) -> Optional[str]:
    """The known name `name` was likely a slip for: the same in upper case, or the closest by what follows VKNORM_
    (the shared prefix would make short names look alike), never one that differs by NO_ alone (it means the
    opposite: VKNORM_FP16_STORAGE is not a slip for VKNORM_NO_FP16_STORAGE)."""
    if name.upper() in known:
        return name.upper()
    tail = name.upper()[len("VKNORM_"):]
    tails = {k[len("VKNORM_"):]: k for k in known if k.replace("NO_", "") != name.upper().replace("NO_", "")}
    close = difflib.get_close_matches(tail, list(tails), n=1, cutoff=0.8)
    return tails[close[0]] if close else None

"""Test support: the Khronos validation layer's settings file (vk_layer_settings.txt) for the suite.

The conftest points every Vulkan instance of the test process and its children at one settings file
(``session_settings_dir``); runs inside ncnn's own instance write their own (``write_settings`` with a log
file, see graph_runs.validated_env). Both filter the same notices: those about the layer's own age.

ncnn enables every device extension and chains every feature and property structure its headers know; on a
driver newer than the validation layer (Debian's 1.3.239 or trixie's 1.4.309 under NVIDIA's 2026 driver) the
layer reports each as an "unknown VkStructureType", an extension it "does not support" or "not a known
extension string": things it cannot check, not errors. Filtered by VUID, or by message ID where the layer
gives the notice no VUID. Only where they can come: on GPU drivers (NVIDIA's adds an implicit layer of its own,
and ncnn chains what the driver offers) or a device newer than the layer. On a CPU device no newer than the
layer (lavapipe under Debian's layer: the suite's CI) nothing is filtered, so the same VUIDs still report a
structure chained where it is not allowed, vknorm's own included.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

NEWER_THAN_LAYER_NOTICES = (
    "VUID-VkDeviceCreateInfo-pNext-pNext", "VUID-VkPhysicalDeviceProperties2-pNext-pNext",
    "VUID-VkPhysicalDeviceFeatures2-pNext-pNext",
    "0x79de34d4",  # 1.3.239: "Device Extension ... is not supported by this layer"
    "0x297ec5be",  # 1.4.309: "... is not a known extension string"
    # 1.4.309 on NVIDIA, once per process: a vkGetDeviceProcAddr for an instance-level function
    # (vkGetPhysicalDeviceVideoEncodeQualityLevelPropertiesKHR) whose name is in neither vknorm's, ncnn's nor
    # the loader's code, so it comes from a driver-side implicit layer above this one; the call returns null
    "0x22b1fbac",
)
# A layer older than SPV_KHR_cooperative_matrix (1.3.255) cannot parse the SPIR-V that declares it: ncnn's own
# float16 Gemm, convolution and attention shaders on a GPU that has cooperative matrices (NVIDIA's). It reports
# the capability (6022) and the extension as unknown, the module as invalid, the specialization it then cannot
# apply, and a shared-memory size read from the unspecialized defaults. Filtered only in ncnn's instance (the
# runs that log to a file) on GPU drivers: vknorm's shaders declare neither, and its own contexts keep every check;
# CI's lavapipe, which has no cooperative matrices, filters none of these.
UNPARSED_COOPERATIVE_MATRIX_NOTICES = (
    "VUID-VkShaderModuleCreateInfo-pCode-01090", "VUID-VkShaderModuleCreateInfo-pCode-04146",
    "0x6bbb14",  # UNASSIGNED-CoreValidation-Shader-InconsistentSpirv: "Invalid capability operand: 6022"
    "VUID-VkPipelineShaderStageCreateInfo-module-parameter",
    "VUID-VkPipelineShaderStageCreateInfo-pSpecializationInfo-06719", "VUID-RuntimeSpirv-Workgroup-06530",
)
COOPERATIVE_MATRIX_LAYER = (1, 3, 255)


def _version(text: str) -> tuple:
    return tuple(int(p) for p in text.split(".")[:3])


def layer_api_version():
    """The Vulkan version of the Khronos validation layer the loader finds (its manifest; VK_LAYER_PATH first),
    None where none is found."""
    dirs = [d for d in os.environ.get("VK_LAYER_PATH", "").split(os.pathsep) if d]
    dirs += ["/usr/local/share/vulkan/explicit_layer.d", "/usr/share/vulkan/explicit_layer.d",
             "/etc/vulkan/explicit_layer.d"]
    for d in dirs:
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(".json"))
        except OSError:
            continue
        for n in names:
            try:
                with open(os.path.join(d, n)) as f:
                    layer = json.load(f).get("layer", {})
            except (OSError, ValueError):
                continue
            if layer.get("name") == "VK_LAYER_KHRONOS_validation":
                return _version(layer["api_version"])
    return None


def age_notices_expected() -> bool:
    """Whether the layer's notices about its own age can come here: a GPU device, or one newer than the layer
    (asked once, in a child without layers; the answer passed to child processes in VKNORM_TEST_AGE_NOTICES).
    Unknown counts as expected."""
    known = os.environ.get("VKNORM_TEST_AGE_NOTICES")
    if known in ("0", "1"):
        return known == "1"
    layer = layer_api_version()
    env = {k: v for k, v in os.environ.items() if k not in ("VK_INSTANCE_LAYERS", "VKNORM_VALIDATION")}
    proc = subprocess.run([sys.executable, "-c", "import json; from vknorm import _core; "
                           "print(json.dumps([[d['type'], d['api_version']] for d in _core.devices()]))"],
                          env=env, capture_output=True, text=True, timeout=120)
    try:
        devices = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        devices = None
    expected = layer is None or not devices or any(kind != "cpu" or _version(v) > layer for kind, v in devices)
    os.environ["VKNORM_TEST_AGE_NOTICES"] = "1" if expected else "0"
    return expected


def write_settings(settings_dir: str, log_path: str | None = None) -> str:
    """Write vk_layer_settings.txt into ``settings_dir`` (the value for VK_LAYER_SETTINGS_PATH): the age
    notices filtered (where they can come), synchronization validation on; with
    ``log_path``, every warning or error logged there
    (the log of a run inside ncnn's instance, which has no messenger of vknorm's)."""
    # Synchronization validation in the file too, so every instance that reads it has it whether or not the
    # layer version lets a settings file override what the application asks in VkValidationFeaturesEXT.
    lines = ["khronos_validation.enables = VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT"]
    if age_notices_expected():
        notices = NEWER_THAN_LAYER_NOTICES
        layer = layer_api_version()
        if log_path is not None and (layer is None or layer < COOPERATIVE_MATRIX_LAYER):
            notices += UNPARSED_COOPERATIVE_MATRIX_NOTICES
        lines.append(f"khronos_validation.message_id_filter = {','.join(notices)}")
    if log_path is not None:
        lines += ["khronos_validation.debug_action = VK_DBG_LAYER_ACTION_LOG_MSG",
                  f"khronos_validation.log_filename = {log_path}",
                  "khronos_validation.report_flags = error,warn"]
    with open(os.path.join(settings_dir, "vk_layer_settings.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return settings_dir


def session_settings_dir() -> str:
    """A fresh directory holding the suite-wide settings (the age notices filtered where they can come, all else
    default), removed when the process that made it exits (its children, which read it, are done by then)."""
    import atexit
    import shutil

    made = tempfile.mkdtemp(prefix="vknorm-layer-settings-")
    atexit.register(shutil.rmtree, made, True)
    return write_settings(made)


def json_from_stdout(text: str):
    """The JSON document a child printed, past any line the layer printed before it (1.4.309 announces
    its log file on stdout)."""
    start = text.find("{")
    if start < 0:
        raise ValueError(f"no JSON in the output: {text[-2000:]!r}")
    return json.loads(text[start:])


def only_ncnn_clone_hazards(log_text: str) -> bool:
    """True when every message of a validation log is stock ncnn's clone hazard: ncnn copies a blob that an
    in-place layer shares (record_clone) into a block from its pool with no barrier against the copy that
    block last saw (SYNC-HAZARD-WRITE-AFTER-WRITE between two vkCmdCopyBuffer). Stock layers do that in stock
    nets and in vknorm's nets alike; vknorm's own layers run out of place. Seen on NVIDIA's driver, whose
    pool reuse differs from lavapipe's."""
    messages = [m for m in log_text.split("Validation ")[1:] if m.strip()]
    return bool(messages) and all("SYNC-HAZARD-WRITE-AFTER-WRITE" in m and "vkCmdCopyBuffer writes" in m
                                  and "another vkCmdCopyBuffer" in m for m in messages)

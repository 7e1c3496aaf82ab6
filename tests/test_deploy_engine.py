"""The third executor, "a caller's own Vulkan objects" (include/vknorm/recorder.h): vknorm::Recorder makes its
objects on an engine's VkDevice and records into the engine's VkCommandBuffer on the engine's VkBuffer + offset.

examples/engine_example.cpp is that engine: its own instance, device, queue, command pool and one VkBuffer with
two blobs at aligned offsets; ONE command buffer: its upload -> its barrier -> vknorm LayerNorm on blob A (fp32
pack4, c=8 h=5 w=768, x = 1e4 + N(0, 1e-2)) and RMSNorm on blob B (pack1, whole-channel groups of 3003, forced
split path) -> its barrier -> its copy back; one submission. It is built (like tests/test_deploy_cpp.py) against
the installed package through find_package(vknorm) and run with VKNORM_VALIDATION=1 (Khronos validation with
synchronization validation, its own debug messenger) on the default device, lavapipe here. With --channel-norms
the same two blobs run GroupNorm (A: 12 channels in 6 groups) and InstanceNorm (B), gamma and beta per channel.

Tolerance (the example states it): |y - y_float64| <= 84 float32 ulps (84 * 2^-23 = 1.0e-5) x max(1, max|y|),
per blob; B also against vknorm's CPU reference (ncnn's float32 algorithm). A is not compared with that
reference: at |mean| >> std ncnn's float32 sum is itself off by ~0.26 (printed for information).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from availability import missing
from test_deploy_cpp import PREFIX, ROOT, cmake_env, generator_args, installed, run  # noqa: F401  (installed: fixture)

ENGINE_BUILD = os.path.join(ROOT, "build", "cxx-engine-example")
ENGINE_EXE = os.path.join(ENGINE_BUILD, "engine_example")
FLT_EPSILON = 2.0 ** -23
ULPS = 84

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def engine_example(installed):  # noqa: F811
    """examples/ configured from scratch against the installed package, engine_example built."""
    env = cmake_env()
    shutil.rmtree(ENGINE_BUILD, ignore_errors=True)
    run(["cmake", "-S", os.path.join(ROOT, "examples"), "-B", ENGINE_BUILD, *generator_args(ENGINE_BUILD),
         f"-DCMAKE_PREFIX_PATH={PREFIX}"], "configure the examples", env=env)
    run(["cmake", "--build", ENGINE_BUILD, "--target", "engine_example"], "build engine_example", env=env)
    assert os.access(ENGINE_EXE, os.X_OK)
    return ENGINE_EXE


# The cooperative path on lavapipe: 2 resident workgroups declared, both run at once, groups split in 2 chunks.
TWO_RESIDENT_WORKGROUPS = {"VKNORM_COOPERATIVE_WORKGROUPS": "2", "VKNORM_TUNE_ITEMS_TARGET_COOPERATIVE": "1",
                           "LP_NUM_THREADS": "2"}


def launch(exe, *args, validation=True, extra_env=None):
    env = dict(os.environ)
    env.pop("VKNORM_VALIDATION", None)
    if validation:
        env["VKNORM_VALIDATION"] = "1"
    env.update(extra_env or {})
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


ERROR_LINE = re.compile(r"^(A|B) max abs error (\S+) vs (float64|CPU reference), bound (\S+) = 84 float32 ulps "
                        r"\(2\^-23\) x max\(1, max\|y\|\) (\S+)$", re.M)


def errors(out):
    """{(blob, reference): (error, bound, scale)} from the example's report; the bound re-derived here."""
    found = {}
    for blob, err, ref, bound, scale in ERROR_LINE.findall(out):
        err, bound, scale = float(err), float(bound), float(scale)
        assert scale >= 1
        assert bound == pytest.approx(ULPS * FLT_EPSILON * scale, rel=1e-3), (bound, scale)
        found[(blob, ref)] = (err, bound, scale)
    return found


def validation_messages(out):
    m = re.search(r"^validation messages: (\d+)$", out, re.M)
    assert m, out
    return int(m.group(1))


def assert_clean_run(proc):
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "validation: on (VK_LAYER_KHRONOS_validation, synchronization validation)" in out, \
        "the Khronos validation layer is not installed (make setup installs vulkan-validationlayers)\n" + out
    assert validation_messages(out) == 0, out
    errs = errors(out)
    assert set(errs) == {("A", "float64"), ("B", "float64"), ("B", "CPU reference")}, out
    for (blob, ref), (err, bound, _) in errs.items():
        assert err <= bound, f"{blob} vs {ref}: {err:.3e} > {bound:.3e}\n{out}"
    assert "bytes outside the blobs' groups changed: 0" in out, out
    assert out.rstrip().splitlines()[-1] == "OK", out
    return errs


# ------------------------------------------------------------------------------ the engine's own objects

def test_layernorm_and_rmsnorm_recorded_into_the_engines_command_buffer_match_float64(engine_example):
    proc = launch(engine_example)
    errs = assert_clean_run(proc)
    out = proc.stdout
    # A: one fused dispatch; B: the split path's reduce -> finalize -> apply (vknorm's barriers between them)
    assert re.search(r"^A LayerNorm .*: path (subgroup|workgroup) \(\S+ reductions\), 1 dispatch\(es\) x 1$", out, re.M), out
    assert re.search(r"^B RMSNorm .*: path split, 3 dispatch\(es\) x 1$", out, re.M), out
    # blob B sits at an aligned, non-zero offset after A, in the same buffer
    m = re.search(r"blob A at offset (\d+) \((\d+) bytes\), blob B at offset (\d+)", out)
    align = int(re.search(r"minStorageBufferOffsetAlignment (\d+)", out).group(1))
    off_a, bytes_a, off_b = map(int, m.groups())
    assert off_a > 0 and off_b >= off_a + bytes_a and off_a % align == 0 and off_b % align == 0, out
    # float32-exact at |mean| >> std, where ncnn's own float32 algorithm is far off
    assert errs[("A", "float64")][0] < 1e-5, out
    cpu = float(re.search(r"ncnn's float32 algorithm, vs float64: (\S+)", out).group(1))
    assert cpu > 100 * errs[("A", "float64")][1], out
    print(out)


@pytest.mark.parametrize("profile", [{"VKNORM_NO_SUBGROUP": "1"}, {"VKNORM_MAX_SHARED_MEMORY": "256"}],
                         ids=["no_subgroup", "shared_256"])
def test_the_capability_profile_applies_to_the_engines_device(engine_example, profile):
    """The capability profile makes a Recorder plan for the engine's device as for a smaller one, as vknorm's
    own context does: VKNORM_NO_SUBGROUP, shared-memory reductions only (where the device has subgroup
    reductions, the default run uses them); VKNORM_MAX_SHARED_MEMORY=256, workgroups whose shared memory fits
    (the plan may change path). Each still float64-close and validation-clean."""
    proc = launch(engine_example, extra_env=profile)
    assert_clean_run(proc)
    if "VKNORM_NO_SUBGROUP" in profile:
        assert re.search(r"^A LayerNorm .*\(shared-memory reductions\), \d dispatch\(es\) x 1$", proc.stdout, re.M), \
            proc.stdout


def test_repeated_forwards_share_scratch_and_descriptor_sets_without_hazards(engine_example):
    """Three rounds of both forwards in one command buffer, only the engine's buffer barrier between rounds:
    vknorm's own barriers order its shared split-path scratch (synchronization validation stays silent), and
    one cached descriptor set per layer serves every round."""
    proc = launch(engine_example, "--repeat", "3")
    assert_clean_run(proc)
    assert "descriptor sets cached: LayerNorm 1, RMSNorm 1" in proc.stdout, proc.stdout
    assert re.search(r"^B RMSNorm .*: path split, 3 dispatch\(es\) x 3$", proc.stdout, re.M), proc.stdout


def test_cooperative_forwards_of_one_recorder_at_another_layout_clear_its_scratch_first(engine_example):
    """Blob B as a LayerNorm in two cooperative forwards of one Recorder, its first 2 channels then its last one,
    twice: the chunks of each group wait on each other (2 resident workgroups declared, groups of 3003 in 2
    chunks). The second forward's smaller scratch puts the counters where the first one's partials were, so the
    Recorder must clear them again rather than take them for the zeros the first forward left behind."""
    proc = launch(engine_example, "--cooperative-reuse", "--repeat", "2",
                  extra_env=TWO_RESIDENT_WORKGROUPS)
    assert_clean_run(proc)
    assert re.search(r"^B LayerNorm .*cooperative \(2 forwards\): path cooperative, 1 dispatch\(es\) x 2$",
                     proc.stdout, re.M), proc.stdout
    # a descriptor set per layout of B, each serving both rounds
    assert "descriptor sets cached: LayerNorm 1, LayerNorm (B) 2" in proc.stdout, proc.stdout


@pytest.mark.parametrize("merges", ["1", "0"], ids=["apply-merges", "finalize"])
def test_a_split_forward_between_two_cooperative_ones_makes_the_second_clear_its_counters(engine_example, merges):
    """B's InstanceNorm recorded cooperative, then split, then cooperative again, in one Recorder's scratch
    (partials from its start, the cooperative kernel's counters after them). A split forward whose apply merges
    the partials itself (GPUs; VKNORM_TUNE_APPLY_MERGES=1 here) writes no coefficients, only partials, and those
    reached the bytes where the first forward had left its counters zero: the third forward took them for zero,
    skipped its clear, and B came out wrong by 2.0."""
    proc = launch(engine_example, "--channel-norms", "--cooperative-reuse", "--split-between",
                  extra_env=dict(TWO_RESIDENT_WORKGROUPS, VKNORM_TUNE_APPLY_MERGES=merges))
    assert_clean_run(proc)
    assert re.search(r"^B InstanceNorm .*cooperative, split, cooperative: path cooperative", proc.stdout, re.M), proc.stdout


@pytest.mark.parametrize("merges", ["1", "0"], ids=["apply-merges", "finalize"])
def test_a_cooperative_forward_after_a_dropped_one_clears_the_counters(engine_example, merges):
    """--drop-cooperative: a split forward of B's InstanceNorm runs (its partials in the Recorder's scratch), then a
    cooperative one is recorded into a command buffer never submitted (a dropped frame), then load_model() is
    called again, as recorder.h says for a dropped frame. The Recorder had taken the dropped clear as done: the
    next cooperative forward skipped its own and ran on the split forward's partials."""
    proc = launch(engine_example, "--channel-norms", "--drop-cooperative",
                  extra_env=dict(TWO_RESIDENT_WORKGROUPS, VKNORM_TUNE_APPLY_MERGES=merges))
    assert_clean_run(proc)
    assert "a cooperative forward dropped after a split one" in proc.stdout, proc.stdout
    assert re.search(r"^B InstanceNorm .*cooperative \(after a dropped one\): path cooperative", proc.stdout, re.M), \
        proc.stdout


@pytest.mark.parametrize("channel_norms", [False, True], ids=["layernorm", "instancenorm"])
def test_a_forward_after_one_whose_waits_gave_up_finds_the_counters_zero(engine_example, channel_norms):
    """--give-up-first: B (a LayerNorm, or InstanceNorm) recorded cooperative after a forward of its Recorder over
    the same blob and scratch whose waits all gave up (VKNORM_TUNE_WAIT_ROUNDS=0, as a stalled device would
    make them: every value NaN, copied aside and counted); the engine uploads B again between the two. The Recorder skips the second forward's
    clear pass, so it is right only if the forward that gave up left the counters zero. When it left them as
    they were, every chunk found itself claimed and left: B came back as its input."""
    proc = launch(engine_example, "--give-up-first", *(["--channel-norms"] if channel_norms else []),
                  extra_env=TWO_RESIDENT_WORKGROUPS)
    assert_clean_run(proc)
    m = re.search(r"^B after the forward whose waits gave up: (\d+) of (\d+) values NaN$", proc.stdout, re.M)
    assert m and int(m.group(1)) == int(m.group(2)) == 9009, proc.stdout  # 3 x 3 x 1001: every value given up
    assert re.search(r"^B (LayerNorm|InstanceNorm) .*cooperative \(after a forward that gave up\): path cooperative, "
                     r"1 dispatch\(es\) x 1$", proc.stdout, re.M), proc.stdout


@pytest.mark.parametrize("flags", [(), ("--channel-norms",), ("--cooperative-reuse", "--repeat", "2"),
                                   ("--give-up-first", "--channel-norms")],
                         ids=["layernorm-rmsnorm", "groupnorm-instancenorm", "cooperative-twice", "after-a-give-up"])
def test_a_recorded_command_buffer_submitted_again_gives_the_same_outputs(engine_example, flags):
    """Command buffers vknorm recorded into may be submitted again (recorder.h): --resubmit submits the engine's one
    command buffer a second time once the first has completed, the engine's upload of the inputs included, and the
    outputs are checked after the second. It reruns the weights' upload vknorm recorded there (its first record
    after load_model) and every forward as recorded: cooperative ones skip their clear pass again, right only if the
    forwards before them left the counters zero, also where every wait gave up."""
    cooperative = any(f in flags for f in ("--cooperative-reuse", "--give-up-first"))
    proc = launch(engine_example, "--resubmit", *flags, extra_env=TWO_RESIDENT_WORKGROUPS if cooperative else None)
    assert_clean_run(proc)
    assert "command buffer submitted again" in proc.stdout, proc.stdout


def test_the_same_bytes_recorded_at_another_shape_get_a_descriptor_set_of_their_own(engine_example):
    """A second frame after release_descriptors(), as an engine's next inference whose allocator hands out blob
    B's bytes again: B's channels 0 and 2 as a blob of twice the cstep (2 groups), then all of B (3 groups), at
    the same offset and span, within the scratch the first frame left. The 3-group forward needs more of the
    scratch than the 2-group one, so it must not reuse the first one's set (it did: every partial of the third
    group fell outside the set's range, max error 33 with no validation message)."""
    proc = launch(engine_example, "--rebind")
    assert_clean_run(proc)
    # frame 2: channels 0 and 2, all three (another set at the same binding), channel 1
    assert "descriptor sets cached in the second frame: RMSNorm 3" in proc.stdout, proc.stdout
    assert re.search(r"^B RMSNorm .*split \(2 frames\): path split, 3 dispatch\(es\) x 1$", proc.stdout, re.M), \
        proc.stdout


# ------------------------------------------------------------------------------ GroupNorm and InstanceNorm

def test_a_recorder_fed_inputs_of_many_sizes_keeps_a_bounded_number_of_pipelines(engine_example):
    """--sizes 40: B's InstanceNorm Recorder over 40 inputs whose planes (the group size) differ, each checked
    against float64 as B is. The group size is a specialization constant for the first 16 sizes only; later
    ones plan without it, so an engine fed inputs of any size keeps at most a pipeline for every two sizes
    (before: one per size, kept for the Recorder's life)."""
    proc = launch(engine_example, "--channel-norms", "--sizes", "40")
    assert_clean_run(proc)
    m = re.search(r"^sizes: InstanceNorm over 40 group sizes \(w = 100\.\.139\): (\d+) pipelines kept \((\d+) before\); "
                  r"max error (\S+) of the bound$", proc.stdout, re.M)
    assert m and float(m.group(3)) <= 1, proc.stdout
    assert int(m.group(1)) - int(m.group(2)) <= 20, proc.stdout


@pytest.mark.parametrize("channel_norms", [False, True], ids=["layernorm-rmsnorm", "groupnorm-instancenorm"])
def test_load_model_after_a_record_gives_the_next_record_the_new_weights(engine_example, channel_norms):
    """--reload: both Recorders load other weights (2 * w + 1) and record into a command buffer that is never
    submitted; then load the real ones. The forwards recorded next, at the same blobs and scratch, read the
    real weights (a descriptor set cached by the first record names the replaced weights buffer)."""
    proc = launch(engine_example, "--reload", *(["--channel-norms"] if channel_norms else []))
    assert "weights reloaded after a record" in proc.stdout, proc.stdout + proc.stderr
    assert_clean_run(proc)


def test_groupnorm_and_instancenorm_recorded_into_the_engines_command_buffer_match_float64(engine_example):
    """--channel-norms: blob A as GroupNorm(12 channels in 6 groups: 2 channels per group, inside pack4 lanes;
    7x5 planes) at |mean| >> std, blob B as InstanceNorm on the split path (3 channels of 1001x3, cstep 3004),
    gamma and beta per channel, twice in one command buffer: both against float64, B against the CPU reference
    too."""
    proc = launch(engine_example, "--channel-norms", "--repeat", "2")
    errs = assert_clean_run(proc)
    out = proc.stdout
    assert re.search(r"^A GroupNorm dims=3 c=12 h=5 w=7 float32 pack4.*: path (subgroup|workgroup) \(\S+ reductions\), 1 dispatch\(es\) x 2$",
                     out, re.M), out
    # split: reduce -> finalize -> apply, or on GPUs reduce -> apply (each chunk's team merges its item itself)
    assert re.search(r"^B InstanceNorm .*: path split, [23] dispatch\(es\) x 2$", out, re.M), out
    assert "descriptor sets cached: GroupNorm 1, InstanceNorm 1" in out, out
    assert errs[("A", "float64")][0] < 1e-4, out


def test_channel_norms_in_pieces_bind_their_weights_from_each_piece_s_first_channel(engine_example):
    """VKNORM_MAX_BUFFER_BYTES=600: GroupNorm's blob A in pieces of one packed channel (4 channels, 2 groups: its
    per-channel weights then start 16 bytes further each piece), B not recorded; =20000: A whole, and
    InstanceNorm's B in pieces of one channel, whose weights would start 4 bytes further (not a vec4
    boundary): refused with a clear message."""
    env = dict(os.environ, VKNORM_MAX_BUFFER_BYTES="600")  # A: packed channels of 560 bytes, 560 bytes apart
    proc = subprocess.run([engine_example, "--channel-norms", "--skip-rmsnorm"], capture_output=True, text=True,
                          timeout=120, env=env)
    if alignment(proc.stdout) <= 16:  # A's pieces are bound 560 bytes apart: not every device binds there
        assert proc.returncode == 1, proc.stdout + proc.stderr  # --skip-rmsnorm: B stays un-normalized (the control)
        assert "pieces: A 3, B 0" in proc.stdout and validation_messages(proc.stdout) == 0, proc.stdout
        errs = errors(proc.stdout)
        assert errs[("A", "float64")][0] <= errs[("A", "float64")][1], proc.stdout
    else:
        assert proc.returncode == 2, proc.stdout + proc.stderr
    proc = subprocess.run([engine_example, "--channel-norms"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, VKNORM_MAX_BUFFER_BYTES="20000"))
    assert proc.returncode == 2 and "would bind the per-channel weights at byte 4" in proc.stderr, proc.stdout + proc.stderr


def test_channel_norms_cooperative_and_refusals(engine_example):
    """InstanceNorm's B in two cooperative forwards of one Recorder (its chunks waiting on each other), and what a
    GroupNorm/InstanceNorm Recorder refuses: wrong channels, params ncnn refuses, the LayerNorm constructor,
    wrong weights, none loaded, weights of a piece off a vec4."""
    proc = launch(engine_example, "--channel-norms", "--cooperative-reuse", "--refusals",
                  extra_env=TWO_RESIDENT_WORKGROUPS)
    assert_clean_run(proc)
    assert re.search(r"^B InstanceNorm .*cooperative \(2 forwards\): path cooperative, 1 dispatch\(es\) x 1$",
                     proc.stdout, re.M), proc.stdout
    expected = {
        "8 channels into a GroupNorm of 12": "channels",
        "channels that do not divide into the groups": "channels=12 do not divide into group=5 groups",
        "affine with no channels": "affine=1 needs channels > 0",
        "GroupNorm by affine_size": "takes group and channels: construct it from NormParams",
        "gamma of the wrong size": "gamma has 10 values, expected channels=12",
        "beta missing": "beta has 0 values, expected channels=12",
        "no weights loaded (affine=1)": "affine=1 but no weights loaded: call load_model first",
        "pieces whose per-channel weights would start off 16 bytes": "would bind the per-channel weights at byte 4",
        "a dims-1 float16 GroupNorm without storageBuffer16BitAccess":
            "this dims-1 float16 blob is read unpacked, its 8 channels single elements, as single float16 values",
    }
    lines = dict(re.findall(r"^refusal (.+?): (.*)$", proc.stdout, re.M))
    assert set(lines) == set(expected), proc.stdout
    if "16-bit storage enabled" not in proc.stdout:  # nothing for the profile to hide
        expected["float16 elempack-1 groups with 16-bit storage hidden by the capability profile"] = "not enabled anyway"
    for case, phrase in expected.items():  # a phrase, or a pattern where the plan is the device's
        assert (phrase.search(lines[case]) if isinstance(phrase, re.Pattern) else phrase in lines[case]), \
            f"{case}: {lines[case]}"


def test_vknorm_opens_the_system_loader_when_given_no_proc_addr(engine_example):
    assert_clean_run(launch(engine_example, "--system-loader"))


# ------------------------------------------------------------------------------ refused inputs

def test_misaligned_offset_is_refused_with_a_clear_error(engine_example):
    proc = launch(engine_example, "--misalign")
    if proc.returncode == 4:
        missing("minStorageBufferOffsetAlignment is 1 on this device: no offset is misaligned (lavapipe aligns to 16)")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert re.search(r"vknorm refused an input: vknorm::Recorder::record \(dims=3 w=1001 h=3 c=3 cstep=3004 "
                     r"elempack=1 float32\): offset \d+ is not a multiple of the device's "
                     r"minStorageBufferOffsetAlignment \(\d+\)", proc.stderr), proc.stderr
    assert validation_messages(proc.stdout) == 0, proc.stdout  # torn down cleanly, nothing half-recorded


def test_bad_inputs_are_refused_before_anything_is_recorded(engine_example):
    """Each bad call throws std::invalid_argument with a message naming the problem; the same command buffer
    then carries the normal run, which validates cleanly and matches the references."""
    proc = launch(engine_example, "--refusals")
    assert_clean_run(proc)
    expected = {
        "affine_size 768 against rows of 700": "affine_size 768 does not match the input's trailing dims (h=5, w=700)",
        "dims 5": "dims must be 1-4",
        "elempack 8": "elempack must be 1 or 4",
        "a zero extent": "every extent must be >= 1",
        "cstep below w*h": "cstep 100 is less than a channel's w*h*d elements",
        "an offset off minStorageBufferOffsetAlignment": "is not a multiple of the device's minStorageBufferOffsetAlignment",
        "a range smaller than the blob": "range 122864 bytes is smaller than the blob's 122880 bytes",
        "no weights loaded (affine=1)": "affine=1 but no weights loaded: call load_model first",
        "float16 elempack-1 groups of odd size without storageBuffer16BitAccess":
            "needs storageBuffer16BitAccess enabled on the device (VulkanHandles::fp16_storage_enabled)",
        "float16 elempack-1 groups with 16-bit storage hidden by the capability profile":
            "the capability profile (VKNORM_NO_FP16_STORAGE or VKNORM_VULKAN_API below 1.1 in the environment) "
            "plans as if the device had no storageBuffer16BitAccess",
        "a dims-1 float16 group past the fused kernel without storageBuffer16BitAccess":
            re.compile(r"this dims-1 float16 blob is read unpacked, one group of 262144 elements, on the (split|cooperative) "
                       r"path, as single float16 values"),
        "a group larger than one storage buffer binding":
            "exceed one storage buffer binding (maxStorageBufferRange",
        "pieces at offsets off minStorageBufferOffsetAlignment":
            "its piece of whole groups at byte 4004 would be bound at offset",
        "gamma of the wrong size": "gamma has 10 values, expected affine_size=768",
        "no device": "VulkanHandles needs the caller's instance, physical_device and device",
    }
    lines = dict(re.findall(r"^refusal (.+?): (.*)$", proc.stdout, re.M))
    if alignment(proc.stdout) <= 4:  # every piece offset (a multiple of 4 bytes) is aligned: nothing to refuse
        expected["pieces at offsets off minStorageBufferOffsetAlignment"] = "not applicable"
    assert "cannot be split, a group being normalized whole: plan_pieces: a group of" in lines["a group larger than one storage buffer binding"]
    assert "))" not in lines["a group larger than one storage buffer binding"]
    assert set(lines) == set(expected), proc.stdout
    if "16-bit storage enabled" not in proc.stdout:  # nothing for the profile to hide
        expected["float16 elempack-1 groups with 16-bit storage hidden by the capability profile"] = "not enabled anyway"
    for case, phrase in expected.items():  # a phrase, or a pattern where the plan is the device's
        assert (phrase.search(lines[case]) if isinstance(phrase, re.Pattern) else phrase in lines[case]), \
            f"{case}: {lines[case]}"


def alignment(out):
    return int(re.search(r"minStorageBufferOffsetAlignment (\d+)", out).group(1))


# ------------------------------------------------------------------------------ pieces and GPU time

def test_blobs_past_the_binding_limit_are_recorded_in_pieces_of_whole_groups(engine_example):
    """VKNORM_MAX_BUFFER_BYTES=20000 (as if the device bound 20000 bytes per storage buffer): blob A (rows of
    768 float32 x 4 lanes, 12288 bytes each) goes in 10 pieces of one packed row, blob B (3 channels of 3003,
    split path) in 3 pieces of one channel, each bound at its own offset of the engine's buffer; twice in one
    command buffer, so the split path's scratch is shared by 6 pieces (synchronization validation watches
    vknorm's barriers). Results as without pieces; no byte outside the groups changes."""
    env = dict(os.environ, VKNORM_MAX_BUFFER_BYTES="20000")
    proc = subprocess.run([engine_example, "--repeat", "2"], capture_output=True, text=True, timeout=120, env=env)
    if alignment(proc.stdout) > 16:  # B's channels are 12016 bytes apart: not every device binds there
        assert proc.returncode == 2 and "would be bound at offset" in proc.stderr, proc.stdout + proc.stderr
        return
    assert_clean_run(proc)
    assert "pieces: A 10, B 3" in proc.stdout, proc.stdout
    assert re.search(r"^B RMSNorm .*: path split, 9 dispatch\(es\) x 2$", proc.stdout, re.M), proc.stdout
    whole = launch(engine_example)
    assert "pieces: A 1, B 1" in whole.stdout, whole.stdout


def test_gpu_time_of_each_recorded_forward_is_read_after_the_submission(engine_example):
    """Recorder::set_timing(true): every record() brackets its dispatches with timestamps in the engine's own
    command buffer; gpu_times_us() gives one time per forward, in order, each above zero and together within
    the submission's wall time; read once, nothing is left. Then B once more in a command buffer of its own, on
    the query pair the read freed: exactly one time, above zero."""
    proc = launch(engine_example, "--timing", "--repeat", "3")
    assert_clean_run(proc)
    import vknorm  # the Recorder describes the engine's device as vknorm's own context does

    own = vknorm.device_info()
    assert f"recorder's device: {own['name']}, driver {own['driver_name']}, timestamps yes" in proc.stdout, \
        (own, proc.stdout)
    times = {k: [float(v) for v in vals.split()] for k, vals in re.findall(r"^gpu time (A|B|A again) \(us\):(.*)$",
                                                                            proc.stdout, re.M)}
    wall = float(re.search(r"^submission wall time \(us\): (\S+)$", proc.stdout, re.M).group(1))
    assert len(times["A"]) == 3 and len(times["B"]) == 3 and times["A again"] == [], proc.stdout
    assert all(t > 0 for t in times["A"] + times["B"]), proc.stdout
    assert sum(times["A"]) + sum(times["B"]) <= wall, proc.stdout
    again = re.search(r"^gpu time B, second submission \(us\):(.*)$", proc.stdout, re.M).group(1).split()
    assert len(again) == 1 and float(again[0]) > 0, proc.stdout


# ------------------------------------------------------------------------------ negative controls

def test_check_fails_when_vknorm_does_not_run(engine_example):
    proc = launch(engine_example, "--skip-rmsnorm")
    assert proc.returncode == 1 and proc.stdout.rstrip().endswith("FAIL"), proc.stdout
    err, bound, _ = errors(proc.stdout)[("B", "float64")]
    assert err > 1000 * bound, proc.stdout


def test_check_fails_on_one_corrupted_output_element(engine_example):
    proc = launch(engine_example, "--corrupt")
    assert proc.returncode == 1 and proc.stdout.rstrip().endswith("FAIL"), proc.stdout
    errs = errors(proc.stdout)
    assert errs[("A", "float64")][0] == pytest.approx(0.5, abs=1e-3), proc.stdout
    assert errs[("B", "float64")][0] <= errs[("B", "float64")][1], proc.stdout


def test_synchronization_validation_reports_a_missing_engine_barrier(engine_example):
    """Without the engine's transfer -> compute barrier before vknorm's dispatches, synchronization validation
    reports the hazard (so a clean run means something), and the example fails."""
    proc = launch(engine_example, "--no-barrier")
    assert proc.returncode == 1 and proc.stdout.rstrip().endswith("FAIL"), proc.stdout
    assert validation_messages(proc.stdout) >= 1, proc.stdout
    assert "SYNC-HAZARD" in proc.stdout, proc.stdout


# ------------------------------------------------------------------------------ building on other hosts

def test_examples_take_the_vulkan_location_from_the_environment(engine_example, tmp_path):
    """Vulkan_INCLUDE_DIR / Vulkan_LIBRARY in the environment, the hints vknorm's own build honours (an offline
    GPU host carries the headers outside /usr/include): the examples' configure uses them over the system's."""
    with open(os.path.join(ENGINE_BUILD, "CMakeCache.txt")) as f:
        cache = f.read()
    include = re.search(r"^Vulkan_INCLUDE_DIR:\w+=(.*)$", cache, re.M).group(1)
    library = re.search(r"^Vulkan_LIBRARY:\w+=(.*)$", cache, re.M).group(1)
    carried = tmp_path / "carried" / "include"
    carried.mkdir(parents=True)
    for entry in os.listdir(include):
        if entry.startswith(("vulkan", "vk_")):
            os.symlink(os.path.join(include, entry), carried / entry)
    build = tmp_path / "build"
    env = dict(cmake_env(), Vulkan_INCLUDE_DIR=str(carried), Vulkan_LIBRARY=os.path.realpath(library))
    run(["cmake", "-S", os.path.join(ROOT, "examples"), "-B", str(build), *generator_args(str(build)),
         f"-DCMAKE_PREFIX_PATH={PREFIX}"], "configure the examples with carried Vulkan headers", env=env)
    with open(build / "CMakeCache.txt") as f:
        cache = f.read()
    assert re.search(rf"^Vulkan_INCLUDE_DIR:\w+={re.escape(str(carried))}$", cache, re.M), cache[:3000]
    assert re.search(rf"^Vulkan_LIBRARY:\w+={re.escape(os.path.realpath(library))}$", cache, re.M)
    generated = build / ("build.ninja" if (build / "build.ninja").exists() else "Makefile")
    assert "engine_example" in generated.read_text(), "the examples' configure did not find Vulkan"


# ------------------------------------------------------------------------------ the public header

@pytest.mark.parametrize("order", ["recorder only", "vulkan first", "recorder first"])
def test_recorder_header_needs_no_vulkan_and_agrees_with_it(installed, tmp_path, order):  # noqa: F811
    """include/vknorm/recorder.h declares Vulkan's handle types itself, identically: it compiles alone and
    with <vulkan/vulkan.h> included before or after it."""
    header = os.path.join(PREFIX, "include", "vknorm", "recorder.h")
    with open(header) as f:
        assert not re.search(r"#\s*include\s*[<\"]vulkan", f.read())
    includes = {"recorder only": ["<vknorm/recorder.h>"],
                "vulkan first": ["<vulkan/vulkan.h>", "<vknorm/recorder.h>"],
                "recorder first": ["<vknorm/recorder.h>", "<vulkan/vulkan.h>"]}[order]
    src = tmp_path / "tu.cpp"
    src.write_text("".join(f"#include {i}\n" for i in includes) +
                   "void f(VkCommandBuffer cmd, VkBuffer b, vknorm::Recorder& r) {\n"
                   "  r.record(cmd, {b, 0, vknorm::kWholeSize}, 1, 16, 1, 1, 1, 16, 1, false);\n}\n")
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        missing("no C++ compiler (make setup installs build-essential)")
    run([cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", f"-I{os.path.join(PREFIX, 'include')}", str(src)],
        f"compile with {order}")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

#!/usr/bin/env python3
"""The figures in docs/reliability.md, from real runs.

    .venv/bin/python tools/reliability_report.py [--fuzz-scale N] [--quick] [--bitflip-stride N]
        [--no-graph | --only-graph] [--write]

Runs every scenario of tests/reliability_lib.py (vknorm's own runtime, `vknorm check`) in a process of
its own, under VKNORM_VALIDATION=1 (the per-forward overhead also without), every in-graph scenario of
tests/reliability_graph.py (vknorm inside ncnn's Vulkan graph, the validation layer loaded into ncnn's
instance) at full size, the .param bit flips through `vknorm check` and `vknorm check --vulkan`, then the
reliability test files with hypothesis statistics (VKNORM_FUZZ_SCALE=N times the CI budget), and prints
the figures as markdown. --write replaces the text between the `figures:begin` / `figures:end` markers of
docs/reliability.md (and stores the raw numbers in docs/reliability.json). --quick skips the multi-GiB runs.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from vknorm.cli import positive_int

REPO = Path(__file__).resolve().parent.parent
LIB = REPO / "tests" / "reliability_lib.py"
DOC = REPO / "docs" / "reliability.md"
RAW = REPO / "docs" / "reliability.json"
PY = sys.executable


class Steps:
    """One progress bar on stderr over the run's steps (a scenario or a test file each; they take from seconds to
    an hour, so it counts steps, not time) with the step under way; each finished step keeps a line of its own."""

    def __init__(self, total: int = 0):
        self.bar = None
        if total:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="step", file=sys.stderr, dynamic_ncols=True)
            except ImportError:  # lines only
                pass

    def start(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_description(label[:60])

    def done(self, line: str) -> None:
        if self.bar is None:
            print(line, file=sys.stderr)
        else:
            self.bar.write(line, file=sys.stderr)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


STEPS = Steps()  # main() sets the run's


def planned_steps(args) -> int:
    """What main() runs, in steps (keep in step with own_runtime and graph_scenarios)."""
    own = 0 if args.only_graph else 8 + (0 if args.quick else 3) + 1  # scenarios, then test_reliability.py
    graph = 0 if args.no_graph else 24 + 1 + 1  # scenarios, the bit flips through check --vulkan, the test file
    return own + graph + 1  # and the fuzz file


def scenario(name: str, kwargs: dict = None, validation: bool = True, timeout: int = 1800) -> dict:
    env = dict(os.environ, VKNORM_VALIDATION="1" if validation else "0", VKNORM_VALIDATION_PRINT="1")
    for k in ("VKNORM_MAX_BUFFER_BYTES", "VKNORM_MAX_DEVICE_BYTES", "VKNORM_PATH", "VKNORM_DEBUG_LEAK_BUFFER"):
        env.pop(k, None)
    t0 = time.perf_counter()
    STEPS.start(f"{name} {kwargs or ''}")
    proc = subprocess.run([PY, str(LIB), "run", name, json.dumps(kwargs or {})], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["_wall_seconds"] = time.perf_counter() - t0
    out["_validation_lines"] = sum(ln.startswith("vknorm: validation:") for ln in proc.stderr.splitlines())
    STEPS.done(f"  {name} {kwargs or ''}: {time.perf_counter() - t0:.1f} s")
    return out


def pytest_stats(path: str, scale: int) -> dict:
    """Run one test file with hypothesis statistics; per test: examples run, failures, events."""
    env = dict(os.environ, VKNORM_VALIDATION="1", VKNORM_FUZZ_SCALE=str(scale))
    t0 = time.perf_counter()
    STEPS.start(path)
    proc = subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", path, "--hypothesis-show-statistics"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=7200)
    seconds = time.perf_counter() - t0
    STEPS.done(f"  {path}: {seconds:.1f} s")
    tests, current = {}, None
    for line in proc.stdout.splitlines():
        m = re.match(r"^\S+::(\w+):$", line)
        if m:
            current = tests.setdefault(m.group(1), {"passing": 0, "failing": 0, "invalid": 0, "events": {}})
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) passing examples, (\d+) failing examples, (\d+) invalid examples", line)
        if m:
            for k, v in zip(("passing", "failing", "invalid"), m.groups()):
                current[k] += int(v)
        m = re.match(r"^\s+\* ([\d.]+)%, (.+)$", line)
        if m and "Retried draw" not in m.group(2):
            current["events"][m.group(2)] = float(m.group(1))
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
    falsifying = re.findall(r"^E\s+Falsifying (?:explicit )?example:.*?(?=^E\s+Explanation:|^\S|\Z)", proc.stdout,
                            re.M | re.S)
    return {"tests": tests, "summary": summary, "seconds": seconds, "exit": proc.returncode,
            "falsifying": [f[:3000] for f in falsifying]}


def device() -> dict:
    keys = ("name", "driver_info", "max_storage_buffer_range", "device_local_bytes")
    code = f"import json, vknorm; d = vknorm.device_info(); print(json.dumps({{k: d[k] for k in {keys!r}}}))"
    return json.loads(subprocess.run([PY, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                                     env=dict(os.environ, VKNORM_VALIDATION="0")).stdout)


def mib(b) -> str:
    return f"{b / (1 << 20):.0f} MiB" if b >= 1 << 20 else f"{b / 1024:.1f} KiB" if b >= 1024 else f"{b} B"


def markdown(r: dict) -> str:
    d, lt, lc = r["device"], r["lifetime"], r["lifecycle"]
    ov1, ov0 = r["overhead_validation"], r["overhead_plain"]
    th, ld, gil = r["threads"], r["loads"], r["gil"]
    lines = [
        f"Generated by `tools/reliability_report.py` on {r['date']} ({d['name']}, {d['driver_info']}; "
        f"{r['cpus']} CPUs; Python {r['python']}). maxStorageBufferRange {mib(d['max_storage_buffer_range'])}, "
        f"device-local heap {mib(d['device_local_bytes'])}.",
        "",
        "| what | run | result |",
        "|---|---|---|",
        f"| validation, lifecycle | {lc['refused']} refused calls among every path / storage / pieces / threads; "
        f"2 devices and the instance destroyed | {len(lc['messages'])} validation messages (stderr lines: "
        f"{lc['_validation_lines']}); buffers left on the devices before destruction: {sum(lc['own'][1::2])} |",
        f"| per-forward overhead, 4x16 | {ov1['_n']} forwards each | numpy {ov0['numpy_ms']:.3f} ms, VkMat "
        f"{ov0['vkmat_ms']:.3f} ms without validation; {ov1['numpy_ms']:.3f} / {ov1['vkmat_ms']:.3f} ms with |",
        f"| lifetime | {lt['forwards']} forwards, {lt['ms_per_forward']:.2f} ms each (validation on), "
        f"{lt['checked']} checked against float64 | device bytes: baseline {lt['baseline_bytes']}, steady "
        f"{lt['steady_bytes']} ({lt['steady_buffers']} buffers: the weights), after the loop {lt['after_loop_bytes']}, "
        f"after dropping the layers {lt['after_drop_bytes']} ({lt['after_drop_buffers']} buffers); forwards off the "
        f"steady state: {lt['drift_forwards']}; peak {mib(lt['peak_bytes'])}; RSS {mib(lt['rss_warm'])} after "
        f"1000 forwards -> {mib(lt['rss_end'])} at the end ({100 * lt['rss_growth']:+.2f} %); worst relative "
        f"error {lt['worst_rel_err']:.1e} |",
        f"| threads | {th['threads']} threads x {th['forwards'] // th['threads']} forwards on one layer | "
        f"{th['mismatches']} results differing from the serial run, {len(th['errors'])} errors, "
        f"{th['hung_threads']} hung; {th['seconds']:.2f} s |",
        f"| loads while forwarding | {ld['forwards']} forwards, {ld['loads']} load_model / load_param / "
        f"destroy_pipeline | {ld['weights1']} + {ld['weights2']} results exactly one weight set's, "
        f"{ld['other']} other, {len(ld['errors'])} errors |",
        f"| GIL | a {gil['forward_seconds']:.2f} s forward | a Python thread advanced {gil['stamps_in_middle']} times "
        f"in its middle half |",
    ]
    for key in ("largest", "largest_vkmat"):
        if key in r:
            g = r[key]
            lines.append(
                f"| {'VkMat' if g['vkmat'] else 'numpy'} tensor of {g['gib']:.3g} GiB | {g['rows']} x {g['width']} "
                f"float32, {g['pieces']} pieces | {g['forward_seconds']:.1f} s; {g['sampled_rows']} rows "
                f"(every piece edge) relative error {g['sampled_rel_err']:.1e}; all finite: {g['all_finite']} |")
    if "huge" in r:
        h = r["huge"]
        lines.append(f"| VkMat past the heap | 2.5 GiB float16 upload | refused: {h['refused']}, "
                     f"{h.get('live_buffers', '-')} buffers allocated; \"{h.get('message', '')}\" |")
    lines.append(bitflip_row(r["bitflips"], r, ".param bit flips, exhaustive"))
    tr = r["tests_reliability"]
    lines.append(f"| tests/test_reliability.py | pieces, limits, faults, the above | {tr['summary']} "
                 f"({tr['seconds']:.0f} s) |")
    fz = r["fuzz"]
    names = {
        "test_fuzz_layer_inputs_give_the_reference_result_or_a_clear_error": "layer inputs",
        "test_fuzz_param_dicts_load_or_refuse_cleanly": "param dicts",
        "test_fuzz_param_reader_returns_a_model_or_a_usage_error": "garbled .param, parsed",
        "test_fuzz_vknorm_check_on_garbled_models": "`vknorm check` on garbled models",
    }
    for test, label in names.items():
        t = fz["tests"].get(test)
        if not t:
            continue
        ev = "; ".join(f"{k}: {v:g} %" for k, v in sorted(t["events"].items(), key=lambda kv: -kv[1]))
        lines.append(f"| fuzz: {label} | {t['passing'] + t['failing']} cases (x{r['fuzz_scale']} the CI budget) | "
                     f"{t['failing']} failing; {ev or '-'} |")
    lines += ["", f"Fuzz run: {fz['summary']} in {fz['seconds']:.0f} s."]
    for f in fz.get("falsifying", []):
        lines += ["", "```", re.sub(r"^E\s?", "", f, flags=re.M).strip(), "```"]
    if "graph" in r:
        lines += ["", graph_markdown(r)]
    return "\n".join(lines)


def _storage(fp16: bool) -> str:
    return "fp16" if fp16 else "fp32"


def _validation(g: dict) -> str:
    if not g.get("validation", True):
        return "without the validation layer" + ("" if g["returncode"] == 0 else f"; EXIT {g['returncode']}")
    return f"validation messages {g['validation_lines']}" + ("" if g["returncode"] == 0 else f"; EXIT {g['returncode']}")


def bitflip_row(bf: dict, r: dict, label: str) -> str:
    models = bf.get("models", r["models"])  # the models of that run (--only-graph keeps an older own-runtime run)
    return (f"| {label} | {bf['flips']} single-bit flips of the {len(models)} committed .param; "
            f"{bf['accepted_by_reader']} accepted by the reader, 1 in {bf['stride']} run: {bf['run']} | "
            f"ok {bf.get('ok', 0)}, clear error {bf.get('error', 0)}, exit 1 {bf.get('mismatch', 0)} "
            f"({bf.get('mismatch_layers', 0)} layers: vknorm equal to ncnn's algorithm on its own input "
            f"{bf.get('mismatch_self_consistent', 0)}, values past float32's range {bf.get('mismatch_overflow', 0)}, "
            + ("" if bf.get("vulkan") else
               f"stock ncnn not deterministic {bf.get('mismatch_ncnn_nondeterministic', 0)}, ")
            + f"unexplained {bf.get('mismatch_unexplained', 0)}); crash {bf.get('crash', 0)}, hang {bf.get('hang', 0)}, "
            f"garbled output {bf.get('garbled', 0)}, validation messages {bf.get('validation', 0)}; slowest case "
            f"{bf['max_case_ms'] / 1e3:.1f} s; {bf['seconds'] / 60:.0f} min |")


def graph_markdown(r: dict) -> str:
    """The in-graph figures: vknorm's layers inside ncnn's Vulkan graph (vknorm.graph)."""
    g = r["graph"]
    when = f"run on {r['graph_date']}" if r.get("graph_date", r["date"]) != r["date"] else "same run"
    lines = [f"In-graph path (vknorm.graph: ncnn {r.get('ncnn', '')} compiled from its source, vknorm's layers "
             f"recorded into ncnn's command buffer), same machine, {when}. ncnn's device memory: every VkDeviceMemory "
             "ncnn holds (vknorm.graph.track_device_memory); validation: the Khronos layer loaded into ncnn's "
             "instance, its log read after the process ended (ncnn's instance destroyed first).", "",
             "| what | run | result |", "|---|---|---|"]
    for lt in g["lifetime"]:
        who = "" if lt.get("vknorm", True) else "stock ncnn (for comparison), "
        lines.append(
            f"| lifetime, {who}{_storage(lt['fp16'])} | {lt['inferences']} inferences of {lt['model']} (a new extractor each, "
            f"lightmode on, 4 inputs in turn), {lt['ms_per_inference']:.2f} ms each | ncnn's device memory from "
            f"inference {lt['warmup']} on: {mib(lt['steady_bytes'])} in {lt['steady_blocks']} blocks, inferences off it "
            f"{lt['drift_inferences']}, peak {mib(lt['peak_after_warmup'])}; after the net is cleared "
            f"{mib(lt['after_clear_bytes'])} (ncnn's pooled allocators); RSS {mib(lt['rss_warm'])} -> "
            f"{mib(lt['rss_end'])} ({100 * lt['rss_growth']:+.2f} %); outputs differing from the first for their "
            f"input {lt['mismatches']}, errors {lt['errors']}; "
            + (f"vknorm forwards {lt['vulkan_forwards']} on the GPU, {lt['cpu_forwards']} on the host; "
               if lt.get("vknorm", True) else "")
            + f"{_validation(lt)} |")
    for rc in g["reload"]:
        lines.append(
            f"| Net load / clear cycles, {_storage(rc['fp16'])} | {rc['cycles']} x (load {rc['model']}, one inference, "
            f"clear), {rc['seconds'] / rc['cycles'] * 1e3:.0f} ms each | ncnn's device memory after each cycle from "
            f"cycle {rc['warmup']}: {mib(rc['bytes_after_warmup'])}, cycles off it {rc['cycles_off_steady']}; RSS "
            f"{mib(rc['rss_after_warmup'])} -> {mib(rc['rss_end'])} ({100 * rc['rss_growth']:+.2f} %); outputs "
            f"differing from the first cycle's {rc['mismatches']}, errors {rc['errors']}; after ncnn's instance is "
            f"destroyed {rc['bytes_after_instance_destroyed']} bytes in {rc['blocks_after_instance_destroyed']} blocks "
            f"left; {_validation(rc)}{' (teardown included)' if rc.get('validation', True) else ''} |")
    for th in g["threads"]:
        lines.append(
            f"| threads, {th['model']} {_storage(th['fp16'])} | {th['threads']} threads x "
            f"{th['inferences'] // th['threads']} inferences ({th['shapes']} input shapes) on "
            f"{'one Net' if th['nets'] == 'one' else str(th['threads']) + ' Nets'}, fresh | outputs differing from the "
            f"sequential run {th['mismatches']}, failed {th['failed']}, errors {len(th['errors'])}, hung "
            f"{th['hung_threads']}; pipelines as the sequential run's: {th['pipelines_like_serial']} "
            f"({th['pipelines']}); {th['seconds']:.2f} s; {_validation(th)} |")
    for f in g["faults"]:
        lines.append(
            f"| device memory running out, {f['model']} {_storage(f['fp16'])} | limit = held after one inference + "
            f"k x {f['step_mib']} MiB; input {'x'.join(map(str, f['big']))}, then one at the model's size | "
            f"{f['limits']} limits: the large input failed {f['big_failed']} times with ncnn's "
            f"{', '.join(map(str, f['error_codes'])) or '-'} ({f['refused_allocations']} allocations refused), no "
            f"crash; normal inferences identical to before {f['normal_ok']} of {f['limits']}; the large input then "
            f"fitted: {f['big_fitted']}, and gave the same output without a limit: {f['after_limit_lifted_ok']}; "
            f"{_validation(f)} |")
    if "bitflips_vulkan" in r:
        lines.append(bitflip_row(r["bitflips_vulkan"], r, ".param bit flips through `check --vulkan`"))
    fz = r["fuzz"]["tests"].get("test_fuzz_vknorm_check_vulkan_on_garbled_models")
    if fz:
        ev = "; ".join(f"{k}: {v:g} %" for k, v in sorted(fz["events"].items(), key=lambda kv: -kv[1]))
        lines.append(f"| fuzz: `vknorm check --vulkan` on garbled models | {fz['passing'] + fz['failing']} cases "
                     f"(x{r['fuzz_scale']} the CI budget) | {fz['failing']} failing; {ev or '-'} |")
    tg = r.get("tests_graph")
    if tg:
        lines.append(f"| tests/test_reliability_graph.py | the CI sizes of the above | {tg['summary']} ({tg['seconds']:.0f} s) |")
    return "\n".join(lines)


def graph_scenarios(G) -> dict:
    """Every in-graph scenario at full size, each in a process of its own under the validation layer."""
    def run(name, kwargs, validation=True):
        t0 = time.perf_counter()
        STEPS.start(f"graph {name} {kwargs}")
        out = G.run_scenario(name, kwargs, timeout=3600, validation=validation)
        STEPS.done(f"  graph {name} {kwargs}: {time.perf_counter() - t0:.1f} s")
        if out.get("failed"):
            raise SystemExit(f"graph {name} {kwargs} failed (exit {out['returncode']}):\n{out['stderr_tail']}")
        return out

    # The RSS figures also without the validation layer: under it, the layer's own bookkeeping grows with
    # every submission and every Net, stock ncnn's (run for comparison) as much as vknorm's.
    g = {"lifetime": [run("lifetime", {"n": 10_000, "fp16": fp16, "warmup": 500}) for fp16 in (False, True)]
                     + [run("lifetime", {"n": 10_000, "fp16": fp16, "warmup": 500}, validation=False)
                        for fp16 in (False, True)]
                     + [run("lifetime", {"n": 10_000, "fp16": False, "warmup": 500, "vknorm": False})],
         # RSS of the process alone too: the validation layer's own bookkeeping grows with every Net here
         "reload": [run("reload_cycles", {"cycles": 100, "fp16": fp16, "warmup": 20}) for fp16 in (False, True)]
                   + [run("reload_cycles", {"cycles": 100, "fp16": False, "warmup": 20}, validation=False)],
         "threads": [run("threads", {"model": m, "fp16": fp16, "nets": nets, "per_thread": 12})
                     for m in ("transformer_block", "sd_resblock", "llama_block") for fp16 in (False, True)
                     for nets in ("one", "many")],
         "faults": [run("faults", {"model": m, "fp16": fp16, "big": big, "step_mib": step})
                    for m, fp16, big, step in (("transformer_block", False, [1024, 64], 1),
                                               ("transformer_block", True, [2048, 64], 1),
                                               ("sd_resblock", True, [64, 128, 128], 1),
                                               ("split_layernorm", False, [256, 40000], 4))]}
    return g


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fuzz-scale", type=positive_int, default=10, help="the fuzz budget, N times the CI's")
    ap.add_argument("--quick", action="store_true", help="skip the multi-GiB runs")
    ap.add_argument("--bitflip-stride", type=positive_int, default=5, help="run one in N accepted .param bit flips")
    ap.add_argument("--write", action="store_true", help="update docs/reliability.md and docs/reliability.json")
    graph = ap.add_mutually_exclusive_group()  # both would leave the in-graph figures out of what --write writes
    graph.add_argument("--no-graph", action="store_true", help="skip the in-graph scenarios (vknorm.graph)")
    graph.add_argument("--only-graph", action="store_true",
                    help="re-run the in-graph scenarios, the bit flips through check --vulkan and the fuzz file; "
                         "the own-runtime figures are kept from docs/reliability.json (and its date)")
    args = ap.parse_args(argv)
    r = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "python": platform.python_version(),
         "fuzz_scale": args.fuzz_scale, "device": device()}
    global STEPS
    STEPS = Steps(planned_steps(args))
    sys.path.insert(0, str(REPO / "tests"))  # the scenarios are test support; the tests import them too
    import reliability_lib

    if args.only_graph:
        kept = json.loads(RAW.read_text())
        r.update({k: v for k, v in kept.items() if k not in ("graph", "bitflips_vulkan", "tests_graph", "fuzz", "fuzz_scale")})
    else:
        own_runtime(r, args)
    if not args.no_graph:
        import reliability_graph as G

        r["ncnn"] = "1.0.20261020"
        r["graph_date"] = time.strftime("%Y-%m-%d")
        r["graph"] = graph_scenarios(G)
        r["bitflips_vulkan"] = {**scenario("param_bitflips", {"stride": args.bitflip_stride, "vulkan": True}, timeout=4 * 3600),
                                "models": sorted(reliability_lib.MODELS)}
        r["tests_graph"] = pytest_stats("tests/test_reliability_graph.py", 1)
    r["fuzz"] = pytest_stats("tests/test_reliability_fuzz.py", args.fuzz_scale)
    STEPS.close()
    text = markdown(r)
    print(text)
    if args.write:
        doc = DOC.read_text()
        begin, end = "<!-- figures:begin -->", "<!-- figures:end -->"
        i, j = doc.index(begin) + len(begin), doc.index(end)
        DOC.write_text(doc[:i] + "\n" + text + "\n" + doc[j:])
        RAW.write_text(json.dumps(r, indent=1, default=str) + "\n")
    return 0


def own_runtime(r: dict, args) -> None:
    """vknorm's own runtime and `vknorm check` (pyncnn): every scenario of tests/reliability_lib.py."""
    import reliability_lib

    r["models"] = sorted(reliability_lib.MODELS)
    r["lifecycle"] = scenario("lifecycle")
    n = 3000
    r["overhead_plain"] = {**scenario("overhead", {"n": n}, validation=False), "_n": n}
    r["overhead_validation"] = {**scenario("overhead", {"n": n}), "_n": n}
    r["lifetime"] = scenario("lifetime", {"n": 10_000})
    r["threads"] = scenario("threads_vs_serial", {"n_threads": 8, "per_thread": 50})
    r["loads"] = scenario("loads_while_forwarding")
    r["gil"] = scenario("gil_released")
    if not args.quick:
        r["largest"] = scenario("largest", {"gib": 1.0})
        r["largest_vkmat"] = scenario("largest", {"gib": 1.0, "vkmat": True})
        r["huge"] = scenario("huge_vkmat_refused", {"gib": 2.5})
    r["bitflips"] = scenario("param_bitflips", {"stride": args.bitflip_stride}, timeout=7200)
    r["tests_reliability"] = pytest_stats("tests/test_reliability.py", 1)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A LLaMA-style decoder layer run token by token in ncnn's kv-cache form (tests/kv_decoder.py: RMSNorm ->
attention reading and growing the key/value caches -> + -> RMSNorm -> SiLU-gated MLP -> +), stock ncnn Vulkan beside
vknorm inside ncnn's graph, unfused and fused, in one process: wall ms per decoded token, and for the prompt.

    python tools/decode_speed.py [--attention sdpa|mha] [--dims E,H,D,G,F] [--prompt 128] [--tokens 32]
                                 [--rounds 7] [--fp16] [--json OUT.json]

--dims: hidden, query heads, head dim, key/value heads (SDPA; MultiHeadAttention's keys and values have every
head, whatever G says), MLP width; the default is one layer of a 1.5B-class model (2048 hidden, 16 heads of 128, 4
key/value heads, 5632 MLP: 180 MB of float32 weights). MultiHeadAttention needs heads x head dim = hidden.

A decode is what a decoder runs: the prompt as one step (its past caches empty Mats), then --tokens steps of one
token each, every step's caches given back to the next; each step a new extractor, its inputs from numpy and out0
back to numpy (the caches stay Mats). Each round decodes once with every implementation, in a new random order,
after a warm-up of at least 0.5 s each; reported: the median over rounds of each decode's median token time, and of
its prompt step (the JSON keeps each round's token time too). Every decode's outputs are checked against float64 of
the whole sequence (kv_decoder.reference): stock ncnn within 1e-3 (float32 storage) or 5e-2 (float16) at the outputs'
scale, a bound far above its storage's rounding that only a decode of something else breaks; vknorm by `vknorm check
--vulkan`'s rule, within twice stock's own error plus 1e-4 or 1e-3 at that scale. A decode outside its bound, or not
finite, ends the run with exit 1.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))  # the decoder's writer
import kv_decoder as kd  # noqa: E402

IMPLS = ("ncnn-vulkan", "vknorm-in-graph", "vknorm-fused")
ATOL = {False: 1e-4, True: 1e-3}  # check --vulkan's, by storage (fp16 or not)
# What stock ncnn's own decode must keep against float64, at the outputs' scale: far above its storage's rounding
# (float32 ~1e-5, float16 ~5e-3 measured), far below what a decode that is not this layer gives (errors of ~1)
STOCK_BOUND = {False: 1e-3, True: 5e-2}
DEFAULT_DIMS = kd.Dims(2048, 16, 128, 4, 5632)


class Decoder:
    """One implementation's net, and a decode of a token sequence on it."""

    def __init__(self, impl: str, param: str, binp: str, fp16: bool):
        from vknorm import graph

        self.graph = graph
        self.net = graph.configure(graph.Net(vknorm=impl != "ncnn-vulkan", fuse=impl == "vknorm-fused"),
                                   vulkan=True, fp16=fp16)
        if self.net.load_param(param) != 0 or self.net.load_model(binp) != 0:
            raise RuntimeError(f"{impl}: ncnn could not load {param} / {binp}")
        self.impl = impl

    def step(self, x: np.ndarray, past: int, caches: tuple) -> tuple:
        g = self.graph
        ex = self.net.create_extractor()
        for name, m in (("in0", g.Mat(x)), ("mask", g.Mat(kd.causal_mask(past, len(x)))), ("past_k", caches[0]),
                        ("past_v", caches[1])):
            if ex.input(name, m) != 0:
                raise RuntimeError(f"{self.impl}: input {name} refused")
        got = [ex.extract(name) for name in ("out0", "k_cache", "v_cache")]
        if any(r != 0 for r, _ in got):
            raise RuntimeError(f"{self.impl}: extract failed ({[r for r, _ in got]})")
        return np.array(got[0][1]), (got[1][1], got[2][1])

    def decode(self, tokens: np.ndarray, prompt: int) -> tuple:
        """(prompt step ms, [ms of each later token], out0 of every token)."""
        t0 = time.perf_counter()
        out, caches = self.step(tokens[:prompt], 0, (self.graph.Mat(), self.graph.Mat()))
        prompt_ms = (time.perf_counter() - t0) * 1e3
        outs, token_ms = [out], []
        for i in range(prompt, len(tokens)):
            t0 = time.perf_counter()
            out, caches = self.step(tokens[i:i + 1], i, caches)
            token_ms.append((time.perf_counter() - t0) * 1e3)
            outs.append(out)
        return prompt_ms, token_ms, np.concatenate(outs)


def judge(outs: dict, want: np.ndarray, fp16: bool) -> dict:
    """Each implementation's max |out0 - float64| and whether it keeps its rule: stock ncnn within STOCK_BOUND of
    float64, vknorm within check --vulkan's rule (twice stock's error plus ATOL), both at the outputs' scale."""
    scale = max(1.0, float(np.abs(want).max()))
    err = {impl: float(np.abs(o - want).max()) if np.isfinite(o).all() else float("inf") for impl, o in outs.items()}
    bound = {impl: STOCK_BOUND[fp16] * scale if impl == "ncnn-vulkan" else 2 * err["ncnn-vulkan"] + ATOL[fp16] * scale
             for impl in err}
    return {impl: {"max_err": e, "ok": bool(e <= bound[impl])} for impl, e in err.items()}


def measure(attention: str, dims: kd.Dims, prompt: int, tokens: int, rounds: int, fp16: bool, workdir: str,
            seed: int = 0) -> dict:
    w = kd.weights(attention, seed, dims)
    param, binp = kd.write(workdir, attention, w, dims)
    x = np.random.default_rng(seed + 1).standard_normal((prompt + tokens, dims.E)).astype(np.float32)
    want = kd.reference(attention, w, x, dims)
    from vknorm.bench import _Progress

    progress = _Progress(len(IMPLS) * (1 + rounds))  # on stderr where a person watches (a terminal)
    decoders = {impl: Decoder(impl, param, binp, fp16) for impl in IMPLS}
    for impl, d in decoders.items():  # pipelines, allocators, clocks
        progress.start(f"warm-up {impl}")
        end = time.perf_counter() + 0.5
        d.decode(x, prompt)
        while time.perf_counter() < end:
            d.decode(x, prompt)
        progress.done()
    rng = random.Random(seed)
    prompt_ms = {impl: [] for impl in IMPLS}
    token_ms = {impl: [] for impl in IMPLS}
    worst = {impl: {"max_err": 0.0, "ok": True} for impl in IMPLS}
    for r in range(rounds):
        outs = {}
        for impl in rng.sample(IMPLS, len(IMPLS)):
            progress.start(f"round {r + 1}/{rounds} {impl}")
            p, t, outs[impl] = decoders[impl].decode(x, prompt)
            prompt_ms[impl].append(p)
            token_ms[impl].append(statistics.median(t))
            progress.done()
        for impl, j in judge(outs, want, fp16).items():
            worst[impl] = {"max_err": max(worst[impl]["max_err"], j["max_err"]), "ok": worst[impl]["ok"] and j["ok"]}
    progress.close()
    med = lambda v: round(statistics.median(v), 4)
    return {"attention": attention, "dims": dims._asdict(), "prompt": prompt, "tokens": tokens, "rounds": rounds,
            "fp16": fp16, "token_ms": {i: med(v) for i, v in token_ms.items()},
            "prompt_ms": {i: med(v) for i, v in prompt_ms.items()}, "outputs": worst,
            "token_ms_rounds": {i: [round(t, 4) for t in v] for i, v in token_ms.items()}}


def dims_arg(text: str) -> kd.Dims:
    try:
        values = [int(v) for v in text.split(",")]
        dims = kd.Dims(*values)
    except (ValueError, TypeError):
        raise argparse.ArgumentTypeError(f"--dims wants five integers E,H,D,G,F, got {text!r}") from None
    if min(dims) < 1:
        raise argparse.ArgumentTypeError(f"--dims {text}: every size >= 1")
    return dims


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attention", choices=kd.ATTENTIONS, default="sdpa")
    ap.add_argument("--dims", type=dims_arg, default=DEFAULT_DIMS, help="E,H,D,G,F (default %(default)s)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens, one step")
    ap.add_argument("--tokens", type=int, default=32, help="tokens decoded one by one after the prompt")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--fp16", action="store_true", help="float16 storage")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    if args.attention == "mha":
        if args.dims.H * args.dims.D != args.dims.E:
            ap.error("--attention mha needs H x D = E")
        args.dims = args.dims._replace(G=args.dims.H)  # MultiHeadAttention's keys and values have every head
    if args.attention == "sdpa" and args.dims.H % args.dims.G:
        ap.error(f"--dims: H ({args.dims.H}) must be a multiple of G ({args.dims.G})")
    if min(args.prompt, args.tokens, args.rounds) < 1:
        ap.error("--prompt, --tokens and --rounds must be >= 1")
    folder = os.path.dirname(os.path.abspath(args.json or "."))
    if args.json and (os.path.isdir(args.json) or not os.access(folder, os.W_OK)):
        ap.error(f"--json {args.json}: cannot write a file there")
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(args.attention, args.dims, args.prompt, args.tokens, args.rounds, args.fp16, tmp)
    from vknorm import graph

    result["device"] = graph.gpu_name()
    stock = result["token_ms"]["ncnn-vulkan"]
    print(f"{args.attention} decoder layer {','.join(map(str, args.dims))}, prompt {args.prompt}, "
          f"{args.tokens} tokens, {'fp16' if args.fp16 else 'fp32'} storage, {result['device']}")
    print(f"{'impl':<16} {'ms/token':>9} {'vs stock':>9} {'prompt ms':>10} {'max |err|':>10}  outputs")
    for impl in IMPLS:
        t = result["token_ms"][impl]
        o = result["outputs"][impl]
        print(f"{impl:<16} {t:>9.3f} {stock / t:>8.2f}x {result['prompt_ms'][impl]:>10.3f} {o['max_err']:>10.2e}  "
              f"{'ok' if o['ok'] else 'OUTSIDE THE RULE'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if all(o["ok"] for o in result["outputs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

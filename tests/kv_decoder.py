"""Test support: a LLaMA-style decoder layer in ncnn's kv-cache form, written as ncnn's .param text and .bin
weights, and its float64 reference.

ncnn runs a decoder token by token through an attention layer with ``7=1`` (kv_cache): an SDPA (the form ncnn's
LLM models use: projections as Gemm, grouped key/value heads) or a MultiHeadAttention (projections inside). Its
last two bottoms are the past key and value caches (empty Mats on the first step), its second and third tops the
caches grown by this step's tokens, fed back as the next step's past. The attention mask is an input: causal
over the new tokens, open to every past one.

    in0 (E x L) -> Split -> RMSNorm -> attention(mask, past_k, past_v) -> + in0 -> Split -> RMSNorm
        -> Gemm gate -> Swish, Gemm up -> * -> Gemm down -> + -> out0          (caches: k_cache, v_cache)

pnnx does not emit this form (it traces one forward, with no caches), so the text is written here.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np


class Dims(NamedTuple):
    E: int  # hidden
    H: int  # query heads
    D: int  # head dim
    G: int  # key/value heads (SDPA; MultiHeadAttention has H)
    F: int  # MLP width


SMALL = Dims(64, 4, 16, 2, 128)  # the tests' layer
E, H, D, G, F = SMALL
EPS = 1e-6
ATTENTIONS = ("sdpa", "mha")
MASKED = -1e4  # what the mask adds where a token may not look: exp() of it is 0 in float32 and float16


def weights(attention: str, seed: int = 0, dims: Dims = SMALL) -> dict:
    """The layer's weights, float32, each projection as (out, in)."""
    E, H, D, G, F = dims
    rng = np.random.default_rng(seed)
    w = lambda n, k: (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    kv_heads = G if attention == "sdpa" else H
    out = {"rms_attn": (1 + 0.1 * rng.standard_normal(E)).astype(np.float32),
           "q": w(H * D, E), "k": w(kv_heads * D, E), "v": w(kv_heads * D, E), "o": w(E, H * D),
           "rms_mlp": (1 + 0.1 * rng.standard_normal(E)).astype(np.float32),
           "gate": w(F, E), "up": w(F, E), "down": w(E, F)}
    if attention == "mha":
        out.update({k + "_bias": (0.1 * rng.standard_normal(n)).astype(np.float32)
                    for k, n in (("q", H * D), ("k", H * D), ("v", H * D), ("o", E))})
    return out


def _gemm(name: str, bottom: str, top: str, n: int, k: int) -> str:
    # x (k wide) times a constant (n x k) transposed, no bias: as pnnx writes nn.Linear(bias=False), any row count
    return f"Gemm {name} 1 1 {bottom} {top} 2=0 3=1 4=0 5=1 6=1 8={n} 9={k} 10=-1"


def _attention_layers(attention: str, dims: Dims) -> list:
    E, H, D, G, _ = dims
    if attention == "mha":
        return ["MultiHeadAttention attn 4 3 h0 mask past_k past_v a2 k_cache v_cache "
                f"0={E} 1={H} 2={E * H * D} 5=1 7=1"]
    heads = lambda x, n: [f"Reshape {x}_rs 1 1 {x}0 {x}1 0={D} 1={n} 2=-1", f"Permute {x}_pm 1 1 {x}1 {x}2 0=2"]
    return (["Split sp1 1 3 h0 h1 h2 h3", _gemm("q_proj", "h1", "q0", H * D, E), *heads("q", H),
             _gemm("k_proj", "h2", "k0", G * D, E), *heads("k", G), _gemm("v_proj", "h3", "v0", G * D, E),
             *heads("v", G),
             "SDPA attn 6 3 q2 k2 v2 mask past_k past_v a0 k_cache v_cache 5=1 6=0 7=1",
             "Permute a_pm 1 1 a0 a1 0=2", f"Reshape a_rs 1 1 a1 a2x 0={H * D} 1=-1",
             _gemm("o_proj", "a2x", "a2", E, H * D)])


def layers(attention: str, dims: Dims = SMALL) -> list:
    E, _, _, _, F = dims
    return ["Input in0 0 1 in0", "Input mask 0 1 mask", "Input past_k 0 1 past_k", "Input past_v 0 1 past_v",
            "Split sp0 1 2 in0 x0 x1", f"RMSNorm rms_attn 1 1 x1 h0 0={E} 1={EPS:e} 2=1",
            *_attention_layers(attention, dims),
            "BinaryOp add0 2 1 x0 a2 r0 0=0", "Split sp2 1 2 r0 r1 r2",
            f"RMSNorm rms_mlp 1 1 r2 m0 0={E} 1={EPS:e} 2=1", "Split sp3 1 2 m0 m1 m2",
            _gemm("gate_proj", "m1", "g0", F, E), "Swish silu 1 1 g0 g1", _gemm("up_proj", "m2", "u0", F, E),
            "BinaryOp mul0 2 1 g1 u0 gu 0=2", _gemm("down_proj", "gu", "d0", E, F),
            "BinaryOp add1 2 1 r1 d0 out0 0=0"]


def write(directory, attention: str, w: dict, dims: Dims = SMALL) -> tuple:
    """decoder_<attention>.param / .bin in directory (w: weights(attention, dims=dims)); returns their paths."""
    lines = layers(attention, dims)
    blobs = set()
    for line in lines:
        words = line.split()
        blobs.update(words[4:4 + int(words[2]) + int(words[3])])
    prefix = os.path.join(str(directory), f"decoder_{attention}")
    with open(prefix + ".param", "w") as f:
        f.write(f"7767517\n{len(lines)} {len(blobs)}\n" + "\n".join(lines) + "\n")
    tagged = lambda a: np.zeros(1, np.uint32).tobytes() + a.tobytes()  # ncnn's float32 tag before a weight
    with open(prefix + ".bin", "wb") as f:
        f.write(w["rms_attn"].tobytes())
        if attention == "mha":
            for k in "qkvo":
                f.write(tagged(w[k]) + w[k + "_bias"].tobytes())
        else:
            f.write(b"".join(tagged(w[k]) for k in "qkvo"))
        f.write(w["rms_mlp"].tobytes() + b"".join(tagged(w[k]) for k in ("gate", "up", "down")))
    return prefix + ".param", prefix + ".bin"


def causal_mask(past: int, new: int) -> np.ndarray:
    """(new, past + new): token i of this step sees every past token and the new ones up to itself."""
    m = np.zeros((new, past + new), np.float32)
    for i in range(new):
        m[i, past + i + 1:] = MASKED
    return m


def _rms(t, g):
    return t / np.sqrt((t * t).mean(-1, keepdims=True) + EPS) * g


def _heads(attention: str, w: dict, x, dims: Dims) -> tuple:
    """float64 weights, and the queries, keys and values of the tokens x (L, E) by head: (heads, L, D)."""
    _, H, D, G, _ = dims
    w = {k: v.astype(np.float64) for k, v in w.items()}
    n = len(x)
    h = _rms(np.asarray(x, np.float64), w["rms_attn"])
    kv_heads = G if attention == "sdpa" else H
    project = lambda k, heads: (h @ w[k].T + w.get(k + "_bias", 0.0)).reshape(n, heads, D).transpose(1, 0, 2)
    return w, project("q", H), project("k", kv_heads), project("v", kv_heads)


def reference(attention: str, w: dict, x, dims: Dims = SMALL) -> np.ndarray:
    """float64 out0 for the whole sequence x (L, E) at once: every row as a token-by-token run gives it."""
    _, H, D, _, _ = dims
    w, q, k, v = _heads(attention, w, x, dims)
    x = np.asarray(x, np.float64)
    n, kv_heads = len(x), k.shape[0]
    a = np.empty((H, n, D))
    for i in range(H):
        j = i * kv_heads // H
        s = q[i] @ k[j].T / np.sqrt(D) + causal_mask(0, n)
        s = np.exp(s - s.max(-1, keepdims=True))
        a[i] = (s / s.sum(-1, keepdims=True)) @ v[j]
    r = x + a.transpose(1, 0, 2).reshape(n, H * D) @ w["o"].T + w.get("o_bias", 0.0)
    m = _rms(r, w["rms_mlp"])
    g = m @ w["gate"].T
    return r + (g / (1 + np.exp(-g)) * (m @ w["up"].T)) @ w["down"].T


def key_cache_reference(w: dict, x, dims: Dims = SMALL) -> np.ndarray:
    """float64 of the SDPA form's key cache after the tokens x (L, E): (G, L, D), as ncnn's Vulkan layer keeps it."""
    return _heads("sdpa", w, x, dims)[2]

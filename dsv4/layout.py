"""The official tensor layout: every tensor's name, shape, storage and how ranks split it.

Every tensor the model reads is named as in the official DeepSeek-V4 checkpoint
(`layers.N.attn.wq_a.weight`, `layers.N.ffn.experts.E.w1.weight`, `hc_head_fn`, ...).
`tensor_specs(cfg, rank, world)` is the single description of that layout: the
checkpoint writer, the loader and the random initialiser all build from it, and
each builds only the slice of a rank (heads, groups, experts, intermediate rows,
vocab rows) so a rank never materialises what it does not own. `as_memory` is the
one in-memory form the loader and the initialiser hand to the model.

Beside dsv4.formats on the bottom floor: it imports only the config and the formats.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .config import CSA, HASH_MOE, ModelConfig

# fuse_qkv (on by default since its GPU run in session 8; DSV4_FUSE_QKV=0, read at import, turns it off): the load
# stacks wq_a and wkv, which read the same x, into one weight (formats.stack_rows) so a token's two projections are
# one GEMV launch (one a layer fewer). The stacked GEMV's split-K follows its row count, so q_res's and kv's bits
# differ from the unstacked pair's (within the kernel's tolerance against the reference; eager and graph, solo and
# batched, one rank and many all run the same stacked launch).
# fuse_xproj (on by default since its GPU run in session 9, call 4: flash decode 115.8 -> 122.3 tok/s, 1,198 -> 1,094
# nodes; DSV4_FUSE_XPROJ=0, read at import, turns it off): the load stacks the
# bf16 linears of a compressed layer that read the attention's normed input x (the compressor's wkv and wgate; on CSA
# layers also the indexer's compressor's wkv and wgate and its weights_proj) into one weight, so a token's 5 (CSA) or
# 2 (HCA) dense GEMVs are one launch; the consumers read the output's column views in place (strided rows). The bits
# differ from the separate linears' as fuse_qkv's do (the dense GEMV's split-K follows the stacked row count).
# prefill_gemv (DSV4_PREFILL_GEMV, read at import; "v3" by default since session 21, call 1: the gate passed with it
# on, and the server on mini, decode on v2, took its time to first token at concurrency 1 from 38.5 to 25.0 ms and at
# 16 from 343 to 135 ms (p50); "" is the process's GEMVs): the GEMV family of a short prefill chunk's rows
# (dsv4.model.rows.step_gemv, which checks the name).
CONFIG = {"fuse_qkv": os.environ.get("DSV4_FUSE_QKV", "1") == "1",
          "fuse_xproj": os.environ.get("DSV4_FUSE_XPROJ", "1") == "1",
          "prefill_gemv": os.environ.get("DSV4_PREFILL_GEMV", "v3"),
          # q's latent norm and kv's norm + rope in one launch (kernels.normrope.q_kv_norms): the same bits, a launch
          # fewer a layer; on by default since session 33 (call 1: mini's pipelined decode +0.45 %), 0 turns it off
          "pair_norms": os.environ.get("DSV4_PAIR_NORMS", "1") == "1",
          # a compressed layer's stacked linear of x (fuse_xproj) launched first, right after the mHC boundary, instead
          # of after q's and kv's norms (model.attention._x_proj_first): the same values, another launch order. On by
          # default since session 34 (call 1: alone 876.19 against the defaults' 876.98 pipelined tok/s, with the
          # compressor's paired one-pass pools 886.21 against 883.32 for the pair alone); DSV4_XPROJ_FIRST=0 turns
          # it off
          "xproj_first": os.environ.get("DSV4_XPROJ_FIRST", "1") == "1",
          # a compressed layer's compressor and indexer on the device's second stream (dsv4.kernels.lanes), beside the
          # queries' projection, norm and RoPE, the two chains joined before the attention kernel, in a captured graph:
          # the same kernels on the same inputs, so the same bits. On by default since session 39 (call 3: mini's
          # pipelined decode +0.87 %, ahead in every round; call 4, on by default: +1.1 % against DSV4_LANE=0; the
          # gate's stream); DSV4_LANE=0 turns it off
          "lane": os.environ.get("DSV4_LANE", "1") == "1",
          # with the lane, the stacked linear of x (xproj_first) on it too, forked right after the mHC boundary, so
          # that the main chain (the rope table, wq_a + wkv, their norms) does not wait for it; the lane waits for q's
          # latent before the indexer as before. On by default since session 40 (call 1: mini's pipelined decode
          # 930.8 -> 949.9 tok/s, +2.05 %, ahead in every round; the gate's stream); DSV4_LANE_XPROJ=0 turns it off
          "lane_xproj": os.environ.get("DSV4_LANE_XPROJ", "1") == "1",
          # a profile's graphs (dsv4.replay.TimedReplay, `dsv4 bench --profile`) captured on one stream
          # (lanes.one_stream), each phase timed whole; with the lane as production graphs have it, the phase stamps
          # are events on the current stream, so the compressor and indexer's phase timed the fork alone. Off (one
          # stream) by default since session 41 (call 2: mini's compressor phase 12.5 us a token with the lane, 83.0
          # on one stream; test_lanes and test_profile pass); DSV4_PROFILE_LANE=1 profiles the lane's graphs
          "profile_lane": os.environ.get("DSV4_PROFILE_LANE", "0") == "1",
          # a batched step's bookkeeping without three torch launches a step (each also breaks the PDL chain:
          # the kernel after a torch op starts as without PDL): the rows' step counters add the active mask as it
          # is (no int64 copy), and a write's keep mask of B rows is the active mask itself (no clone; it is [B],
          # contiguous). The same values, so the same bits (tests/test_batch.py). On by default since session 41
          # (call 1: the pool and generation tests pass under it; mini's pipelined decode, generate's one-row batch
          # graph, 967.2 -> 971.9 tok/s, +0.48 %, ahead in every round, the same stream); DSV4_BATCH_LEAN=0 off
          "batch_lean": os.environ.get("DSV4_BATCH_LEAN", "1") == "1",
          # a verify step's attention with its rows as one chunk (dsv4.model.attention._in_chunk): each compressed
          # layer's pools and index keys once for every row, the attention's kernels once (each row's program a
          # decode step's, the keys its earlier rows wrote read from the chunk), every write applied once after it;
          # written in session 50 without a GPU (tests/test_verify_chunk.py: the bytes and tokens of the rows in
          # turn, in Triton's interpreter). Off (DSV4_VERIFY_CHUNK=1 on) until a GPU run shows the same bits there
          "verify_chunk": os.environ.get("DSV4_VERIFY_CHUNK", "0") == "1"}
from .formats import QWeight


@dataclass(frozen=True)
class Spec:
    """One checkpoint tensor: its full shape, its storage kind and how ranks split it.

    kind: "linear" (FP8-able dense linear), "expert" (FP4-able), "bf16" (dense linear kept
    bf16 in official checkpoints), "fp32" (norms, mHC, sinks, ape, biases), "int" (tid2eid).
    split: None (replicated) or (dim, parts, index) meaning this rank owns part `index` of
    `parts` equal parts along `dim`.
    """

    shape: tuple[int, ...]
    kind: str
    split: tuple[int, int, int] | None = None
    expert: int | None = None  # routed expert id, for expert-parallel ownership


def expert_range(cfg: ModelConfig, rank: int, world: int) -> range:
    n = cfg.n_routed_experts // world
    return range(rank * n, (rank + 1) * n)


def check_split(cfg: ModelConfig, world: int) -> None:
    """A TP/EP world must divide heads, output groups, experts, shared intermediate and vocab."""
    for name, v in (("num_attention_heads", cfg.num_attention_heads), ("o_groups", cfg.o_groups),
                    ("n_routed_experts", cfg.n_routed_experts),
                    ("moe_intermediate_size", cfg.moe_intermediate_size), ("vocab_size", cfg.vocab_size)):
        if v % world:
            raise ValueError(f"{name}={v} is not divisible by ranks={world}")


def tensor_specs(cfg: ModelConfig, rank: int = 0, world: int = 1, mtp: bool = False) -> dict[str, Spec]:
    """Every tensor of the official checkpoint that rank `rank` of `world` reads: the main model's, and with `mtp`
    its MTP layers' too (`mtp.J.`: a decoder layer, index num_hidden_layers + J, and what joins it to the main
    model: enorm / hnorm, e_proj / h_proj, its own hc_head and norm; the embedding and head are the main model's)."""
    D = cfg.hidden_size
    hc = cfg.hc_mult
    s: dict[str, Spec] = {
        "embed.weight": Spec((cfg.vocab_size, D), "bf16"),
        "head.weight": Spec((cfg.vocab_size, D), "bf16", (0, world, rank) if world > 1 else None),
        "norm.weight": Spec((D,), "fp32"),
        "hc_head_fn": Spec((hc, hc * D), "fp32"),
        "hc_head_base": Spec((hc,), "fp32"),
        "hc_head_scale": Spec((1,), "fp32"),
    }
    for i in range(cfg.num_hidden_layers):
        s.update(_layer_specs(cfg, f"layers.{i}.", i, rank, world))
    for j in range(cfg.num_nextn_predict_layers if mtp else 0):
        p = f"mtp.{j}."
        s.update(_layer_specs(cfg, p, cfg.num_hidden_layers + j, rank, world))
        for name in ("enorm.weight", "hnorm.weight", "norm.weight"):
            s[p + name] = Spec((D,), "fp32")
        s[p + "e_proj.weight"] = Spec((D, D), "linear")
        s[p + "h_proj.weight"] = Spec((D, D), "linear")
        s[p + "hc_head_fn"] = Spec((hc, hc * D), "fp32")
        s[p + "hc_head_base"] = Spec((hc,), "fp32")
        s[p + "hc_head_scale"] = Spec((1,), "fp32")
    return s


def _layer_specs(cfg: ModelConfig, p: str, i: int, rank: int, world: int) -> dict[str, Spec]:
    """One decoder layer's tensors under prefix p (`layers.N.` or `mtp.J.`), layer index i."""
    D, H, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    hc, g = cfg.hc_mult, cfg.o_groups
    mix = (2 + hc) * hc
    row = (0, world, rank) if world > 1 else None
    col = (1, world, rank) if world > 1 else None
    s: dict[str, Spec] = {}
    s[p + "attn_norm.weight"] = Spec((D,), "fp32")
    s[p + "ffn_norm.weight"] = Spec((D,), "fp32")
    for site in ("attn", "ffn"):
        s[p + f"hc_{site}_fn"] = Spec((mix, hc * D), "fp32")
        s[p + f"hc_{site}_base"] = Spec((mix,), "fp32")
        s[p + f"hc_{site}_scale"] = Spec((3,), "fp32")
    a = p + "attn."
    s[a + "wq_a.weight"] = Spec((cfg.q_lora_rank, D), "linear")
    s[a + "q_norm.weight"] = Spec((cfg.q_lora_rank,), "fp32")
    s[a + "wq_b.weight"] = Spec((H * hd, cfg.q_lora_rank), "linear", row)  # by head
    s[a + "wkv.weight"] = Spec((hd, D), "linear")
    s[a + "kv_norm.weight"] = Spec((hd,), "fp32")
    s[a + "wo_a.weight"] = Spec((g * cfg.o_lora_rank, H * hd // g), "linear", row)  # whole groups
    s[a + "wo_b.weight"] = Spec((D, g * cfg.o_lora_rank), "linear", col)
    s[a + "attn_sink"] = Spec((H,), "fp32", row)
    m = cfg.compress_rate(i)
    if m:
        csa = cfg.layer_types[i] == CSA
        width = (2 if csa else 1) * hd  # CSA: two overlapping series Ca | Cb
        s[a + "compressor.wkv.weight"] = Spec((width, D), "bf16")
        s[a + "compressor.wgate.weight"] = Spec((width, D), "bf16")
        s[a + "compressor.ape"] = Spec((m, width), "fp32")
        s[a + "compressor.norm.weight"] = Spec((hd,), "fp32")
        if csa:
            nI, dI = cfg.index_n_heads, cfg.index_head_dim
            s[a + "indexer.wq_b.weight"] = Spec((nI * dI, cfg.q_lora_rank), "linear")
            s[a + "indexer.weights_proj.weight"] = Spec((nI, D), "bf16")
            s[a + "indexer.compressor.wkv.weight"] = Spec((2 * dI, D), "bf16")
            s[a + "indexer.compressor.wgate.weight"] = Spec((2 * dI, D), "bf16")
            s[a + "indexer.compressor.ape"] = Spec((m, 2 * dI), "fp32")
            s[a + "indexer.compressor.norm.weight"] = Spec((dI,), "fp32")
    f = p + "ffn."
    s[f + "gate.weight"] = Spec((cfg.n_routed_experts, D), "bf16")
    if i < cfg.num_hidden_layers and cfg.mlp_layer_types[i] == HASH_MOE:  # an MTP layer routes by score
        s[f + "gate.tid2eid"] = Spec((cfg.vocab_size, cfg.num_experts_per_tok), "int")
    else:
        s[f + "gate.bias"] = Spec((cfg.n_routed_experts,), "fp32")
    I = cfg.moe_intermediate_size
    for e in expert_range(cfg, rank, world):
        x = f + f"experts.{e}."
        s[x + "w1.weight"] = Spec((I, D), "expert", expert=e)
        s[x + "w3.weight"] = Spec((I, D), "expert", expert=e)
        s[x + "w2.weight"] = Spec((D, I), "expert", expert=e)
    if cfg.n_shared_experts:
        s[f + "shared_experts.w1.weight"] = Spec((I, D), "linear", row)
        s[f + "shared_experts.w3.weight"] = Spec((I, D), "linear", row)
        s[f + "shared_experts.w2.weight"] = Spec((D, I), "linear", col)
    return s


def storage(spec: Spec, cfg: ModelConfig) -> str:
    """How a tensor of this kind is stored in a checkpoint of this config: fp8 | fp4 | bf16 | fp32 | int."""
    if spec.kind == "linear":
        return "fp8" if cfg.quantized else "bf16"
    if spec.kind == "expert":
        return {"fp4": "fp4", "fp8": "fp8"}.get(cfg.expert_dtype, "bf16") if cfg.quantized else "bf16"
    return spec.kind


def local_slice(spec: Spec) -> tuple[int, int, int] | None:
    """(dim, start, length) of this rank's part of the full tensor, or None when whole."""
    if spec.split is None:
        return None
    dim, parts, index = spec.split
    n = spec.shape[dim] // parts
    return dim, index * n, n


def scale_name(name: str) -> str:
    """Official sibling of a quantised weight: `x.wq_a.weight` -> `x.wq_a.scale`."""
    return name[: -len(".weight")] + ".scale"


def check_rank(cfg: ModelConfig, rank: int, world: int) -> None:
    if not 0 <= rank < world:
        raise ValueError(f"rank={rank} is not in [0, world={world})")
    if world > 1:
        check_split(cfg, world)


def as_memory(name: str, kind: str, data: torch.Tensor, scale: torch.Tensor | None, row0: int, col0: int,
              device, dtype: torch.dtype):
    """The in-memory form the model reads: QWeight for every linear, plain tensors otherwise."""
    if kind in ("fp8", "fp4"):
        if kind == "fp4" and data.dtype != torch.int8:
            data = data.view(torch.int8)
        return QWeight(data.to(device), scale.to(device), kind, row0, col0)
    if kind == "int":
        return data.to(device=device, dtype=torch.int64)
    if kind == "fp32":
        return data.to(device=device, dtype=torch.float32)  # kept fp32 whatever dtype (HF: keep-in-fp32)
    t = data.to(device).to(dtype)
    return t if name == "embed.weight" else QWeight(t, fmt="dense")

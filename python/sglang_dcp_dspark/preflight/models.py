"""What each model of a launch keeps in KV on one rank, as the installed sglang reads its config.

Every figure here comes from sglang's own config loading, ``ModelConfig``
(its ``hf_config`` and ``hf_text_config``), never from top-level JSON fields:
a model that keeps its attention fields in ``text_config`` (Kimi-K2.5), a
draft architecture sglang renames (a ``DeepseekV3ForCausalLM`` draft becomes
the NextN model), or a dense draft whose KV heads are split over the
attention TP group all read the way sglang reads them.

Which pool a model gets follows the dispatch of the release's
``KVCacheConfigurator``, with that module's own predicates
(``is_deepseek_v4``, ``is_deepseek_dsa``, ``mambaish_config``,
``is_minimax_sparse``): MLA (with the DSA indexer beside it), or dense
MHA/GQA. A model the release would give another pool (DeepSeek-V4's
compressed pool, a hybrid SWA or mamba stack, MiniMax's sparse pool) is one
preflight does not size yet; it says so in one line and exits 2 instead of
leaving a pool out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.errors import DcpDsparkError
from ..core.sizing import KV_DTYPES, MHAKV, MLAKV

# Bounds on what a config may ask preflight to build. Past these the pools
# would be built (on the meta device, but with per-layer bookkeeping) for a
# model no GPU node holds: DeepSeek-V3 has 61 layers, the deepest public
# decoders a few hundred.
MAX_LAYERS = 1024
MAX_KV_HEAD_WIDTH = 1 << 16  # kv heads x head dim per layer, per rank

# Speculative algorithms whose draft keeps no KV of its own.
NO_DRAFT_KV = ("NGRAM",)
# Algorithms whose draft defaults to the target's own checkpoint (its NextN layers).
DRAFT_FROM_TARGET = ("NEXTN", "EAGLE")


@dataclass(frozen=True)
class Models:
    """What the configs say about the KV each model keeps (the rest is sglang's to read)."""

    target: MLAKV
    draft: MLAKV | MHAKV | None = None
    draft_architecture: str | None = None  # as sglang names it after its draft renames
    draft_nextn_layers: int = 0  # num_nextn_predict_layers of the draft's config (MTP)
    dsa_index_head_dim: int | None = None  # a DSA target (index_topk set): its indexer's head dim
    target_architecture: str | None = None


class Unsizable(DcpDsparkError):
    """A model whose pools preflight cannot build on this release (exit 2, one line)."""


def _architecture(mc) -> str:
    archs = getattr(mc.hf_config, "architectures", None) or ["?"]
    return str(archs[0])


def _dtype(la, mc) -> str:
    if la.kv_cache_dtype in KV_DTYPES and la.kv_cache_dtype != "auto":
        return KV_DTYPES[la.kv_cache_dtype]
    # "auto": the model's own dtype, as sglang resolves it.
    return str(getattr(mc, "dtype", "torch.bfloat16")).removeprefix("torch.")


def kv_of(release, la, mc, *, draft: bool, attn_tp_size: int, role: str, path: str):
    """The KV one rank keeps for ``mc``, following the release's own pool dispatch; raises :class:`Unsizable`."""
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.mem_cache import kv_cache_configurator as kvc

    arch = _architecture(mc)
    where = f"{role} {path} ({arch}, as sglang {release.version} loads it)"

    def refuse(why: str) -> Unsizable:
        return Unsizable(f"preflight cannot size the {where}: {why}; expected a model with an MLA or dense (MHA/GQA) "
                         "KV pool; fix: preflight a launch whose models keep MLA or dense KV, or read this one's "
                         "pool sizes from sglang's own startup log")

    def out_of_range(what: str, expected: str, field: str) -> Unsizable:
        return Unsizable(f"the {where} has {what}; expected {expected} (preflight's limits, docs/preflight.md); "
                         f"fix: check {field} in {path}/config.json (huggingface-cli download MODEL config.json)")

    hf = mc.hf_config
    if getattr(kvc, "is_deepseek_v4", lambda c: False)(hf):
        raise refuse("sglang gives it DeepSeek-V4's compressed KV pool (SWA, c4 and c128 stages), which preflight does not build")
    mla = mc.attention_arch == AttentionArch.MLA
    mambaish = getattr(kvc, "mambaish_config", lambda m: None)(mc)
    if mambaish is not None and not (mla and getattr(kvc, "is_deepseek_dsa", lambda c: False)(hf)):
        raise refuse("sglang gives it a hybrid linear-attention (mamba) stack, which preflight does not build")
    if not mla and getattr(mc, "is_hybrid_swa", False):
        raise refuse("sglang gives it a hybrid sliding-window (SWA) pool, which preflight does not build")
    if not mla and getattr(kvc, "is_minimax_sparse", lambda c: False)(hf):
        raise refuse("sglang gives it MiniMax's sparse KV pool, which preflight does not build")
    layers = release.model_layers(mc, draft=draft)
    if not draft:
        layers = math.ceil(layers / max(1, la.pp_size))
    if not 1 <= layers <= MAX_LAYERS:
        raise out_of_range(f"{layers:,} KV layers per rank", f"1 to {MAX_LAYERS:,}", "num_hidden_layers")
    dtype = _dtype(la, mc)
    if mla:
        rank, rope = int(mc.kv_lora_rank or 0), int(mc.qk_rope_head_dim or 0)
        if not (1 <= rank <= MAX_KV_HEAD_WIDTH and 0 <= rope <= MAX_KV_HEAD_WIDTH):
            raise out_of_range(f"kv_lora_rank {rank} and qk_rope_head_dim {rope} as sglang reads them",
                               f"1 to {MAX_KV_HEAD_WIDTH:,} and 0 to {MAX_KV_HEAD_WIDTH:,}", "kv_lora_rank and qk_rope_head_dim")
        return MLAKV(layers, rank, rope, dtype)
    heads = int(mc.get_num_kv_heads(attn_tp_size))
    head_dim, v_head_dim = int(mc.head_dim or 0), int(mc.v_head_dim or 0)
    if not (heads >= 1 and head_dim >= 1 and v_head_dim >= 1 and heads * (head_dim + v_head_dim) <= MAX_KV_HEAD_WIDTH):
        raise out_of_range(f"{heads} KV heads per rank of head_dim {head_dim} / v_head_dim {v_head_dim} as sglang reads them",
                           f"at least 1 each and at most {MAX_KV_HEAD_WIDTH:,} values per layer",
                           "num_key_value_heads and head_dim")
    return MHAKV(layers, heads, head_dim, v_head_dim, dtype)


def draft_path_of(la) -> str | None:
    """The checkpoint the draft worker loads, as sglang resolved it (its own NextN layers where it has no path)."""
    algorithm = str(la.speculative_algorithm or "").upper()
    if not algorithm or algorithm in NO_DRAFT_KV:
        return None
    if la.draft_model_path:
        return la.draft_model_path
    return la.model_path if algorithm in DRAFT_FROM_TARGET else None


def read(release, la) -> Models:
    """The target's and the draft's KV on rank 0, read through the release's ``ModelConfig``."""
    from sglang.srt.configs.model_config import ModelConfig

    attn_tp = release.attention_tp_size(la)
    target_mc = ModelConfig.from_server_args(la.record, model_path=la.model_path)
    target = kv_of(release, la, target_mc, draft=False, attn_tp_size=attn_tp, role="target", path=la.model_path)
    if not isinstance(target, MLAKV):
        raise Unsizable(
            f"preflight sizes HiCache host pools for MLA targets, and the target {la.model_path} "
            f"({_architecture(target_mc)}) keeps dense KV"
            + ("; sglang admits HiCache under DCP for MLA models only; " if la.dcp_size > 1 else
               " (without DCP its host pool is sglang's plain MHA one, which preflight does not size); ")
            +
            "fix: preflight an MLA target (DeepSeek-V2/V3, Kimi-K2, GLM-4.7-Flash), or drop --enable-hierarchical-cache"
        )
    hf = target_mc.hf_text_config
    index_dim = getattr(hf, "index_head_dim", None) if getattr(hf, "index_topk", None) else None
    draft = draft_mc = None
    path = draft_path_of(la)
    if path is not None:
        draft_mc = ModelConfig.from_server_args(la.record, model_path=path, is_draft_model=True)
        draft = kv_of(release, la, draft_mc, draft=True, attn_tp_size=attn_tp, role="draft", path=path)
        algorithm = str(la.speculative_algorithm).upper()
        if algorithm in DRAFT_FROM_TARGET and la.model_path == path and not (draft_mc.num_nextn_predict_layers or 0):
            # sglang would load the target's own checkpoint as the draft: without NextN layers it has none.
            raise Unsizable(
                f"the {la.speculative_algorithm} draft defaults to the target's own NextN (MTP) layers, and "
                f"{path} ({_architecture(target_mc)}) has none (num_nextn_predict_layers is not set); "
                "expected a target with MTP layers or a draft checkpoint; "
                "fix: pass --speculative-draft-model-path DRAFT, or pick a target that ships MTP layers"
            )
    return Models(target=target, draft=draft, draft_architecture=_architecture(draft_mc) if draft_mc else None,
                  draft_nextn_layers=int(getattr(draft_mc, "num_nextn_predict_layers", 0) or 0) if draft_mc else 0,
                  dsa_index_head_dim=int(index_dim) if index_dim else None, target_architecture=_architecture(target_mc))


def geometry(release, la) -> None:
    """The target's and the draft's KV numbers, checked as :func:`read` checks them (one exit-2 line for a layer
    count or a width no model has), for a launch without HiCache: nothing is sized, so a dense target passes."""
    from sglang.srt.configs.model_config import ModelConfig

    attn_tp = release.attention_tp_size(la)
    target_mc = ModelConfig.from_server_args(la.record, model_path=la.model_path)
    kv_of(release, la, target_mc, draft=False, attn_tp_size=attn_tp, role="target", path=la.model_path)
    path = draft_path_of(la)
    if path is not None and path != la.model_path:
        draft_mc = ModelConfig.from_server_args(la.record, model_path=path, is_draft_model=True)
        kv_of(release, la, draft_mc, draft=True, attn_tp_size=attn_tp, role="draft", path=path)


def kv_fields(kv) -> dict | None:
    """A KV geometry as the report shows it (with its kind)."""
    return None if kv is None else {"kind": kv.kind, **vars(kv)}



def is_mla_config(config: dict | None) -> bool:
    """Does a raw config describe MLA attention (a ``kv_lora_rank``)? Only to pick the pass map's cases.

    The pools are always read through sglang's ``ModelConfig`` (:func:`read`);
    this answers where no resolution exists to read, as for a launch every
    resolution refused.
    """
    if not isinstance(config, dict):
        return False
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    return bool(config.get("kv_lora_rank") or text.get("kv_lora_rank"))

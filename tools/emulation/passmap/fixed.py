"""The verify with the fix (upstream-next 0012, or the plugin's flashinfer MLA hooks): the flashinfer MLA cases'
TARGET_VERIFY readings with the verify planned split, recorded under ``verify_fixed``; NEXTN's draft passes too
(upstream-next 0017, the same hooks: its draft decode planned as the eager form plans it, its draft extend planned
split)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from emulation.passmap.cases import cases, measure
from emulation.passmap.harness import DCP_SIZES, release, worst_cell
from emulation.passmap.nextn import FMB

# Who carries the per-draft-token verify on flashinfer MLA: the plugin's hooks on stock sglang, or the series.
FIXES = ("plugin", "upstream-next")
VERIFY_PASSES = ("TARGET_VERIFY_GRAPH", "TARGET_VERIFY_EAGER")
# The NextN draft's own passes on flashinfer MLA that the fix plans under DCP (the plugin's hooks, upstream-next
# 0017). The eager draft decode is sglang's own DCP decode plan, untouched.
NEXTN_DRAFT_PASSES = ("DRAFT_DECODE_GRAPH", "DRAFT_EXTEND")
DRAFT_FIXES = FIXES
PLAN_HOOK = f"{FMB}.FlashInferMLAAttnBackend.init_forward_metadata"
# The kernel check each carrier runs before its first verify under DCP: the map runs no kernel (its wrappers record
# what they are handed), so the check is left to tools/emulation/mla/verify_dcp.py, which runs the oracle.
KERNEL_CHECKS = (("sglang_dcp_dspark.plugin.kernel_check", "ensure"),
                 ("sglang.srt.layers.dcp.split_verify", "ensure_dcp_verify_kernel_checked"))


def fixed_passes(fix: str, algorithm: str) -> tuple[str, ...]:
    """The passes ``fix`` plans for a case of ``algorithm``: the verify, and NEXTN's draft passes where it carries
    them."""
    return VERIFY_PASSES + (NEXTN_DRAFT_PASSES if algorithm == "NEXTN" and fix in DRAFT_FIXES else ())


@contextlib.contextmanager
def verify_fix(name: str) -> Iterator[None]:
    """The fix in effect: the plugin's flashinfer MLA hooks, applied through its hook table as the plugin applies
    them (and only where they judge this release's code needs them), or the series' own code on this tree; the
    carriers' kernel checks off (``KERNEL_CHECKS``)."""
    import importlib

    from sglang_dcp_dspark.core import swap

    with contextlib.ExitStack() as stack:
        for module_name, attr in KERNEL_CHECKS:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            if hasattr(module, attr):
                stack.enter_context(swap.attribute(module, attr, lambda *args, **kwargs: None))
        if name == "plugin":
            from sglang_dcp_dspark.plugin import hooks

            findings = stack.enter_context(hooks.in_effect(FMB))
            found = findings.get(PLAN_HOOK)
            if found is None or found.verdict.name != "NEEDS_FIX":
                raise SystemExit(f"error: the plugin's verify hooks do not apply to sglang {release()} "
                                 f"({found.detail if found else 'no flashinfer MLA backend'}); fix: run --fix plugin on "
                                 "a stock 0.5.22 or 0.5.23 tree (PYTHONPATH=build/trees/sglang-0.5.23)")
        elif name == "upstream-next":
            if not hasattr(importlib.import_module(FMB), "plan_dcp_split_verify"):
                raise SystemExit("error: this tree does not carry upstream-next 0012; fix: "
                                 "PYTHONPATH=build/trees/sglang-0.5.23-next (make next-trees)")
        else:
            raise SystemExit(f"error: --fix {name}: expected one of {', '.join(FIXES)}")
        yield


def fixed_records(fix: str) -> list[dict]:
    """The flashinfer MLA cases' verify readings with ``fix`` in effect (every other pass is untouched by it)."""
    with verify_fix(fix):
        records = measure(dcp_sizes=tuple(n for n in DCP_SIZES if n > 1),
                          only=[c for c in cases() if c[2] == "flashinfer_mla"])
    # Only under DCP (measured above): at dcp 1 nothing is planned split, and the judge reads dcp > 1 alone.
    return [{"release": r["release"], "fix": fix, "algorithm": r["algorithm"], "draft_class": r["draft_class"],
             "draft_backend_flag": r["draft_backend_flag"], "dcp": r["dcp"], "rank": r["rank"],
             "passes": {p: {**r["passes"][p], "where": fixed_where(fix, p, r["passes"][p].get("where", ""))}
                        for p in fixed_passes(fix, r["algorithm"])}} for r in records if r["dcp"] > 1]


def fixed_where(fix: str, name: str, stock: str) -> str:
    """The path the verify takes with ``fix`` in effect, which the stock case's ``where`` does not describe: the
    split plan from the hooked (or patched) metadata entry down to the two wrappers' plans. The plan the batch is
    bound to (the ``[plan: ...]`` tail) stays the stock case's. NEXTN's draft passes: its draft decode through the
    decode updater (the plugin's hook, or 0017's code), its draft extend through the split plan."""
    plan = stock[stock.rindex(" [plan: "):] if " [plan: " in stock else ""
    hooks = "sglang_dcp_dspark.plugin.hooks.flashinfer_mla_backend"
    if name == "DRAFT_DECODE_GRAPH":
        how = (f"{hooks}.plan_draft_decode, the plugin's AROUND hook" if fix == "plugin" else "upstream-next 0017")
        return (f"{FMB}.FlashInferMLAMultiStepDraftBackend.init_forward_metadata_out_graph -> common_template -> "
                "FlashInferMLAAttnBackend._apply_cuda_graph_metadata -> FlashInferMLAIndicesUpdaterDecode."
                f"call_begin_forward ({how}: a draft input under DCP planned as the eager form plans it) -> "
                "KVIndexTranslator.pack_read_stream, sglang.srt.layers.dcp.planner.plan_dcp_decode_metadata, "
                "KVIndexTranslator.translate_dcp_read_ids" + plan)
    if name == "DRAFT_EXTEND":
        body = (f" (the plugin's AROUND hook) -> {hooks}.plan_split_verify on the draft extend's wrapper pair -> "
                "dcp_verify.plan_split (host lengths) and dcp_verify.build_ids" if fix == "plugin" else
                " -> FlashInferMLAAttnBackend._plan_dcp_split_verify on dcp_draft_extend_split -> "
                "sglang.srt.layers.dcp.split_verify.plan_dcp_split_verify (host lengths) and build_dcp_split_verify_ids")
        return ("sglang.srt.speculative.eagle_worker_common.prepare_for_draft_extend (DRAFT_EXTEND_V2) -> "
                f"{FMB}.FlashInferMLAAttnBackend.init_forward_metadata" + body
                + " (sglang.kernels.ops.attention.dcp_kernels.create_triton_kv_indices_for_dcp_triton over "
                "req_to_token) -> the prefix wrapper's plan (a row per request) and the window wrapper's (a row per "
                "token)" + plan)
    entry = (f"{FMB}.FlashInferMLAAttnBackend.init_cuda_graph_state -> init_forward_metadata_out_graph(in_capture=True)"
             " -> replay: init_forward_metadata_out_graph" if name == "TARGET_VERIFY_GRAPH"
             else "sglang.srt.model_executor.runner.eager_runner -> "
                  f"{FMB}.FlashInferMLAAttnBackend.init_forward_metadata")
    if fix == "plugin":
        body = (" (the plugin's AROUND hook) -> sglang_dcp_dspark.plugin.hooks.flashinfer_mla_backend."
                "plan_split_verify -> dcp_verify.plan_split (host lengths) and dcp_verify.build_ids")
    else:
        body = (" -> FlashInferMLAAttnBackend._plan_dcp_split_verify -> sglang.srt.layers.dcp.split_verify."
                "plan_dcp_split_verify (host lengths) and build_dcp_split_verify_ids")
    return (entry + body + " (sglang.kernels.ops.attention.dcp_kernels.create_triton_kv_indices_for_dcp_triton over "
            "req_to_token) -> the prefix wrapper's plan (a row per request) and the window wrapper's (a row per draft "
            "token)" + plan)


def fixed_key(r: dict) -> tuple:
    return (tuple(int(x) for x in r["release"].split(".")[:3]), r["fix"], r["algorithm"],
            r.get("draft_backend_flag") or "", r["dcp"], r["rank"])


def fixed_markdown(records: list[dict]) -> list[str]:
    """The verify with the fix, per launch kind: worst over the ranks and dcp sizes run; NEXTN's draft passes where
    the fix plans them ("-": the fix leaves that pass as the stock table reads it)."""
    columns = VERIFY_PASSES + NEXTN_DRAFT_PASSES
    out = ["### The verify planned split (upstream-next 0012, the plugin's flashinfer MLA hooks)", "",
           "TARGET_VERIFY on flashinfer MLA with the fix in effect, and NEXTN's draft decode graph and draft extend "
           "where the fix plans them (worst over dcp 2, 4, 8, first and last rank; "
           f"`{GENERATED_FIX}`). The numbers behind it: docs/verify-under-dcp.md.", "",
           "| sglang | fix | algorithm | draft-backend flag | " + " | ".join(columns) + " |",
           "|---|---|---|---|" + "---|" * len(columns)]
    groups: dict = {}
    for r in records:
        if r["dcp"] > 1:
            groups.setdefault((r["release"], r["fix"], r["algorithm"], r.get("draft_backend_flag")), []).append(r)
    for (rel, fix, algorithm, flag), rows in groups.items():
        out.append(f"| {rel} | {fix} | {algorithm} | {flag or 'default'} | "
                   + " | ".join(worst_cell([r["passes"][p] for r in rows]) if p in rows[0]["passes"] else "-"
                                for p in columns) + " |")
    return out + [""]


GENERATED_FIX = ("python -m emulation.passmap --fix plugin --write (stock 0.5.22 and 0.5.23), --fix upstream-next --write "
                 "(0.5.23 + upstream-next)")

"""All the speculative cases the map runs: each algorithm, draft backend flag and target backend, at every dcp
size, as rank 0 and the last rank (``measure``)."""

from __future__ import annotations

from emulation.passmap import blackwell, eagle
from emulation.passmap.dspark import DSPARK_DRAFT_BACKENDS, dspark_case
from emulation.passmap.fa3 import nextn_fa3_case
from emulation.passmap.harness import DCP_SIZES, PASSES, Case, default_draft_backend, raised
from emulation.passmap.nextn import nextn_case

TARGET_BACKENDS = ("flashinfer_mla", "fa3")  # --attention-backend flashinfer / fa3 on the MLA target
# External dense drafts (LlamaForCausalLMEagle / LlamaForCausalLMEagle3): tools/emulation/passmap/eagle.py
EXTERNAL_DRAFTS = eagle.ALGORITHMS


def cases() -> list[tuple]:
    """(algorithm, --speculative-draft-attention-backend, target backend), each at every dcp, as rank 0 and the last
    rank; None: the flag left unset (NEXTN's draft runs the target's backend; DSPARK's resolves to the release
    default). The fa3 target runs with the draft flag unset."""
    return ([("NEXTN", None, "flashinfer_mla")] + [("DSPARK", b, "flashinfer_mla") for b in DSPARK_DRAFT_BACKENDS]
            + [(a, None, "flashinfer_mla") for a in EXTERNAL_DRAFTS]
            + [("NEXTN", None, "fa3"), ("DSPARK", None, "fa3")])


def set_up_failed(algorithm, flag, dcp, rank, exc, target_backend: str = "flashinfer_mla") -> tuple[Case, dict]:
    kind = "mla" if algorithm == "NEXTN" else "mha"
    draft_class = {"NEXTN": "DeepseekV3ForCausalLMNextN", "EAGLE": "LlamaForCausalLMEagle",
                   "EAGLE3": "LlamaForCausalLMEagle3"}.get(algorithm, "DSparkDraftModel")
    if algorithm == "NEXTN":
        backend = target_backend
    elif algorithm in EXTERNAL_DRAFTS:
        backend = "flashinfer"
    else:
        try:
            backend = flag if flag is not None else default_draft_backend(target_backend)
        except Exception:
            backend = flag
    case = Case(algorithm, draft_class, kind, target_backend, backend, dcp, rank, draft_backend_flag=flag)
    r = raised(exc)
    msg = {"verdict": "not-run", "detail": f"the harness could not build this release's pools/backends on CPU: "
           f"{r['detail']}", "where": "tools/emulation/passmap/cases.py (set-up)"}
    return case, {p: dict(msg, after_hicache={"verdict": "not-run", "detail": msg["detail"]}) for p in PASSES}


def measure(dcp_sizes=DCP_SIZES, only: list | None = None) -> list[dict]:
    records = []
    for algorithm, backend, *rest in (only or cases()):
        target = rest[0] if rest else "flashinfer_mla"
        for dcp in dcp_sizes:
            for rank in sorted({0, dcp - 1}):
                try:
                    if algorithm == "NEXTN":
                        case, passes = nextn_case(dcp, rank) if target == "flashinfer_mla" else nextn_fa3_case(dcp, rank)
                    elif algorithm in EXTERNAL_DRAFTS:
                        case, passes = eagle.eagle_case(algorithm, dcp, rank)
                    else:
                        case, passes = dspark_case(backend, dcp, rank, target)
                except Exception as exc:  # the release lacks an API the harness drives
                    case, passes = set_up_failed(algorithm, backend, dcp, rank, exc, target)
                records.append(case.record({p: passes[p] for p in PASSES}))
    if only is None:  # Blackwell's backends beside flashinfer_mla's DSPARK and EAGLE3 cases (their drafts' passes)
        records += blackwell.spec_records(records)
    return records

"""Probes: launches the release refuses before any pass runs, by its own check."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from emulation.passmap.harness import STEPS, on_rank, raised, release
from emulation.passmap.nextn import FMB

REGISTRY = "sglang.srt.layers.attention.attention_registry"


def probe_trtllm_mla_target(dcp: int = 8) -> dict:
    """``--attention-backend trtllm_mla`` on the MLA target, speculative decoding on, at ``dcp``: the release's own
    backend factory (``ATTENTION_BACKENDS["trtllm_mla"]``), with the decode backend it resolves standing in for
    the resolved server args. (At dcp 1 the check must let it through: the probe's own control.)"""
    import importlib
    from unittest import mock

    from sglang.srt.runtime_context import get_spec

    reg = importlib.import_module(REGISTRY)
    # 0.5.18 asks the server args themselves (speculative_algorithm, get_attention_backends())
    # (0.5.17 reads dcp_size off them too; later releases the runtime context)
    args = SimpleNamespace(speculative_algorithm="EAGLE", get_attention_backends=lambda: ("trtllm_mla", "trtllm_mla"),
                           dcp_size=dcp)
    runner = SimpleNamespace(use_mla_backend=True, server_args=args)
    out = {"probe": f"--attention-backend trtllm_mla on the MLA target, speculative decoding, dcp {dcp}",
           "where": f"{REGISTRY}.create_trtllm_mla_backend (ATTENTION_BACKENDS['trtllm_mla'])"}
    with on_rank(dcp, 0), get_spec().override(speculative_algorithm="EAGLE"), contextlib.ExitStack() as stack:
        for name, value in (("attention_backends_of", lambda view: ("trtllm_mla", "trtllm_mla")),
                            ("resolved_view", lambda a: a)):
            if hasattr(reg, name):
                stack.enter_context(mock.patch.object(reg, name, value))
        try:
            reg.ATTENTION_BACKENDS["trtllm_mla"](runner)
        except ValueError as exc:
            return dict(out, verdict="not-admitted", detail=f"ValueError: {exc}")
        except Exception as exc:  # past the check: building the backend itself needs the GPU
            return dict(out, verdict="not-run", detail=f"the factory admits it; building it here stopped at "
                        f"{raised(exc)['detail']}")
    return dict(out, verdict="not-run", detail="the factory admits it; its passes are not mapped")


def probe_flashinfer_mla_topk() -> dict:
    """``--speculative-eagle-topk 2`` with a flashinfer-MLA draft: the release's own multi-step draft backend."""
    import importlib

    fmb = importlib.import_module(FMB)
    out = {"probe": "--speculative-eagle-topk 2 with a flashinfer-MLA draft (NEXTN)",
           "where": f"{FMB}.FlashInferMLAMultiStepDraftBackend.__init__"}
    try:
        fmb.FlashInferMLAMultiStepDraftBackend(SimpleNamespace(), topk=2, speculative_num_steps=STEPS)
    except ValueError as exc:
        return dict(out, verdict="not-admitted", detail=f"ValueError: {exc}")
    except Exception as exc:
        return dict(out, verdict="not-run", detail=f"topk 2 passes the check; building it here stopped at "
                    f"{raised(exc)['detail']}")
    return dict(out, verdict="not-run", detail="topk 2 is admitted; its passes are not mapped")


def probes() -> list[dict]:
    records = []
    for probe in (probe_trtllm_mla_target, probe_flashinfer_mla_topk):
        try:
            r = probe()
        except Exception as exc:  # the release lacks what the probe drives
            r = {"probe": probe.__name__, "where": "tools/emulation/passmap/probes.py", "verdict": "not-run",
                 "detail": f"the harness could not run this probe: {raised(exc)['detail']}"}
        records.append(dict(r, release=release()))
    return records

"""plugin.kernel_check: the check of flashinfer's MLA kernel before the first verify under DCP, on stand-in kernels.

The oracle (``tools/emulation/mla/oracle.py``, the wrapper's documented contract) must pass, and each deliberately broken
kernel must stop with one line naming its assumption. Here the merge is a torch merge of base-2 partials written
for the test, because the installed sglang (0.5.17) cannot import its ``merge_state`` without a GPU; the check on
sglang's own ``merge_state`` (its Triton kernel in the interpreter), through the backend's first verify, is
test/numerics/test_verify_dcp.py's.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from emulation.mla.oracle import BROKEN_KERNELS, OracleMLAWrapper
from sglang_dcp_dspark.plugin import dcp_verify, kernel_check

SHAPE = dict(num_heads=4, head_dim_ckv=512, head_dim_kpe=64, sm_scale=192 ** -0.5, q_dtype=torch.float32,
             kv_dtype=torch.float32)


def torch_merge(out_a, lse_a, out_b, lse_b, empty_a, empty_b):
    """Two partials merged by their base-2 LSE, a flagged side weighing zero, both flagged giving (0, -inf)."""
    lse_a = lse_a.masked_fill(empty_a[:, None], float("-inf"))
    lse_b = lse_b.masked_fill(empty_b[:, None], float("-inf"))
    total = torch.logaddexp(lse_a * math.log(2.0), lse_b * math.log(2.0))
    w_a = torch.exp(lse_a * math.log(2.0) - total).nan_to_num(0.0)
    w_b = torch.exp(lse_b * math.log(2.0) - total).nan_to_num(0.0)
    out = out_a.masked_fill(empty_a[:, None, None], 0) * w_a[..., None] + out_b.masked_fill(
        empty_b[:, None, None], 0) * w_b[..., None]
    return out, total / math.log(2.0)


def run(kernel, merge=torch_merge) -> None:
    kernel_check.check(kernel, workspace=None, device="cpu", merge=merge, **SHAPE)


def test_the_oracle_passes():
    run(OracleMLAWrapper)


@pytest.mark.parametrize(("kernel", "assumption"), [("lse-base-e", "lse-base"), ("top-left", "causal"),
                                                     ("drops-empty-row", "rows")])
def test_each_broken_kernel_stops_in_one_line_naming_its_assumption(kernel, assumption):
    with pytest.raises(kernel_check.KernelCheckFailed) as caught:
        run(BROKEN_KERNELS[kernel])
    message = str(caught.value)
    assert caught.value.assumption == assumption
    assert "\n" not in message and len(message) < 400
    assert "--dcp-size 1" in message and assumption in message


def test_a_merge_in_the_wrong_base_stops():
    def base_e(out_a, lse_a, out_b, lse_b, empty_a, empty_b):
        return torch_merge(out_a, lse_a / math.log(2.0), out_b, lse_b / math.log(2.0), empty_a, empty_b)

    with pytest.raises(kernel_check.KernelCheckFailed) as caught:
        run(OracleMLAWrapper, merge=base_e)
    assert caught.value.assumption == "merge"


def test_a_wrapper_that_ignores_its_bound_buffers_stops_on_the_replan():
    class Stale(OracleMLAWrapper):
        """Plans only the first time, as a graph replay that never re-plans its wrapper would run."""

        def plan(self, *args, **kwargs):
            if self._plan_args is None:
                super().plan(*args, **kwargs)

    with pytest.raises(kernel_check.KernelCheckFailed) as caught:
        run(Stale)
    assert caught.value.assumption == "replan"


def test_ensure_runs_once_per_process_and_shape(monkeypatch):
    monkeypatch.setattr(dcp_verify, "merge_partials", torch_merge)
    monkeypatch.setattr(kernel_check, "_passed", set())
    calls = []
    real = kernel_check.check
    monkeypatch.setattr(kernel_check, "check", lambda *a, **k: calls.append(k) or real(*a, **k))
    updater = SimpleNamespace(kv_lora_rank=512, qk_rope_head_dim=64, scaling=192 ** -0.5, q_data_type=torch.float32,
                              data_type=torch.float32)
    backend = SimpleNamespace(device="cpu", workspace_buffer=None, indices_updater_prefill=updater,
                              indices_updater_decode=SimpleNamespace(num_local_heads=4))
    kernel_check.ensure(backend, OracleMLAWrapper)
    kernel_check.ensure(backend, OracleMLAWrapper)
    assert len(calls) == 1 and calls[0]["num_heads"] == 4
    with pytest.raises(kernel_check.KernelCheckFailed):
        kernel_check.ensure(backend, BROKEN_KERNELS["top-left"])
    with pytest.raises(kernel_check.KernelCheckFailed):  # a failure is not remembered as a pass
        kernel_check.ensure(backend, BROKEN_KERNELS["top-left"])

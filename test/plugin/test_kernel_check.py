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
    empty_a, empty_b = empty_a.bool(), empty_b.bool()
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


@pytest.mark.parametrize(("kernel", "assumption"), [("lse-base-e", "lse-base"), ("drops-empty-row", "rows"),
                                                     ("split-kv-unweighted", "split-kv"),
                                                     ("stale-replay", "replay")])
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


def test_a_replay_that_does_not_plan_stops_on_the_replay():
    """The check's replay goes through the plan it is given: one that skips flashinfer's scheduler leaves the
    kernel on the capture's plan, which a kernel that snapshots its plan (the stale-replay control) runs."""
    with pytest.raises(kernel_check.KernelCheckFailed) as caught:
        kernel_check.check(BROKEN_KERNELS["stale-replay"], workspace=None, device="cpu", merge=torch_merge,
                           replan=lambda *args: None, **SHAPE)
    assert caught.value.assumption == "replay"
    run(OracleMLAWrapper)  # and the same check passes a kernel that reads its bound buffers


def test_the_long_row_is_long_enough_for_a_split():
    """On CPU the reference splits rows of more than SPLIT_KV keys; the check's long row must be one of them."""
    from emulation.mla.oracle import SPLIT_KV

    assert kernel_check.LONG_ROW_ELSEWHERE >= 2 * SPLIT_KV and kernel_check.LONG_ROW["cuda"] >= 16384


class _Group:
    """A DCP group of two ranks as the check's agreement reads it; the other rank failed or passed."""

    def __init__(self, other_failed: bool) -> None:
        self.world_size, self.other = 2, int(other_failed)

    def all_gather(self, tensor):
        return torch.cat([tensor, torch.tensor([self.other], dtype=tensor.dtype)])


def _backend():
    updater = SimpleNamespace(kv_lora_rank=512, qk_rope_head_dim=64, scaling=192 ** -0.5, q_data_type=torch.float32,
                              data_type=torch.float32)
    return SimpleNamespace(device="cpu", workspace_buffer=None, indices_updater_prefill=updater,
                           indices_updater_decode=SimpleNamespace(num_local_heads=4))


def test_a_rank_whose_check_fails_stops_every_rank(monkeypatch):
    from sglang.srt.distributed import parallel_state

    monkeypatch.setattr(dcp_verify, "merge_partials", torch_merge)
    monkeypatch.setattr(kernel_check, "_passed", set())
    monkeypatch.setattr(parallel_state, "get_dcp_group_no_assert", lambda: _Group(other_failed=True), raising=False)
    with pytest.raises(kernel_check.KernelCheckFailed) as caught:  # this rank's kernel passes, rank 1's did not
        kernel_check.ensure(_backend(), OracleMLAWrapper)
    assert caught.value.assumption == "another rank" and "rank 1" in str(caught.value)
    assert "\n" not in str(caught.value)
    monkeypatch.setattr(parallel_state, "get_dcp_group_no_assert", lambda: _Group(other_failed=False), raising=False)
    kernel_check.ensure(_backend(), OracleMLAWrapper)  # both passed: the verify goes on


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
        kernel_check.ensure(backend, BROKEN_KERNELS["drops-empty-row"])
    with pytest.raises(kernel_check.KernelCheckFailed):  # a failure is not remembered as a pass
        kernel_check.ensure(backend, BROKEN_KERNELS["drops-empty-row"])

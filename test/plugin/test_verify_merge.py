"""plugin.verify_merge: the split verify's on-rank merge, one Triton kernel, run in Triton's interpreter in a child
process (the interpreter must be on before Triton is imported) against a torch merge of base-2 partials."""

from __future__ import annotations

import os
import subprocess
import sys

from sglang_dcp_dspark.plugin import verify_merge

MERGE_CHILD = r"""
import importlib, math, sys, torch
verify_merge = importlib.import_module(sys.argv[1])  # the module the test imports, by its name
torch.manual_seed(1)
tokens, heads, dim = 4, 3, 40
out = [torch.randn(tokens, heads, dim) for _ in range(2)]
lse = [torch.randn(tokens, heads) * 4 for _ in range(2)]
# Per token: both sides, the window only, the prefix only, neither; a flagged side's filler output is NaN here,
# and must not be read.
empty_a, empty_b = torch.tensor([0, 1, 0, 1], dtype=torch.int32), torch.tensor([0, 0, 1, 1], dtype=torch.int32)
out[0][1], out[1][2] = float("nan"), float("nan")
ln2 = math.log(2.0)
total = torch.logaddexp(lse[0][0] * ln2, lse[1][0] * ln2)
want0 = out[0][0] * torch.exp(lse[0][0] * ln2 - total)[:, None] + out[1][0] * torch.exp(lse[1][0] * ln2 - total)[:, None]
got_out, got_lse = verify_merge.merge_verify_sides(out[0].clone(), lse[0].clone(), out[1], lse[1], empty_a, empty_b)
errors = [float((got_out[0] - want0).abs().max()), float((got_lse[0] - total / ln2).abs().max()),
          float((got_out[1] - out[1][1]).abs().max()), float((got_lse[1] - lse[1][1]).abs().max()),
          float((got_out[2] - out[0][2]).abs().max()), float((got_lse[2] - lse[0][2]).abs().max()),
          float(got_out[3].abs().max())]
print(max(errors), bool(torch.isneginf(got_lse[3]).all()))
"""


def test_the_merge_kernel_weighs_a_flagged_side_at_zero_and_never_reads_it():
    """The on-rank merge (one Triton kernel, in Triton's interpreter here): both sides merged by their base-2 LSE,
    a flagged side weighed at zero and its filler output never read (NaN here), both flagged giving (0, -inf)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", MERGE_CHILD, verify_merge.__name__], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    error, neutral = out.stdout.split()
    assert float(error) < 1e-5 and neutral == "True"

"""Reading preflight's text report in tests: its verdict line is the one starting ``verdict:``, with a short block
beneath it (``preflight.verdict.Verdict.block``)."""

from __future__ import annotations


def verdict_line(text: str) -> str:
    """The verdict line of a text report (the last line that starts ``verdict:``)."""
    lines = [line for line in text.rstrip().splitlines() if line.startswith("verdict: ")]
    assert lines, f"no verdict line in:\n{text[-2000:]}"
    return lines[-1]


def below_verdict(text: str) -> list[str]:
    """The block beneath the verdict line."""
    lines = text.rstrip().splitlines()
    at = max(i for i, line in enumerate(lines) if line.startswith("verdict: "))
    return lines[at + 1:]

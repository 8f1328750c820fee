"""Every exit code of ``sglang-dcp-dspark``, and what each means: written here once.

The command line's help, preflight's verdict words, the Makefile's demo and
the docs' tables (README.md, docs/operator-guide.md: generated blocks, checked
for freshness) all read this table; none restates it.

    python -m sglang_dcp_dspark.core.exits --markdown    # the docs' table
    python -m sglang_dcp_dspark.core.exits --verdict N   # exit 0 where N is a preflight verdict, else N
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

PASSES, REJECTED, BAD_INPUT, STOPS, INTERNAL_ERROR, BROKEN_PASS, UNCHECKED = 0, 1, 2, 3, 4, 5, 6
INTERRUPTED = {130: "SIGINT", 143: "SIGTERM"}
CLOSED_PIPE = 141


@dataclass(frozen=True)
class Exit:
    code: int
    outcome: str  # what preflight's verdict line starts with, after "verdict: "
    meaning: str  # one sentence, in an operator's words
    verdict: bool  # preflight reached a verdict on the launch (not an error of its input or of this tool)


EXITS = (
    Exit(PASSES, "PASSES", "sglang admits the launch and it will start; under DCP every pass it runs was checked "
                           "(or there is no DCP); other commands: done", True),
    Exit(REJECTED, "REJECTED", "sglang, or the plugin's own check, rejects the launch at argument time", True),
    Exit(BAD_INPUT, "BAD INPUT", "bad input, or a command refused or failed: one `error:` line on stderr (JSON on "
                                 "stdout with --json), and any sglang tree left unchanged", False),
    Exit(STOPS, "STOPS AT STARTUP", "sglang admits the launch, but it stops at startup: its host pools are refused, "
                                    "short of the logical slots, or over the node's RAM, or the attention backend "
                                    "refuses it as it starts", True),
    Exit(INTERNAL_ERROR, "INTERNAL ERROR", "a bug of this tool, never a verdict: one line "
                                           "(SGLANG_DCP_DSPARK_TRACEBACK=1 shows the traceback)", False),
    Exit(BROKEN_PASS, "BROKEN PASS", "sglang admits the launch and it starts, but under DCP one of its passes "
                                     "crashes or reads other tokens' KV", True),
    Exit(UNCHECKED, "PASSES, UNCHECKED", "sglang admits the launch and it will start, but under DCP its passes "
                                         "were not checked on the backend or release it runs", True),
)
BY_CODE = {e.code: e for e in EXITS}
OUTCOMES = {e.code: e.outcome for e in EXITS}
VERDICTS = tuple(e.code for e in EXITS if e.verdict)


def markdown() -> str:
    """The docs' table: every code, how preflight's output starts, what it means."""
    rows = ["| exit | output starts | meaning |", "|---|---|---|"]
    for e in sorted(EXITS, key=lambda e: e.code):
        starts = f"`verdict: {e.outcome} (exit {e.code})`" if e.verdict else "`error:` (stderr)"
        rows.append(f"| {e.code} | {starts} | {e.meaning} |")
    rows.append(f"| {', '.join(map(str, INTERRUPTED))} | `error:` (stderr) | interrupted by "
                f"{' / '.join(INTERRUPTED.values())}; any sglang tree unchanged or put back whole |")
    rows.append(f"| {CLOSED_PIPE} | | stdout was closed early (`\\| head`) |")
    return "\n".join(rows) + "\n"


def help_text() -> str:
    """The command line's epilog: one short line per code."""
    lines = ["exit codes:"]
    for e in sorted(EXITS, key=lambda e: e.code):
        lines.append(f"  {e.code}  {e.outcome if e.verdict else e.outcome.lower()}")
    lines.append(f"  {', '.join(map(str, INTERRUPTED))}  interrupted; {CLOSED_PIPE}  stdout closed early")
    lines.append("  (what each means: python -m sglang_dcp_dspark.core.exits --markdown)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--markdown"]:
        sys.stdout.write(markdown())
        return 0
    if len(args) == 2 and args[0] == "--verdict" and args[1].lstrip("-").isdigit():
        return 0 if int(args[1]) in VERDICTS else int(args[1])
    print("error: expected --markdown or --verdict CODE; fix: python -m sglang_dcp_dspark.core.exits --markdown",
          file=sys.stderr)
    return BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())

"""``preflight --sweep``: one judgement per value of one launch option, sglang imported once."""

from __future__ import annotations

from ..core.errors import DcpDsparkError
from . import check as preflight
from . import launch as launch_mod
from . import result
from . import verdict as verdict_mod
from .launch import Node

# A sweep judges each value in full (about a second each): past this many
# values it is a batch job, not a preflight. Longer than PROGRESS_FROM values,
# it says how far it is on stderr.
MAX_SWEEP_VALUES = 32
PROGRESS_FROM = 4
# Launch options a sweep may vary, and how each value is checked.
SWEEPABLE = {"dcp": "--dcp-size", "hicache-size": "--hicache-size", "hicache-ratio": "--hicache-ratio",
             "page-size": "--page-size", "tp": "--tp"}


def parse_sweep(spec: str) -> tuple[str, str, list[str]]:
    """``dcp=1,2,4,8`` -> (name, the launch flag, the values); checked before sglang is imported."""
    name, _, values = spec.partition("=")
    name = name.strip()
    if name not in SWEEPABLE or not values.strip():
        raise DcpDsparkError(f"--sweep {spec!r} is not NAME=V1,V2,...; expected NAME one of {', '.join(SWEEPABLE)}; fix: e.g. --sweep dcp=1,2,4,8 or --sweep hicache-size=50,100,200")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not items:
        raise DcpDsparkError(f"--sweep {spec!r} names no value; expected numbers separated by commas; fix: --sweep {name}=1,2,4,8")
    if len(items) > MAX_SWEEP_VALUES:
        raise DcpDsparkError(f"--sweep {name} has {len(items):,} values; expected at most {MAX_SWEEP_VALUES} (each is a whole judgement, about a second); fix: sweep fewer values, or split the sweep into runs of {MAX_SWEEP_VALUES}")
    seen: dict[float, str] = {}
    for v in items:
        try:
            number = float(v)
        except ValueError:
            raise DcpDsparkError(f"--sweep {name} value {v!r} is not a number; expected numbers separated by commas; fix: --sweep {name}=1,2,4,8") from None
        if number in seen:
            raise DcpDsparkError(f"--sweep {name} gives {seen[number]!r} and {v!r}, the same value twice; expected each value once (a launch judged twice says the same); fix: drop the repeat from --sweep {name}=...")
        seen[number] = v
    return name, SWEEPABLE[name], items


def sweep(launch: list[str], node: Node, device_rows: int | None, spec: str, *, progress=None) -> result.Sweep:
    """One judgement per value of one launch option, sglang imported once; the chart's four setups per value.

    ``progress(done, total, value)`` is called before each judgement of a
    sweep longer than :data:`PROGRESS_FROM` values. A value preflight refuses
    as input is a row with that verdict; the sweep's verdict is its worst row's.
    """
    name, flag, values = parse_sweep(spec)
    default_rows = not launch and device_rows is None
    if default_rows:
        device_rows = preflight.DEFAULT_DEVICE_ROWS
    release, argv, configs = preflight.prepare(launch, node, device_rows)
    rows = []
    for i, value in enumerate(values):
        if progress is not None and len(values) > PROGRESS_FROM:
            progress(i, len(values), value)
        varied = launch_mod.replace_option(argv, flag, value)
        try:
            report = preflight.judge(release, varied, node, device_rows, configs, variants=True)
        except DcpDsparkError as exc:
            report = result.Refused(verdict_mod.of_error(exc.exit_code, str(exc)))
        rows.append(result.SweepRow(value, report))
    _refuse_what_no_value_changes(rows, flag)
    worst = verdict_mod.worst(r.report.verdict.code for r in rows)
    return result.Sweep(name, flag, release.version, tuple(argv), tuple(rows),
                        next(r.report.verdict for r in rows if r.report.verdict.code == worst))


def _refuse_what_no_value_changes(rows: list[result.SweepRow], flag: str) -> None:
    """Bad input that every value of the sweep meets alike (a launch argument sglang cannot parse, a config it
    cannot read) is the launch's, not the swept option's: one error line, exit 2, not a table of the same row."""
    first = rows[0].report.verdict
    if first.code != 2 or any(r.report.verdict.code != 2 or r.report.verdict.why != first.why for r in rows):
        return
    message = first.why[0] if first.why else first.reason
    what, sep, fix = message.partition("; fix:")
    raise DcpDsparkError(f"{what} (the same at every {flag} value of the sweep){sep}{fix}")

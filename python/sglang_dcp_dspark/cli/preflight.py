"""``preflight``'s command line: its options read into a node and a launch, one judgement or a sweep, the report.

The judgement is :mod:`preflight`'s, the sweep :mod:`sweep`'s; here a bad
option is one line (and JSON with ``--json``), and the exit code is the
verdict's (a sweep exits with its worst).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..core import exits
from ..core.errors import DcpDsparkError
from ..preflight import check as preflight
from ..preflight import gpus
from ..preflight import sweep as sweep_mod
from ..preflight import verdict as verdict_mod
from ..preflight.launch import FIX_PREFLIGHT, Node


def _number(flag: str, value: str | None, kind: type, *, local: bool = False):
    """preflight's numeric options, read here rather than by argparse so that a bad one is a one-line error (JSON with --json)."""
    if value is None:
        return None
    if local and value.strip().lower() == "local":
        return None  # this machine's available RAM now
    try:
        return kind(value)
    except ValueError:
        what = ("an integer" if kind is int else "a number") + (" or 'local'" if local else "")
        raise DcpDsparkError(f"{flag} {value!r} is not {what}; fix: {FIX_PREFLIGHT} with {flag} set to {what}") from None


def _progress(done: int, total: int, value: str) -> None:
    print(f"preflight: judging value {done + 1} of {total} ({value})", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from ..preflight import report as report_mod

    launch = list(args.launch or [])
    if launch[:1] == ["--"]:
        launch = launch[1:]
    try:
        ram = {}
        if args.host_ram_gib is not None:
            ram = {"host_ram_gib": _number("--host-ram-gib", args.host_ram_gib, float, local=True), "host_ram_from": "--host-ram-gib"}
        # The embedded default launch is judged on its own node unless a part is named.
        gpu_name = args.gpu_name if args.gpu_name is not None or launch else preflight.DEFAULT_GPU
        node = Node.of_part(gpu_name, gpus=_number("--gpus", args.gpus, int),
                            gpu_memory_gib=_number("--gpu-memory-gib", args.gpu_memory_gib, float), **ram)
        rows = _number("--device-rows", args.device_rows, int)
        if args.plot and not args.sweep:
            raise DcpDsparkError("--plot draws a sweep; expected --sweep NAME=V1,V2,... with it; fix: sglang-dcp-dspark preflight --sweep dcp=1,2,4,8 --plot FILE")
        if args.sweep and len(args.sweep) > 1:
            raise DcpDsparkError(f"--sweep is given {len(args.sweep)} times ({', '.join(args.sweep)}); a sweep varies one option; expected one --sweep; fix: run one preflight per option")
        if args.plot:
            report_mod.chart_format(args.plot)  # a name whose format cannot be written is refused before any judgement
        if args.sweep:
            result = sweep_mod.sweep(launch, node, rows, args.sweep[0], progress=_progress)
            if args.plot:
                result = dataclasses.replace(result, plot=report_mod.plot(result, args.plot))
            # The sweep's own verdict is its worst row's, and so is its exit code.
            print(json.dumps(result.as_dict(), indent=2, default=str) if args.json else report_mod.render_sweep(result))
            return result.verdict.code
        report = preflight.run(launch, node, device_rows=rows)
    except DcpDsparkError as exc:
        if args.json:
            # The same verdict on stdout for a script; the one-line error still goes to stderr.
            print(json.dumps({"verdict": verdict_mod.of_error(exc.exit_code, str(exc)).as_dict(), "error": str(exc)}, indent=2))
            exc.reported = True  # main prints the error line only
        raise
    print(json.dumps(report.as_dict(), indent=2, default=str) if args.json else report_mod.render(report))
    return report.verdict.code


def add_parser(sub) -> None:
    p = sub.add_parser(
        "preflight",
        help="will this launch pass sglang's validation and start, and how much pinned host memory will HiCache take (no GPU needed)",
        description="Runs the installed sglang's own argument resolution and host-pool builders on an emulated GPU node; with "
                    "no launch arguments, DeepSeek-V3 (its config.json, shipped in the package) with a dense DSparkDraftModel DSPARK draft "
                    "(the public Kimi-K3 DSPARK draft's geometry), "
                    + " ".join(preflight.DEFAULT_LAUNCH) + f" and {preflight.DEFAULT_DEVICE_ROWS:,} device rows per rank "
                    f"on an 8 x {preflight.DEFAULT_GPU} node. The exit code is the verdict (a sweep exits with its "
                    "worst).",
        epilog=exits.help_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print the report (or the error) as JSON on stdout")
    p.add_argument("--gpus", default=str(Node.gpus), metavar="N", help=f"GPUs on the target node (default {Node.gpus})")
    p.add_argument("--gpu-name", metavar="NAME",
                   help=f"the node's GPU part, as torch names it (default {Node.gpu_name!r}); it sets the compute capability "
                        f"and the memory per GPU, and so the attention backends sglang picks: one of "
                        f"{', '.join(p.key for p in gpus.PARTS)}")
    p.add_argument("--gpu-memory-gib", metavar="GIB", help="memory per GPU (default: the part's, e.g. "
                                                            f"{Node.gpu_memory_gib:g} for the {gpus.DEFAULT.key})")
    p.add_argument("--host-ram-gib", metavar="GIB",
                   help=f"host RAM of the target node (default {Node.host_ram_gib:g}, as on a DGX H200); "
                        "'local': what this machine has available now")
    p.add_argument("--device-rows", metavar="N", help="target device KV rows per rank (sglang logs max_total_num_tokens; default: an upper-bound "
                        f"estimate, or {preflight.DEFAULT_DEVICE_ROWS:,} for the default launch)")
    p.add_argument("--sweep", metavar="NAME=V1,V2,...", action="append",
                   help=f"judge the launch once per value of one option ({', '.join(sweep_mod.SWEEPABLE)}; at most "
                        f"{sweep_mod.MAX_SWEEP_VALUES} values, each once) and print one row per value")
    p.add_argument("--plot", metavar="FILE", help="with --sweep: write a chart of pinned host GiB per node, in the format its "
                                                  "name says (.png, .svg or .pdf; needs matplotlib: pip install 'sglang-dcp-dspark[plot]')")
    p.add_argument("launch", nargs=argparse.REMAINDER, help="-- followed by the sglang launch arguments")
    p.set_defaults(func=run)

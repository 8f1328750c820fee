"""The serving evidence the upstream PRs still need: GSM8K, accept length and TPOT at DCP 1 against DCP 8.

PENDING: no 8-GPU node has been lent to this project, so nothing here has run
on a GPU. The script is ready for the day one is; ``--plan`` (CPU, any machine)
prints what it would run, and ``test/project/test_serving_evidence.py`` checks
that plan and the report against hand-written results.

On one node of 8 GPUs (``--tp 8``), with sglang and the series or the plugin
installed, for each draft given (DSPARK, EAGLE3, NEXTN: the model's own MTP
layer) at ``--dcp-size`` 1 and 8, with flashinfer MLA as the attention backend,
with CUDA graphs and without (``--disable-cuda-graph``), it runs sglang's own
tools, one launch at a time:

1. ``python -m sglang.launch_server`` with the launch, until ``/health`` answers;
2. ``python -m sglang.test.few_shot_gsm8k``: its ``Accuracy:`` line (the
   script downloads GSM8K's test set unless ``--gsm8k-data`` names a copy);
3. ``python -m sglang.benchmark.serving`` on random prompts: its JSONL
   record's ``median_tpot_ms`` and ``accept_length`` (sglang reads the
   latter from ``/server_info``'s ``avg_spec_accept_length``).

The report compares each DCP 8 run with its DCP 1 twin (same draft, same
graph mode): the accuracy within ``--max-accuracy-drop`` (absolute), the accept
length at least ``--min-accept-ratio`` of DCP 1's, and the TPOT ratio, which is
reported, not judged. Results go to ``--out`` as ``results.json``, rewritten
after each run; ``--report FILE`` prints the report of a results file again.

    python tools/serving_evidence.py --plan --model-path deepseek-ai/DeepSeek-V3 --nextn
    python tools/serving_evidence.py --model-path MODEL --dspark-draft DIR --eagle3-draft DIR --nextn --out DIR

Exit status: 0 every DCP 8 run holds against its twin, 1 one does not (or a run
failed), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import textwrap
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

DCP_SIZES = (1, 8)
GRAPH_MODES = ("graph", "eager")


class EvidenceError(Exception):
    """Bad input or a run that could not be read: one line, with what fixes it."""


@dataclass(frozen=True)
class Run:
    draft: str  # DSPARK, EAGLE3 or NEXTN
    dcp: int
    graph: str  # "graph" or "eager"
    launch: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.draft.lower()}-dcp{self.dcp}-{self.graph}"


def drafts(args) -> dict[str, tuple[str, ...]]:
    """The speculative flags of each draft the reviewer gave, in the order the report uses."""
    given = {}
    if args.dspark_draft:
        given["DSPARK"] = ("--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", args.dspark_draft)
    if args.eagle3_draft:
        given["EAGLE3"] = ("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", args.eagle3_draft,
                           "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                           "--speculative-num-draft-tokens", "4")
    if args.nextn:
        given["NEXTN"] = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                          "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
    if not given:
        raise EvidenceError("no draft to run; expected --dspark-draft DIR, --eagle3-draft DIR or --nextn; fix: "
                            "python tools/serving_evidence.py --model-path MODEL --nextn")
    return given


def plan(args) -> list[Run]:
    runs = []
    for draft, flags in drafts(args).items():
        for graph in GRAPH_MODES:
            for dcp in DCP_SIZES:
                launch = ("--model-path", args.model_path, "--tp", "8", "--dcp-size", str(dcp),
                          "--attention-backend", "flashinfer", "--trust-remote-code", *flags)
                if args.hicache:
                    launch += ("--enable-hierarchical-cache",)
                if graph == "eager":
                    launch += ("--disable-cuda-graph",)
                runs.append(Run(draft, dcp, graph, launch))
    return runs


def commands(run: Run, args, port: int, out: Path) -> dict[str, list[str]]:
    """The three commands of a run, as they are run (``python`` is this interpreter)."""
    gsm8k = [sys.executable, "-m", "sglang.test.few_shot_gsm8k", "--port", str(port),
             "--num-questions", str(args.num_questions), "--parallel", "64"]
    if args.gsm8k_data:
        gsm8k += ["--data-path", args.gsm8k_data]
    return {
        "server": [sys.executable, "-m", "sglang.launch_server", *run.launch, "--port", str(port)],
        "gsm8k": gsm8k,
        "tpot": [sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang", "--base-url",
                 f"http://127.0.0.1:{port}", "--dataset-name", "random", "--random-input-len", "1024",
                 "--random-output-len", "256", "--num-prompts", "64", "--max-concurrency", "16",
                 "--output-file", str(out / f"{run.name}.jsonl")],
    }


ACCURACY = re.compile(r"^Accuracy: ([0-9.]+)$", re.M)


def read_accuracy(text: str) -> float:
    found = ACCURACY.findall(text)
    if not found:
        raise EvidenceError("few_shot_gsm8k printed no 'Accuracy:' line; expected sglang's GSM8K output; fix: run "
                            "its command by hand and read its error")
    return float(found[-1])


def read_tpot(path: Path) -> tuple[float, float | None]:
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] if path.is_file() else []
    if not lines:
        raise EvidenceError(f"{path.name}: no record of sglang.benchmark.serving; expected its --output-file JSONL; "
                            "fix: run its command by hand and read its error")
    record = json.loads(lines[-1])
    return float(record["median_tpot_ms"]), record.get("accept_length")


def _wait_healthy(port: int, server: subprocess.Popen, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise EvidenceError(f"the server exited with {server.returncode} before /health answered; fix: read its "
                                "log beside results.json")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(5)
    raise EvidenceError(f"/health did not answer within {limit_s:.0f} s; fix: raise --start-timeout-s")


def measure(run: Run, args, out: Path) -> dict:
    cmds = commands(run, args, args.port, out)
    with open(out / f"{run.name}.server.log", "w", encoding="utf-8") as log:
        server = subprocess.Popen(cmds["server"], stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(args.port, server, args.start_timeout_s)
            gsm8k = subprocess.run(cmds["gsm8k"], capture_output=True, text=True, check=False)
            accuracy = read_accuracy(gsm8k.stdout)
            subprocess.run(cmds["tpot"], capture_output=True, text=True, check=False)
            tpot, accept = read_tpot(out / f"{run.name}.jsonl")
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
    return {"accuracy": accuracy, "median_tpot_ms": tpot, "accept_length": accept}


def report(results: dict[str, dict], max_drop: float, min_ratio: float) -> tuple[list[str], bool]:
    """One line per DCP 8 run against its DCP 1 twin, and whether every one holds."""
    lines, ok = [], True
    for name, got in results.items():
        if "-dcp8-" not in name:
            continue
        twin = results.get(name.replace("-dcp8-", "-dcp1-"))
        if twin is None or "error" in got or "error" in twin:
            lines.append(f"{name}: not compared ({got.get('error') or (twin or {}).get('error') or 'no dcp 1 run'})")
            ok = False
            continue
        drop = twin["accuracy"] - got["accuracy"]
        held = drop <= max_drop
        text = f"GSM8K {got['accuracy']:.3f} (dcp 1 {twin['accuracy']:.3f})"
        if twin.get("accept_length") and got.get("accept_length") is not None:
            ratio = got["accept_length"] / twin["accept_length"]
            held = held and ratio >= min_ratio
            text += f", accept length {got['accept_length']:.2f} ({twin['accept_length']:.2f})"
        text += f", TPOT x{got['median_tpot_ms'] / twin['median_tpot_ms']:.2f}"
        lines.append(f"{name}: {'holds' if held else 'FAILS'}: {text}")
        ok = ok and held
    return lines, ok


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="serving_evidence", description=__doc__.split("\n")[0])
    p.add_argument("--model-path", help="the target (DeepSeek-V3 or a Kimi model, MLA)")
    p.add_argument("--dspark-draft", metavar="DIR")
    p.add_argument("--eagle3-draft", metavar="DIR")
    p.add_argument("--nextn", action="store_true", help="the model's own MTP layer as draft")
    p.add_argument("--hicache", action="store_true", help="with --enable-hierarchical-cache")
    p.add_argument("--num-questions", type=int, default=500)
    p.add_argument("--gsm8k-data", metavar="FILE")
    p.add_argument("--max-accuracy-drop", type=float, default=0.03)
    p.add_argument("--min-accept-ratio", type=float, default=0.95)
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--start-timeout-s", type=float, default=1800)
    p.add_argument("--out", metavar="DIR", default="build/gpu/serving-evidence")
    p.add_argument("--plan", action="store_true", help="print the runs and their commands, run nothing")
    p.add_argument("--report", metavar="FILE", help="print the report of a results.json again")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    try:
        args = parse(argv)
        if args.report:
            results = json.loads(Path(args.report).read_text(encoding="utf-8"))
            lines, ok = report(results, args.max_accuracy_drop, args.min_accept_ratio)
            print("\n".join(lines))
            return 0 if ok else 1
        if not args.model_path:
            raise EvidenceError("no --model-path; expected the target model (a directory or a Hugging Face id); "
                                "fix: python tools/serving_evidence.py --model-path deepseek-ai/DeepSeek-V3 --nextn")
        out = Path(args.out)
        runs = plan(args)
        if args.plan:
            for run in runs:
                line = " ".join(["python", *commands(run, args, args.port, out)["server"][1:]])
                print(textwrap.fill(line, 100, initial_indent=f"{run.name}: ", subsequent_indent="    ",
                                    break_on_hyphens=False, break_long_words=False))
            return 0
        out.mkdir(parents=True, exist_ok=True)
        results: dict[str, dict] = {}
        for run in runs:
            try:
                results[run.name] = {**measure(run, args, out), "launch": list(run.launch)}
            except EvidenceError as exc:
                results[run.name] = {"error": str(exc), "launch": list(run.launch)}
            (out / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        lines, ok = report(results, args.max_accuracy_drop, args.min_accept_ratio)
        print("\n".join(lines))
        return 0 if ok else 1
    except EvidenceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}; expected a readable results.json; fix: pass the file --out wrote", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

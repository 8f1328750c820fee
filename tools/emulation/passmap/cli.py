"""The pass map's command: ``python -m emulation.passmap``.

Usage: PYTHONPATH=build/trees/sglang-X python -m emulation.passmap [--write | --check | --json]
       [--control shift-write,no-translate,shift-mha-write,no-lse [--check]]  (the negative controls, and the
       check, as one JSON line)
       [--fix plugin|upstream-next [--write | --check | --json]]  (the verify with the fix)
"""

from __future__ import annotations

import json

from emulation.passmap import plain
from emulation.passmap.cases import measure
from emulation.passmap.controls import CONTROL_CASES, PLAIN_CONTROLS, control
from emulation.passmap.fixed import fixed_key, fixed_markdown, fixed_records
from emulation.passmap.harness import prepare, release
from emulation.passmap.probes import probe_trtllm_mla_target, probes
from emulation.passmap.report import DATA, REPO, fresh, load, markdown, merge, write_data


def main(argv: list[str]) -> int:
    prepare()
    if "--fix" in argv:  # the verify with the fix in effect: written under "verify_fixed", or checked against it
        fix = argv[argv.index("--fix") + 1]
        records, rel = fixed_records(fix), release()
        data = load() or {}
        kept = [r for r in data.get("verify_fixed", []) if (r["release"], r["fix"]) != (rel, fix)]
        committed = sorted([r for r in data.get("verify_fixed", []) if (r["release"], r["fix"]) == (rel, fix)],
                           key=fixed_key)
        if "--json" in argv:
            print(json.dumps({"release": rel, "fix": fix, "verify_fixed": records, "matches": committed == sorted(
                records, key=fixed_key)}))
            return 0
        if "--check" in argv:
            ok = committed == sorted(records, key=fixed_key)
            print(f"sglang {rel} with {fix}: {'matches' if ok else 'DIFFERS FROM'} {DATA.relative_to(REPO)}")
            return 0 if ok else 1
        data["verify_fixed"] = sorted(kept + records, key=fixed_key)
        if "--write" in argv:
            write_data(data)
        print("\n".join(fixed_markdown(data["verify_fixed"])))
        return 0
    if "--control" in argv:  # negative controls (comma-separated) on NEXTN at dcp 2 and 8: {name: records}
        out, plain_out = {}, {}
        for name in argv[argv.index("--control") + 1].split(","):
            with control(name):
                out[name] = measure(dcp_sizes=(2, 8), only=CONTROL_CASES[name]) if CONTROL_CASES[name] else []
                if name in PLAIN_CONTROLS:
                    plain_out[name] = [plain.plain_case("flashinfer_mla", dcp, rank) for dcp in (2, 8)
                                       for rank in (0, dcp - 1)]
        result = {"release": release(), "controls": out, "plain_controls": plain_out,
                  "probe_control": probe_trtllm_mla_target(dcp=1)}
        if "--check" in argv:  # the freshness check in the same process (one sglang import for both)
            result["check"] = fresh(measure(), probes(), release(), plain.measure())
        print(json.dumps(result))
        return 0
    records, probe_records, plain_records = measure(), probes(), plain.measure()
    rel = release()
    if "--json" in argv:
        print(json.dumps({"cases": records, "probes": probe_records, "plain": plain_records}, indent=1))
        return 0
    if "--check" in argv:
        ok = fresh(records, probe_records, rel, plain_records)
        print(f"sglang {rel}: {'matches' if ok else 'DIFFERS FROM'} {DATA.relative_to(REPO)}")
        return 0 if ok else 1
    data = merge(load(), records, probe_records, rel, plain_records)
    if "--write" in argv:
        write_data(data)
    print(markdown({"cases": records, "probes": probe_records, "plain": plain_records}))
    return 0

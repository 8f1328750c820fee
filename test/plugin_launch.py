"""Child process for test/plugin/test_kv_cache_dtype.py: sglang's own ``prepare_server_args`` after ``load_plugins()``.

On whichever sglang PYTHONPATH selects, in a fresh interpreter, as
``launch_server`` does it: server_args imported, ``load_plugins()``, then each
launch resolved by ``prepare_server_args`` (and, from 0.5.19, ``resolve_once``,
which the launcher calls) on an emulated GPU node (the probes argument
resolution asks, answered by preflight's ``emulated_node``).

Usage: plugin_launch.py GPU_NAME JSON, where JSON is a list of launches (each a
list of arguments). Prints one JSON line: per launch, "passes" or
"rejected: <exception type>: <message>", and the plugin's findings.
"""

from __future__ import annotations

import json
import sys


def resolve(argv: list[str], gpu_name: str) -> str:
    from sglang.srt.server_args import prepare_server_args

    from sglang_dcp_dspark.preflight.check import Node, emulated_node

    try:
        with emulated_node(Node.of_part(gpu_name)):
            server_args = prepare_server_args(argv)
            resolve_once = getattr(server_args, "resolve_once", None)  # 0.5.19 on: the launcher resolves later
            if resolve_once is not None:
                resolve_once()
    except Exception as exc:  # sglang refuses with ValueError, NotImplementedError, asserts, ...
        return f"rejected: {type(exc).__name__}: {exc}"
    return "passes"


def main(gpu_name: str, launches: list[list[str]]) -> None:
    # Imported before the node is emulated, so their module-level CUDA checks stay false (docs: domain notes).
    import sglang.srt.configs.model_config
    import sglang.srt.layers.quantization  # noqa: F401
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang_dcp_dspark import plugin

    outcomes = [resolve(argv, gpu_name) for argv in launches]
    print(json.dumps({"outcomes": outcomes, "findings": {k: v.verdict.name for k, v in plugin.findings.items()}}))


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))

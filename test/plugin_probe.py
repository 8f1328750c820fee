"""Child process for test_plugin: what sglang does after load_plugins() in a fresh interpreter.

Prints one JSON line. Run as a script so that multiprocessing's spawn start
method can re-import it in the grandchild, the way sglang starts schedulers.
"""

from __future__ import annotations

import json
import multiprocessing
import sys


def registration_coverage(dcp: int = 8) -> dict:
    import hostpool
    from sglang_dcp_dspark import plugin

    pair = hostpool.build_pools(hostpool.Geometry(dcp))
    return {
        "coverage": pair.coverage,
        "out_of_bounds": pair.out_of_bounds_slots(),
        "findings": {k: v.verdict.name for k, v in plugin.findings.items()},
    }


def scheduler_like(queue) -> None:
    # sglang's scheduler module imports kv_cache_builder, then its process
    # entry point calls load_plugins() before building the KV cache.
    from sglang.srt.mem_cache import kv_cache_builder  # noqa: F401
    from sglang.srt.plugins import load_plugins

    load_plugins()
    queue.put(registration_coverage())


def launch(model: str, algorithm: str) -> str:
    from sglang.srt.server_args import prepare_server_args

    from sglang_dcp_dspark.preflight.check import Node, emulated_node

    try:
        # 8 x B200 on cutedsl_mla, the probes argument resolution asks: PR #35221's validated shape (on an H200
        # sglang picks fa3, which the plugin's argument check refuses under DCP)
        with emulated_node(Node.of_part("NVIDIA B200")):
            prepare_server_args(["--model-path", model, "--device", "cuda", "--tp", "8", "--dcp-size", "8",
                                 "--enable-hierarchical-cache", "--speculative-algorithm", algorithm,
                                 "--speculative-draft-model-path", model, "--attention-backend", "cutedsl_mla"])
        return "passes"
    except NotImplementedError as exc:
        return f"rejected: {exc}"


def main(model: str, spawn: bool) -> None:
    import logging
    from types import SimpleNamespace

    # Collect the plugin's own log lines; sglang's go to the parent's stderr.
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(f"{record.levelname} {record.getMessage()}")
    logging.getLogger("sglang_dcp_dspark").addHandler(handler)
    logging.getLogger("sglang_dcp_dspark").setLevel(logging.INFO)

    # As launch_server does: server_args imported, then load_plugins().
    import sglang.srt.configs.model_config
    import sglang.srt.layers.quantization  # noqa: F401
    from sglang.srt.plugins import load_plugins

    load_plugins()
    # As _launch_subprocesses does next; the plugin writes its decisions now.
    from sglang.srt.utils.common import configure_logger

    configure_logger(SimpleNamespace(log_level="info"))
    result = {"dspark": launch(model, "DSPARK"), "eagle": launch(model, "EAGLE")}
    # kv_cache_builder is imported only now, after load_plugins().
    result["late_import"] = registration_coverage()
    if spawn:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=scheduler_like, args=(queue,))
        child.start()
        result["spawned_scheduler"] = queue.get(timeout=300)
        child.join(timeout=60)
    from sglang_dcp_dspark import plugin

    if plugin.findings:  # loaded by load_plugins(): a second register() decides and logs nothing new
        plugin.register()
    result["plugin_log"] = lines
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], spawn="--spawn" in sys.argv[2:])

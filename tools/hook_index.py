"""docs/patches.md's hook index: the plugin's hook table as a document, one entry per hook, in table order.

Each entry says what vllm-ascend's patch index says of a patch, from the
fields the carrier declares beside its code (``plugin/hooks/<carrier>.py``):
the sglang target, what the hook does, why it is needed, where the same change
stands upstream, when to drop it, and the series patch that carries the same
change for a tree. The judge and the hook are named from the functions the
entry holds, so a renamed function renames its line here.

    python tools/hook_index.py      # the block, as docs/patches.md has it
    python tools/docblocks.py --write hook-index

test/project/test_docs.py checks that the block is what this prints now.
"""

from __future__ import annotations

import sys


def markdown(hooks) -> str:
    out = []
    for number, hook in enumerate(hooks, 1):
        module_path = hook.module.replace(".", "/") + ".py"
        target = hook.target.removeprefix(hook.module + ".")
        head = f"{number}. "
        pad = " " * len(head)  # a sub-list nests under its item only when indented to the item's text
        out += [
            f"{head}**`{target}`** in `python/{module_path}`",
            f"{pad}- **Carrier:** `plugin/hooks/{hook.carrier}.py`: judge `{hook.judge.__name__}`, "
            f"hook `{hook.hook.__name__}` (AROUND)"
            + (f", check-only hook from `{hook.check_only_if.__name__}`" if hook.check_only_if else "")
            + (f", on install `{hook.on_install.__name__}`" if hook.on_install else "") + ".",
            f"{pad}- **Does:** {hook.does}.",
            f"{pad}- **Why:** {hook.why}.",
            f"{pad}- **Upstream:** {hook.upstream}.",
            f"{pad}- **Drop when:** {hook.drop_when}.",
            f"{pad}- **Series patch:** `{hook.series_patch}`.",
        ]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if argv:
        print("usage: python tools/hook_index.py", file=sys.stderr)
        return 2
    from sglang_dcp_dspark.plugin import hooks

    sys.stdout.write(markdown(hooks.HOOKS))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

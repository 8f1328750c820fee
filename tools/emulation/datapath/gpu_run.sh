#!/usr/bin/env bash
# On a GPU machine, from the repository root, with build/gpu made by
# `make gpu-bundle` carried along: install the bundle into a scratch directory
# and run gpu_check.py on three trees at dcp 8. Stock 0.5.17 is expected to
# fail every case with DraftHostOverflow; the series and the plugin to pass.
# Logs go to $OUT when it is set (the device tool's return folder), else to
# build/gpu/logs.
set -u
export PYTHONUNBUFFERED=1
BUNDLE=build/gpu
LOGS=${OUT:-$BUNDLE/logs}
SITE=$(mktemp -d)/site
PATCHED=$(dirname "$SITE")/patched
mkdir -p "$LOGS" "$PATCHED"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
    $(ls "$BUNDLE"/whl/*.whl | grep -v '/sglang-') || { echo "gpu-run: installing the bundle failed"; exit 2; }
# sglang's wheel is tagged for another Python; its modules on this path are pure Python.
python3 -m zipfile -e "$BUNDLE"/whl/sglang-*.whl "$SITE" || exit 2
cp -r "$SITE/sglang" "$PATCHED/" && cp -r "$BUNDLE/overlay/sglang/." "$PATCHED/sglang/"
nvidia-smi -L 2>/dev/null
status=0
run() {
    local label=$1 expect=$2; shift 2
    echo "=== $label (expected: $expect)"
    "$@" > "$LOGS/$label.log" 2>&1
    local rc=$?
    grep -E '^(gpu-check|dcp)' "$LOGS/$label.log" | cut -c1-200
    echo "=== $label exit $rc"
    if [ "$expect" = pass ] && [ $rc -ne 0 ]; then status=1; fi
    if [ "$expect" = overflow ] && ! grep -q DraftHostOverflow "$LOGS/$label.log"; then status=1; fi
}
# No venv there: PYTHONPATH names tools/ (the emulation library) and the sglang under test, as `make gpu-check` does.
run series pass env PYTHONPATH="tools:$PATCHED:$SITE" python3 -m emulation.datapath.gpu_check
run plugin pass env PYTHONPATH="python:tools:$SITE" python3 -c "import runpy, sys; sys.argv = ['gpu_check']; from sglang_dcp_dspark import plugin; plugin.register(); runpy.run_module('emulation.datapath.gpu_check', run_name='__main__')"
run stock overflow env PYTHONPATH="tools:$SITE" python3 -m emulation.datapath.gpu_check
exit $status

#!/usr/bin/env bash
# On a GPU machine, from the repository root: tools/emulation/mla/gpu_verify.py, the verify under DCP on
# flashinfer's own MLA kernel (docs/verify-under-dcp.md, "On a GPU"), in under 8 minutes. A machine with torch
# but neither flashinfer 0.7.2 nor sglang gets build/gpu-verify from `make gpu-bundle-verify` carried along: its
# wheels are installed into a scratch directory, and its sglang/ (sglang 0.5.23's DCP index builder, alone) goes
# on the path. flashinfer builds its MLA kernel on first use, which needs nvcc (CUDA_HOME, or on PATH).
# The report goes to stdout and gpu_verify.log, its JSON to gpu_verify.json: in $OUT when it is set (the device
# tool's return folder), else in build/gpu/logs. Exit status: gpu_verify.py's (0 every part passes, 1 a part
# did not, 2 no GPU, flashinfer or builder), 124 when the whole run outlasted GPU_VERIFY_LIMIT_S (450).
set -u
export PYTHONUNBUFFERED=1
BUNDLE=build/gpu-verify
LOGS=${OUT:-build/gpu/logs}
LIMIT=${GPU_VERIFY_LIMIT_S:-450}
mkdir -p "$LOGS"
LOG=$LOGS/gpu_verify.log
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$LOG" 2>&1
cat "$LOG"
path=python:tools
if [ -d "$BUNDLE/sglang/sglang" ]; then path="$path:$BUNDLE/sglang"; fi
wheels=$(ls "$BUNDLE"/flashinfer/*.whl "$BUNDLE"/deps/*.whl 2>/dev/null)
if [ -n "$wheels" ]; then
    SITE=$(mktemp -d)/site
    # shellcheck disable=SC2086  # one argument per wheel
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" $wheels 2>&1 \
        | tee -a "$LOG"
    if [ "${PIPESTATUS[0]}" != 0 ]; then echo "gpu-verify-run: installing build/gpu-verify failed" | tee -a "$LOG"; exit 2; fi
    path="$path:$SITE"
    export PATH="$SITE/bin:$PATH"  # for a ninja carried along; flashinfer's JIT build runs it
fi
timeout -k 10 "$LIMIT" env PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}" \
    python3 tools/emulation/mla/gpu_verify.py --json "$LOGS/gpu_verify.json" "$@" 2>&1 | tee -a "$LOG"
status=${PIPESTATUS[0]}
if [ "$status" = 124 ]; then
    echo "gpu-verify-run: stopped after $LIMIT s; the JSON holds the parts that finished" | tee -a "$LOG"
fi
exit "$status"

#!/bin/sh
# On the GPU machine (docs/gpu.md): check the environment, run the pack made by `make gpu-pack`,
# and leave the result and the log in OUTDIR. Needs only that machine's python3 (torch, CuPy).
# Usage: sh scripts/gpu-run.sh [PACKDIR] [OUTDIR] [BUDGET_SECONDS]
set -u
PACK=${1:-gpu-pack}
OUTDIR=${2:-.}
BUDGET=${3:-360}
export PYTHONUNBUFFERED=1
mkdir -p "$OUTDIR"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  lscpu | grep -E '^(Model name|CPU\(s\)|Flags)' | cut -c1-400
} > "$OUTDIR/machine.txt" 2>&1
cat "$OUTDIR/machine.txt" | cut -c1-200
python3 "$PACK/run.py" --selftest 2>&1 | tail -15
# The run's own budget leaves time to write the result inside the caller's limit.
python3 "$PACK/run.py" "$PACK" --out "$OUTDIR/result.json" --budget-seconds "$BUDGET" 2>&1 | tee "$OUTDIR/run.log" | tail -70

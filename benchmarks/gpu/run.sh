#!/usr/bin/env bash
# The GPU part of the syncfree bench matrix: one H200, at most 8 minutes. Usage:
#   benchmarks/gpu/run.sh OUT_DIR
# Works with the GPU image's own torch and transformers (syncfree runs from src/, nothing is installed),
# and with newer ones. Writes OUT_DIR/bench-gpu.{json,csv,png}, bench-gpu-compiled.*, cross_check.json.
set -euo pipefail
out=${1:?usage: benchmarks/gpu/run.sh OUT_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$root"
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
# 1. The matrix, eager execution: every scenario, stock vs patched, SDPA and eager attention, bf16.
timeout 330 python -m syncfree.cli bench --device cuda --dtype bfloat16 \
  --models qwen3-vl-2b qwen3-vl-8b qwen2.5-vl-7b --attn sdpa eager --repeats 10 --budget 3 \
  --out "$out" --name bench-gpu || echo "bench-gpu: stopped early (exit $?)"
# 2. torch.compile of the vision tower, on the shapes where launch overhead matters most.
timeout 90 python -m syncfree.cli bench --device cuda --dtype bfloat16 --models qwen3-vl-8b \
  --scenarios image-448 images-8x224 --scopes vision --compile --repeats 10 --budget 3 \
  --out "$out" --name bench-gpu-compiled || echo "bench-gpu-compiled: stopped early (exit $?)"
# 3. The emulated auditor against the real device: syncs by source line, scenario by scenario.
timeout 60 python benchmarks/gpu/cross_check.py --out "$out/cross_check.json" || echo "cross_check: stopped early"

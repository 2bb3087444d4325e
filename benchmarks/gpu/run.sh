#!/usr/bin/env bash
# The GPU part of the syncfree bench matrix: one H200, at most 505 s of step caps (about 8.5 minutes). Usage:
#   benchmarks/gpu/run.sh OUT_DIR
# Works with the GPU image's own torch and transformers (syncfree runs from src/, nothing is installed),
# and with newer ones. Writes into OUT_DIR: cross_check.json, bench-gpu.{json,csv,png},
# bench-gpu-train.{json,csv,png}, packing-gpu.json, bench-gpu-compiled.{json,csv,png}, vision_backends.json,
# bench-gpu-whole-compiled.{json,csv,png}, compile_stream_gpu.json, attention_crossover-cuda.{json,png},
# liger_syncfree.json and log.txt,
# and all of them in one gpu-results.tgz (for a caller that fetches only a few files from OUT_DIR).
#
# Each step has a deadline inside its timeout: the bench starts no new scenario past its deadline and
# rewrites its JSON after every scenario, so a step cut short still leaves what it measured. A failing
# scenario is recorded in the JSON ("errors") and the run goes on; a step that fails or runs past its cap
# ends alone (its exit status is logged) and the next step starts. Caps: 10 + 80 + 80 + 30 + 30 + 90 + 90 + 30 + 50
# + 20 + 15 = 525 s (the compile steps have the most: a cold machine compiles for a minute before the first repeat).
set -uo pipefail
out=${1:?usage: benchmarks/gpu/run.sh OUT_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-$(command -v python3 || command -v python)}
cd "$root"
if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "benchmarks/gpu/run.sh: no CUDA device here (torch.cuda.is_available() is false): this script measures a" \
       "real GPU. Without one, syncfree audit and syncfree bench measure on the emulated device." >&2
  exit 2
fi
step() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }

run_all() {
step "versions"
timeout 10 "$py" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"

# 1. The emulated auditor against the real device, syncs by source line (all four families, tiny shapes).
step "cross-check: emulated vs real CUDA"
timeout 80 "$py" benchmarks/gpu/cross_check.py --timeout 65 --out "$out/cross_check.json" \
  || echo "cross-check: exit $? (1 = lines differ or a pair failed; 124 = timeout)"

# 2. The matrix, eager execution: every scenario, stock vs patched, bf16, with SDPA, then PyTorch's varlen
#    flash kernel in the vision tower (flash-attn is not on the image), then eager attention; the deadline
#    cuts from the end. Graph breaks are left to the CPU run (they do not depend on the device).
step "bench: the matrix"
timeout 80 "$py" -m syncfree.cli bench --device cuda --dtype bfloat16 \
  --models qwen3-vl-2b qwen3-vl-8b qwen2.5-vl-7b --attn sdpa varlen eager --repeats 10 --budget 3 \
  --deadline 50 --keep-going --no-graph-breaks --out "$out" --name bench-gpu \
  || echo "bench-gpu: exit $? (1 = some scenario failed, see errors in the JSON; 124 = timeout)"

# 2b. A training step (forward with labels, backward, optimizer step), stock vs patched: step time and
#     syncs by phase on the real device (2B shapes, text shortened to 2 layers, one 448 px image).
step "bench: training step"
timeout 30 "$py" -m syncfree.cli bench --device cuda --dtype bfloat16 --models qwen3-vl-2b \
  --scenarios image-448 --scopes train --repeats 5 --budget 2 \
  --deadline 5 --keep-going --no-graph-breaks --out "$out" --name bench-gpu-train \
  || echo "bench-gpu-train: exit $? (1 = the scenario failed; 124 = timeout)"

# 2c. Packed batches: the same samples padded 4 to a batch on stock against packed by syncfree.packing_collator
#     (rows of at most 2048 tokens) on the patched model, training-step and forward tokens/s (benchmarks/packing.py:
#     2B shapes, text shortened to 2 layers, text of 16-512 tokens and 0-4 images a sample, bf16). Flash attention
#     where the installed Transformers has it (the flash-attn package, or the hub kernel from the local cache: the
#     packed rows' boundaries go to its variable-length arguments), SDPA otherwise; the JSON says which ran and why
#     the others were passed over. A failing group is recorded under "errors" and the run goes on.
step "bench: packed vs padded batches"
HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} timeout 30 "$py" benchmarks/packing.py --device cuda --dtype bfloat16 \
  --attn flash_attention_2 sdpa --steps 8 --repeats 3 --deadline 18 --out "$out/packing-gpu.json" \
  || echo "packing: exit $? (1 = a group failed, a flash warm-up before SDPA too: see errors in the JSON; 124 = timeout)"

# 3. torch.compile of the vision tower, where launch overhead matters most (many small images).
step "bench: compiled vision tower"
timeout 90 "$py" -m syncfree.cli bench --device cuda --dtype bfloat16 --models qwen3-vl-2b \
  --scenarios images-8x224 --scopes vision --compile --repeats 10 --budget 3 \
  --deadline 50 --keep-going --no-graph-breaks --out "$out" --name bench-gpu-compiled \
  || echo "bench-gpu-compiled: exit $? (1 = some scenario failed; 124 = timeout)"

# 3b. The whole model compiled with CUDA graphs (mode="reduce-overhead"): stock as Transformers compiles it
#     (fullgraph=False), patched and prepared as one graph; prefill and a training step, 2B shapes, 2 text layers.
step "bench: whole model compiled, CUDA graphs"
timeout 90 "$py" -m syncfree.cli bench --device cuda --dtype bfloat16 --models qwen3-vl-2b \
  --scenarios image-448 --scopes full train --compile --compile-mode reduce-overhead --repeats 10 --budget 3 \
  --deadline 30 --keep-going --no-graph-breaks --out "$out" --name bench-gpu-whole-compiled \
  || echo "bench-gpu-whole-compiled: exit $? (1 = some cell failed; 124 = timeout)"

# 3c. A stream of 6 varied image batches through one compiled model with CUDA graphs (mode="reduce-overhead",
#     tiny Qwen3-VL, bf16): patched with syncfree.Buckets (a few static shapes), patched, then stock; graphs, compile
#     seconds, and real tokens per second over a second pass. The JSON is rewritten after each run.
step "compile stream: reduce-overhead, buckets"
timeout 30 "$py" benchmarks/compile_stream.py --families qwen3_vl --batches 6 --device cuda --dtype bfloat16 \
  --mode reduce-overhead --buckets --passes 2 --out "$out/compile_stream_gpu.json" \
  || echo "compile-stream: exit $? (124 = timeout: the JSON keeps the runs done)"

# 4. The vision attention backends and the bucketed CUDA-graph tower (8B vision shape, bf16): stock, split,
#    grouped, varlen, compile_vision; latency, GPU-busy fraction and kernel counts per cell.
step "vision backends and bucketed CUDA graphs"
timeout 50 "$py" benchmarks/gpu/vision_backends.py --model qwen3-vl-8b --dtype bfloat16 --repeats 10 \
  --deadline 35 --out "$out/vision_backends.json" \
  || echo "vision-backends: exit $? (1 = some cell failed, see errors in the JSON; 124 = timeout)"

# 5. The backends' crossover grid on the GPU (2B/8B vision attention, 1-64 segments, 1k-16k patches, bf16):
#    split, grouped, block_diagonal, varlen; time and the allocator's peak memory per cell.
step "attention backend crossover"
timeout 20 "$py" benchmarks/attention_crossover.py --device cuda --dtype bfloat16 --repeats 5 --cell-budget 0.2 \
  --out-dir "$out" || echo "crossover: exit $? (124 = timeout)"
# 6. Liger-Kernel's fused-loss forward alone, then with syncfree: equal loss, syncs and step time (records why it
#    did not run where liger-kernel is missing or cannot patch the installed Transformers).
step "Liger-Kernel alone vs Liger + syncfree"
timeout 15 "$py" benchmarks/gpu/liger_syncfree.py --out "$out/liger_syncfree.json" \
  || echo "liger-syncfree: exit $? (1 = a variant failed or Liger is not usable here; 124 = timeout)"
step "done"
ls -l "$out"
}

run_all 2>&1 | tee -a "$out/log.txt"  # a pipe, not exec: the log is complete when the script returns
tar czf "$out/gpu-results.tgz" -C "$out" --exclude gpu-results.tgz . 2>/dev/null || true

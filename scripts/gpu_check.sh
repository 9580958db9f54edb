#!/usr/bin/env bash
# The checks that need a GPU, in one command, from the repository root of a machine with CUDA:
#
#     bash scripts/gpu_check.sh [OUT_DIR]        # OUT_DIR holds target.pt (draft.pt, medusa.pt); default out
#
#   1. the Triton attention kernel compiled for the GPU, checked against the PyTorch reference
#      (the tests run it under Triton's interpreter on a CPU; only a GPU runs the compiled kernel);
#   2. the kernel timed beside PyTorch's scaled_dot_product_attention (kernels/bench.py);
#   3. every method side by side on the GPU, greedy and at temperature 1 (bench.py --device cuda);
#   4. the same on the compiled path (bench.py --compile; the first run compiles each pass size);
#   5. r(n) of random-weight GPT-2 shapes on the GPU (needs transformers: requirements-dev.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out}
python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device here')"
if [ ! -f "$out/target.pt" ]; then
    echo "gpu_check: no $out/target.pt: train first (python train.py --out-dir $out) or pass OUT_DIR" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python -m pytest -q tests/test_attention.py tests/test_triton_attention.py
python kernels/bench.py
python bench.py --out-dir "$out" --device cuda
python bench.py --out-dir "$out" --device cuda --temperature 1
python bench.py --out-dir "$out" --device cuda --compile
python bench.py --out-dir "$out" --device cuda --compile --temperature 1
for size in gpt2 gpt2-medium gpt2-large; do
    [ -f "$out/$size.pt" ] || { python -m scripts.random_gpt2 "$size" "$out/$size-hf" && python -m model.convert "$out/$size-hf" "$out/$size.pt"; }
done
python bench.py --out-dir "$out" --device cuda --profile "$out/target.pt" "$out/gpt2.pt" "$out/gpt2-medium.pt" "$out/gpt2-large.pt" --draft "$out/gpt2.pt"

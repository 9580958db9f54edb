#!/usr/bin/env bash
# The checks that need a GPU, in one command, from the repository root of a machine with CUDA:
#
#     bash scripts/gpu_check.sh [OUT_DIR [LOG_DIR]]   # OUT_DIR holds target.pt (draft.pt, medusa.pt, eagle.pt)
#     DATA=path/to/tinyshakespeare.txt bash scripts/gpu_check.sh   # where the checkpoints' own data path is absent
#
#   kernel    the Triton attention kernel compiled for the GPU against the PyTorch reference (the tests
#             run it under Triton's interpreter on a CPU; only a GPU runs the compiled kernel)
#   kernel-bench  the kernel timed beside PyTorch's scaled_dot_product_attention (kernels/bench.py, bf16)
#   bench     every method side by side on the GPU, greedy (bench.py --device cuda)
#   batch     plain and each method at batch sizes 1, 8 and 32 (bench.py --batch-sizes)
#   compiled  the same methods on the compiled path (bench.py --compile; each model's program compiles first)
#   train     a short run of the gpu preset: eager, compiled, and under torchrun (NCCL), tokens/s each
#   sizes     r(n) of random-weight GPT-2 shapes on the GPU (needs transformers: requirements-dev.txt)
#
# Each stage has a time limit, so the whole check ends within about 25 minutes (on an H200 most
# of it is compiling: Triton's kernels, inductor's passes; both are cached on disk); a stage that fails
# or runs out of time is reported at the end and the others still run. The benches decode 4 prompts
# of 128 tokens (SIZE="--num-prompts 8 --max-new-tokens 300" for bench.py's defaults). Each stage's
# output also goes to LOG_DIR/STAGE.log (default: OUT_DIR/gpu_check).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-out}
logs=${2:-$out/gpu_check}
python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device here')" || exit 2
if [ ! -f "$out/target.pt" ]; then
    echo "gpu_check: no $out/target.pt: train first (python train.py --out-dir $out) or pass OUT_DIR" >&2
    exit 2
fi
mkdir -p "$logs"
data=(${DATA:+--data "$DATA"})
size=(${SIZE:---num-prompts 4 --max-new-tokens 128})
failed=()

stage() {  # stage NAME SECONDS: runs the commands read from stdin under one time limit
    local name=$1 limit=$2 start=$SECONDS
    echo "== $name (at most ${limit} s)"
    timeout --kill-after 10 "$limit" bash -euo pipefail -s 2>&1 | tee "$logs/$name.log"
    local status=$?
    echo "== $name: $([ $status = 0 ] && echo ok || echo "FAILED (exit $status$([ $status = 124 ] && echo ', out of time'))") in $((SECONDS - start)) s"
    [ $status = 0 ] || failed+=("$name")
}

stage kernel 300 <<EOF
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python -m pytest -q -n 0 tests/test_attention.py tests/test_triton_attention.py  # one process: one GPU
EOF
stage kernel-bench 150 <<EOF
python kernels/bench.py --dtype bfloat16
EOF
stage bench 240 <<EOF
python bench.py --out-dir "$out" ${data[*]} ${size[*]} --device cuda
EOF
stage batch 180 <<EOF
python bench.py --out-dir "$out" ${data[*]} ${size[*]} --device cuda --num-prompts 32 --max-new-tokens 64 --batch-sizes 1 8 32 \
    --methods draft,prompt-lookup,medusa,eagle
EOF
stage train 150 <<EOF
args="--what target --preset gpu --max-iters 150 --eval-interval 75 --eval-iters 10 --log-interval 25 ${data[*]}"
python train.py \$args --out-dir "$out/gpu_check-train"
python train.py \$args --out-dir "$out/gpu_check-train-compiled" --compile
torchrun --standalone --nproc_per_node 1 train.py \$args --out-dir "$out/gpu_check-train-ddp"
EOF
stage compiled 180 <<EOF
python bench.py --out-dir "$out" ${data[*]} ${size[*]} --device cuda --compile --methods draft,prompt-lookup,medusa
EOF
stage sizes 180 <<EOF
for size in gpt2 gpt2-medium gpt2-large; do
    [ -f "$out/\$size.pt" ] || { python -m scripts.random_gpt2 "\$size" "$out/\$size-hf" && python -m model.convert "$out/\$size-hf" "$out/\$size.pt"; }
done
python bench.py --out-dir "$out" --device cuda --profile "$out/target.pt" "$out/gpt2.pt" "$out/gpt2-medium.pt" "$out/gpt2-large.pt" --draft "$out/gpt2.pt"
EOF

[ ${#failed[@]} = 0 ] && { echo "gpu_check: every stage passed"; exit 0; }
echo "gpu_check: failed: ${failed[*]}" >&2
exit 1

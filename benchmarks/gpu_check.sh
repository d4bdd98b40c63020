#!/usr/bin/env bash
# The GPU check, one command: benchmarks/gpu_check.sh OUTDIR
# (<= 8 minutes on one H200: the stages' time limits below add up to 480 s)
#
#   1. pytest -m gpu                      the CUDA tests (attention kernels; every trainer on the device in bf16)
#   2. benchmarks/bench_gpu.py --trl      posttrain against TRL on the same card, shapes and batches: SFT of a
#                                         GPT-2-small-shaped GPT (124M, seq 1024) and a Qwen2-0.5B-shaped HF model,
#                                         DPO steps, GRPO steps of 64 prompts x 8 samples x 128 new tokens
#   3. benchmarks/bench_attention.py      the attention table (D = 128, N = 2k and 16k, bf16, against SDPA)
#
# Writes OUTDIR/pytest_gpu.txt, OUTDIR/gpu_check.json + OUTDIR/gpu_check.md (the side-by-side table) and
# OUTDIR/attention.txt. Needs only torch (CUDA), triton and transformers installed: everything else (posttrain's
# own dependencies, peft, TRL, datasets, accelerate, pytest, hypothesis) comes from wheels in benchmarks/wheels/,
# installed without network. Fetch those beforehand, on a machine with network and the same Python version:
#
#   pip download --dest benchmarks/wheels numpy safetensors tqdm pyyaml regex matplotlib "peft>=0.13,<1" \
#       "trl==1.16.0" "datasets==5.2.0" "accelerate==1.16.0" "pytest>=7,<10" "hypothesis>=6.80,<7"
#   rm -f benchmarks/wheels/torch-* benchmarks/wheels/nvidia_* benchmarks/wheels/triton-*   # the GPU machine has its own
#
# PYTHON (default: python) picks the interpreter. A stage that fails or runs out of its time is reported and the
# next one still runs; the exit status is 1 when any stage failed.
set -uo pipefail

OUT=${1:?usage: benchmarks/gpu_check.sh OUTDIR}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PY=${PYTHON:-python}
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
status=0

stage() {  # stage NAME SECONDS COMMAND...: run with a time limit, tee its output to OUTDIR/NAME.txt
    local name=$1 limit=$2
    shift 2
    echo "== $name (at most ${limit}s)"
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || { echo "== $name: exit $rc"; status=1; }
}

if [ -d "$HERE/wheels" ]; then
    stage install 60 "$PY" -m pip install --no-index --find-links "$HERE/wheels" numpy safetensors tqdm pyyaml \
        regex matplotlib peft trl datasets accelerate pytest hypothesis
else
    echo "== no $HERE/wheels: using what is installed (see the header for the download command)"
fi
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())" \
    || { echo "gpu_check: needs a CUDA device"; exit 1; }

cd "$ROOT" || exit 1
stage pytest_gpu 150 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests
stage bench_gpu 210 "$PY" benchmarks/bench_gpu.py --out "$OUT" --trl --warmup 1 --steps 3
stage attention 60 "$PY" benchmarks/bench_attention.py --device cuda --sizes 2k,16k --heads 16 --head-dim 128 \
    --causal yes --repeats 3 --no-memory
echo "== done: $OUT/gpu_check.md"
exit $status

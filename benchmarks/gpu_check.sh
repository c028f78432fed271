#!/usr/bin/env bash
# GPU check for users with a CUDA GPU: dynlab's CUDA paths end to end in under 13 minutes.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]        # run from the repository root
#
# Needs: a Python environment with a CUDA build of torch already installed (this script
# never installs torch, so it cannot replace yours).  It then
#   1. installs dynlab with its test and gpu extras into that environment
#      (GPU_CHECK_MAMBA=1 first installs mamba-ssm against that torch, and tries causal-conv1d,
#      whose kernels mamba-ssm's fused paths need; their builds can take much longer and are
#      not counted in the 13 minutes);
#   2. runs the CUDA-marked tests and the Triton kernel tests (compiled, on the GPU);
#   3. runs `dynlab bench train --device cuda --json OUT/bench.json` (quick setting);
#   4. trains a slice of the group-tracking paper preset (tanh-rnn and mamba on S3, seed 0) and
#      prints its wall time and peak GPU memory; GPU_CHECK_FULL_PAPER=1 then trains the whole
#      paper preset (every model, group and seed; target <= 10 min on one H100; 900 s limit,
#      not counted in the 13 minutes);
#   5. runs benchmarks/gpu_compare.py --out OUT: dynlab's LM training against mamba-ssm's
#      MambaLMHeadModel, tokens/s and peak memory (a 130M-class Mamba-2 and Mamba-1 LM in bf16,
#      target >= 0.9x; a stack of 16 quick-preset models against 16 models one at a time,
#      target >= 5x); without mamba-ssm its side is skipped, and a missed target is reported
#      in the summary line, not counted as a failure (OUT/compare.json holds the rows);
# each step under its own time limit (100 + 80 + 60 + 90 + 150 + 300 s: 13 minutes at most);
#   6. with GPU_CHECK_CHECKPOINT=DIR (a Hugging Face Mamba/Mamba2 folder with its tokenizer.json)
#      and GPU_CHECK_SOURCE=TOKENS (a token folder of that tokenizer, `dynlab data prepare`):
#      paper B's Fig. 5 protocol (length-generalization --preset pretrained) on one seed with
#      the zero-state control and state passing for 5 of its 100 steps (lr GPU_CHECK_LR,
#      default 1.5e-4), evaluated to 32K tokens, under 600 s; it prints the slice's wall time
#      and the time it expects for the whole preset (3 seeds, 5 arms, 100 steps), scaled from
#      the slice (training time in proportion to the steps and arms, evaluation per model);
# and prints one summary line, e.g.
#   gpu_check: PASS tests 41 passed 0 failed | bench tanh-rnn 2.1e+07 tok/s 0.41 of gemm floor, mamba ... | paper slice 96 s
#     | compare lm-mamba2 0.93x of mamba-ssm (target 0.9x: PASS); ... | pretrained skipped (...) | total 512 s
# Exit code 0 only when every step passed.  Details are in OUT/*.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-check}"
mkdir -p "$out"
start=$SECONDS
status=PASS

if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: FAIL no CUDA device visible to torch (install a CUDA build of torch first)"
    exit 1
fi

# 1. install (no torch: keep the user's CUDA build)
if [ "${GPU_CHECK_MAMBA:-0}" = "1" ]; then
    # mamba-ssm builds against the installed torch (no build isolation, which would fetch
    # another torch); a source build can take far longer than the 13 minutes below
    if ! timeout 1800 pip install --quiet --no-build-isolation einops "mamba-ssm>=2.2" > "$out/install_mamba.log" 2>&1; then
        echo "gpu_check: FAIL mamba-ssm install (see $out/install_mamba.log)"
        exit 1
    fi
    # without causal-conv1d mamba-ssm runs its unfused paths (step 5 says so): tried, not required
    timeout 1800 pip install --quiet --no-build-isolation "causal-conv1d>=1.4" >> "$out/install_mamba.log" 2>&1 \
        || echo "gpu_check: causal-conv1d did not install (see $out/install_mamba.log); mamba-ssm runs unfused"
    start=$SECONDS
fi
if ! timeout 100 pip install --quiet -e ".[test,gpu]" > "$out/install.log" 2>&1; then
    echo "gpu_check: FAIL install (see $out/install.log)"
    exit 1
fi

# 2. CUDA-marked tests and the Triton kernel tests, compiled for the GPU
timeout 80 python -m pytest -q -p no:cacheprovider -m cuda tests > "$out/tests_cuda.log" 2>&1
rc_cuda=$?
timeout 60 python -m pytest -q -p no:cacheprovider tests/kernels/test_triton.py tests/kernels/test_mamba_ref.py > "$out/tests_triton.log" 2>&1
rc_triton=$?
count() { grep -Eo "[0-9]+ $1" "$out"/tests_*.log | awk -F: '{split($2, a, " "); s += a[1]} END {print s + 0}'; }
passed=$(count passed)
failed=$(( $(count failed) + $(count error) ))
# exit code 5 means no test was selected (no CUDA-marked test in this checkout)
if { [ $rc_cuda -ne 0 ] && [ $rc_cuda -ne 5 ]; } || [ $rc_triton -ne 0 ]; then status=FAIL; fi

# 3. training throughput on the GPU
bench="skipped"
if timeout 90 dynlab bench train --quick --device cuda --json "$out/bench.json" > "$out/bench.log" 2>&1; then
    bench=$(python - "$out/bench.json" <<'EOF'
import json, sys
res = json.load(open(sys.argv[1]))["results"]
print(", ".join(
    f"{r['arch']} {r['best_dynlab_tokens_per_s']:.2g} tok/s {r['fraction_of_floor']:.2f} of {r['floor_kind']} floor"
    for r in res
))
EOF
)
else
    bench="failed (see $out/bench.log)"
    status=FAIL
fi

# 4. a slice of the paper preset (GPU_CHECK_FULL_PAPER=1: the whole preset, target <= 10 min), with its peak memory
study_peak() {  # study_peak SECONDS ARGS...: `dynlab study group-tracking ARGS` in-process, then its peak GPU memory
    local limit=$1; shift
    timeout "$limit" python -c 'import sys, torch
from dynlab.cli import main
code = main(["study", "group-tracking", *sys.argv[1:]])
print(f"peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
sys.exit(code)' "$@"
}
t0=$SECONDS
if study_peak 150 --preset paper --models tanh-rnn,mamba --groups S3 --seeds 0 --device cuda --out "$out/runs" \
        --quiet > "$out/paper_slice.log" 2>&1; then
    slice="$((SECONDS - t0)) s, $(tail -1 "$out/paper_slice.log")"
else
    slice="failed or over 150 s (see $out/paper_slice.log)"
    status=FAIL
fi
if [ "${GPU_CHECK_FULL_PAPER:-0}" = "1" ]; then
    t0=$SECONDS
    if study_peak 900 --preset paper --models all --device cuda --out "$out/paper" --quiet > "$out/paper.log" 2>&1; then
        slice="$slice | whole paper preset $((SECONDS - t0)) s (target 600 s), $(tail -1 "$out/paper.log")"
    else
        slice="$slice | whole paper preset failed or over 900 s (see $out/paper.log)"
        status=FAIL
    fi
fi

# 5. dynlab against mamba-ssm (its side skipped without mamba-ssm; a missed target is reported, not a failure)
if timeout 300 python benchmarks/gpu_compare.py --out "$out" > "$out/compare.log" 2>&1; then
    compare=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["summary"])' "$out/compare.json")
else
    compare="failed or over 300 s (see $out/compare.log)"
    status=FAIL
fi

# 6. paper B's protocol on a pretrained checkpoint (only when given one)
pretrained="skipped (set GPU_CHECK_CHECKPOINT and GPU_CHECK_SOURCE)"
if [ -n "${GPU_CHECK_CHECKPOINT:-}" ] && [ -n "${GPU_CHECK_SOURCE:-}" ]; then
    t0=$SECONDS
    if timeout 600 dynlab study length-generalization --preset pretrained --checkpoint "$GPU_CHECK_CHECKPOINT" \
            --source "$GPU_CHECK_SOURCE" --lr "${GPU_CHECK_LR:-1.5e-4}" --seeds 0 --interventions state-passing \
            --steps 5 --device cuda --out "$out/pretrained" --quiet > "$out/pretrained.log" 2>&1; then
        pretrained=$(python - "$out/pretrained/length-generalization/dataset.nc" "$((SECONDS - t0))" <<'EOF'
import sys
import xarray as xr
ds = xr.open_dataset(sys.argv[1])
post = ds["phase"].values.astype(str) == "post"
train = float(ds["train_time"].values[post].sum())   # 2 arms x 5 steps
wall = float(sys.argv[2])
evaluate = max(wall - train, 0.0) / 3                 # the checkpoint and 2 arms, each evaluated once
full = 3 * (train / 2 * 5 * 100 / 5 + 6 * evaluate)  # 3 seeds x (5 arms x 100 steps + 6 evaluations)
print(f"{wall:.0f} s for the slice; expected for the whole preset about {full / 3600:.1f} h")
EOF
)
    else
        pretrained="failed or over 600 s (see $out/pretrained.log)"
        status=FAIL
    fi
fi

echo "gpu_check: $status tests $passed passed $failed failed | bench $bench | paper slice $slice | compare $compare | pretrained $pretrained | total $((SECONDS - start)) s"
[ "$status" = PASS ]

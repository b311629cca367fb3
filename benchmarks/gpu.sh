#!/usr/bin/env bash
# GPU figures for BENCHMARKS.md on one CUDA device: training step time and peak memory of nGPT vs
# GPT (bf16 autocast, eager and torch.compile) at the paper's 0.5B width with 8 of its 24 layers,
# context 1024 and 4096, batch 8; and the optimizer step on the full 0.5B nGPT (fp32 and bf16
# parameters). Every table goes to one markdown file and to stdout.
#
# Usage: bash benchmarks/gpu.sh [OUT.md]    (default benchmarks/results/gpu.md; 4.5 min on an H200 before the Triton contenders were added)
#
# Needs torch with CUDA, einops and geoopt; the project need not be installed (PYTHONPATH is set
# here). PYTHON picks the interpreter (default python3). Each benchmark run is stopped after
# LIMIT seconds (default 300); a run that fails or is stopped leaves a line in OUT.md, the
# others still run, and the script then exits 1.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_MD=${1:-benchmarks/results/gpu.md}
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
LIMIT=${LIMIT:-300}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

# Fail fast, before any work, when there is no GPU or a dependency is missing.
"$PYTHON" - <<'EOF' || exit 1
import importlib.util
import sys

try:
    import torch
except ImportError as e:
    sys.exit(f"benchmarks/gpu.sh: torch is not importable ({e})")
if not torch.cuda.is_available():
    sys.exit(
        f"benchmarks/gpu.sh: no CUDA device: torch {torch.__version__} (built with CUDA {torch.version.cuda}) "
        "reports torch.cuda.is_available() = False. Run it on a machine with an NVIDIA GPU and a CUDA build of torch."
    )
missing = [name for name in ("einops", "geoopt") if importlib.util.find_spec(name) is None]
if missing:
    sys.exit(f"benchmarks/gpu.sh: missing Python package(s): {', '.join(missing)} (pip install {' '.join(missing)})")
print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", file=sys.stderr)
EOF

mkdir -p "$(dirname "$OUT_MD")"
{
    echo "# GPU benchmarks"
    echo
    echo "\`bash benchmarks/gpu.sh\`, $(date -u +%Y-%m-%d), commit $(git describe --always --dirty 2>/dev/null || echo unknown)."
    echo "Model shape for step time and memory: the paper's 0.5B width (d_model 1024, 16 heads, d_MLP 4096,"
    echo "vocab 32000) with 8 of its 24 layers, batch 8; optimizer step: the full 0.5B nGPT."
    echo
} >"$OUT_MD"

FAILED=0
run() { # run one benchmark under the time limit; a failure is noted in the file and the rest go on
    echo "== $*" >&2
    local start=$SECONDS
    timeout --kill-after=15 "$LIMIT" "$PYTHON" "$@" --markdown "$OUT_MD"
    local rc=$?
    echo "== done in $((SECONDS - start)) s (exit $rc)" >&2
    if [ "$rc" -ne 0 ]; then
        FAILED=$((FAILED + 1))
        local why="failed (exit $rc)"
        [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && why="stopped after the $LIMIT s limit"
        printf '### not measured\n\n`python %s` %s.\n\n' "$*" "$why" >>"$OUT_MD"
    fi
}

SHAPE=(--size 0.5b --n-layers 8 --batch 8)
# --variants triton: nGPT with the Triton kernels of its element-wise operations, eager and compiled
run benchmarks/bench_step.py --device cuda --dtype bf16 "${SHAPE[@]}" --ctx 1024 --rounds 5 --steps 3 --warmup 2 --variants triton
run benchmarks/bench_memory.py --device cuda --dtype bf16 "${SHAPE[@]}" --ctx 1024 --compile --variants triton
run benchmarks/bench_optimizer.py --device cuda --dtype fp32 --size 0.5b --rounds 10 --steps 5
run benchmarks/bench_optimizer.py --device cuda --dtype bf16 --size 0.5b --rounds 10 --steps 5
run benchmarks/bench_step.py --device cuda --dtype bf16 "${SHAPE[@]}" --ctx 4096 --rounds 5 --steps 2 --warmup 2 --variants triton
run benchmarks/bench_memory.py --device cuda --dtype bf16 "${SHAPE[@]}" --ctx 4096 --variants triton

echo "all tables in $OUT_MD ($SECONDS s)" >&2
[ "$FAILED" -eq 0 ] || { echo "benchmarks/gpu.sh: $FAILED benchmark run(s) failed or were stopped" >&2; exit 1; }

#!/usr/bin/env bash
# Paper's parameter inspection (Fig. 4, 5, 6) and length extrapolation (App. A.7) on two tiny
# models trained side by side on tinyshakespeare (byte level, 800 steps, context 64).
# Usage: bash benchmarks/analysis.sh [OUT_DIR]     (default /tmp/spherenet_analysis; ~10 min on 2 CPU cores)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/spherenet_analysis}
DATA=${DATA:-../shared/data/tinyshakespeare/input.txt}
[ -f "$DATA" ] || { echo "error: $DATA not found (set DATA=path/to/text)" >&2; exit 2; }
COMMON="data.source=$DATA data.tokenizer=byte data.cache_dir=$OUT/cache model.max_seq_len=64 train.block_size=64
 train.batch_size=16 train.steps=800 train.eval_every=200 train.eval_batches=8 train.checkpoint_every=800
 train.sample_tokens=0 train.progress=false train.seed=0 optim.lr=1e-2"
python -m recipes.train model.preset=ngpt-tiny optim.method=riemannian_adam $COMMON train.out_dir=$OUT/ngpt
python -m recipes.train model.preset=gpt-tiny optim.method=adamw optim.warmup_steps=80 $COMMON train.out_dir=$OUT/gpt
python -m recipes.analyze $OUT/ngpt $OUT/gpt --labels nGPT GPT --out $OUT/analysis \
    --extrapolate --factors 1 2 4 8 --eval-batches 8 --batch-size 16
echo "figures and summary in $OUT/analysis"

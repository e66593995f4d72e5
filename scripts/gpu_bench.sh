#!/usr/bin/env bash
# The accelerator column: the suite's speed rows and transformers generate, on a GPU.
#
#   scripts/gpu_bench.sh [OUT_DIR]     # default out/gpu; ~10 min on one H200, compiles included
#   STAGES="ngram eagle3" scripts/gpu_bench.sh out/gpu   # only these stages
#
# Same prompts and rows as the CPU suite's speed stage (README "Results: one suite run with
# every row"): first 10 MT-Bench + 10 HumanEval prompts, 256 new tokens, EOS ignored, batch 1,
# float32; plain decoding, the n-gram store (K=5) and EAGLE-3 (chain K=3, tree 4,4,16), strict
# and ASD (paper preset), then the store at K=8 and K=12, where on a GPU it pays most (README
# "On the H200 again"). Prompts pad to 256 tokens (--prompt-bucket), so each row compiles
# once: on a GPU a padded prefill costs next to nothing and a compile takes seconds.
# Each stage has its own time limit and writes its own JSON, so a slow stage costs only itself.
# The environment must already hold the package and the assets (`make venv`, or PYTHONPATH).
# On the H200: n-gram 210 s with the GGUF conversion (66 s once converted), EAGLE-3 134 s,
# wide n-gram ~200 s, transformers 53 s (stops 31 and 32); the standalone stage has not run on a
# GPU yet. One device call runs at most 600 s, so a fresh machine may need two calls (STAGES).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT_DIR=${1:-out/gpu}
NUM_PROMPTS=${NUM_PROMPTS:-10}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-256}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
# The native kernels are CPU-only (models/native_kernels.py): don't compile them here.
export ASD_JAX_NATIVE=${ASD_JAX_NATIVE:-0}

STAGES=${STAGES:-ngram eagle3 ngram_wide ar standalone}

stage() {  # stage NAME SECONDS CMD...: one stage under its own limit, its output teed to a log
  local name=$1 limit=$2; shift 2
  [[ " $STAGES " == *" $name "* ]] || { echo "=== $name: skipped (not in STAGES) ==="; return; }
  echo "=== $name (limit ${limit}s) ==="
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | grep --line-buffered -v '^bench:\|it/s\]' | tee "$OUT_DIR/$name.log"
  echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s ==="
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"

# Two spec stages, each with its own plain row as the baseline of the same run, so a stage that
# runs out of time loses only its own rows. The first also converts the GGUF once (cached
# under $ASD_JAX_CACHE_DIR).
SPEC=(--mode spec --num-prompts "$NUM_PROMPTS" --max-new-tokens "$MAX_NEW_TOKENS"
      --prompt-bucket 256 --skip-transformers)
stage ngram "${NGRAM_LIMIT:-300}" $PY -m asd_jax.bench "${SPEC[@]}" --draft ngram+store@5 \
  --json "$OUT_DIR/gpu_ngram.json"
stage eagle3 "${EAGLE3_LIMIT:-240}" $PY -m asd_jax.bench "${SPEC[@]}" \
  --draft smollm2-135m-eagle3@3 --tree 4,4,16 --json "$OUT_DIR/gpu_eagle3.json"
# The store's longer chains: with no loop in its round, a round costs one plain step on the GPU
# (stop 32), so a longer chain is nearly free there.
stage ngram_wide "${NGRAM_WIDE_LIMIT:-260}" $PY -m asd_jax.bench "${SPEC[@]}" \
  --draft ngram+store@8,ngram+store@12 --json "$OUT_DIR/gpu_ngram_wide.json"
# transformers generate on the same GPU, next to our plain decoding (fewer prompts: HF's loop
# is slow enough to dominate the stage).
stage ar "${AR_LIMIT:-90}" $PY -m asd_jax.bench --mode ar --num-prompts 2 \
  --max-new-tokens "$MAX_NEW_TOKENS" --prompt-bucket 256 --json "$OUT_DIR/gpu_ar.json"
# The distilled standalone drafter (the --pair default), never measured on a GPU: chain K=4
# (its K-1 steps unrolled since stop 33) and tree 4,4,16, strict and ASD.
stage standalone "${STANDALONE_LIMIT:-240}" $PY -m asd_jax.bench "${SPEC[@]}" \
  --draft smollm2-135m-standalone@4 --tree 4,4,16 --json "$OUT_DIR/gpu_standalone.json"

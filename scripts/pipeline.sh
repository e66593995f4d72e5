#!/usr/bin/env bash
# The whole drafter pipeline on SmolLM2-135M, one stage per command, or all of them in order:
#
#   scripts/pipeline.sh all                      # every stage below, in this order
#   scripts/pipeline.sh prepare data eagle3      # any subset, in the order given
#
# Stages (each resumable: a rerun reuses caches and continues checkpoints):
#   prepare     load the target once: dequantises the GGUF into the user cache
#   data        build the training dataset (the target's greedy answers to offline prompts)
#   eagle3      train the EAGLE-3 baseline (TTT objective)
#   vsd         train the VSD EAGLE-3 drafter (same data, steps and architecture)
#   medusa      train Medusa heads
#   standalone  distil the 2-layer standalone drafter
#   tau         real-decoding tau of the baseline vs the VSD drafter (strict tree 4,4,16)
#   bench       the benchmark suite (scripts/run_suite.sh, SIZE=cpu unless set) with the
#               n-gram store and the pipeline's standalone and EAGLE-3 drafters
#   sampled     (not in `all`) baseline vs VSD on answers the target sampled at T=1
#               (preset smollm2_eagle3_sampled: data, both trainings, real-decoding tau)
#
# Drafters are exported to $DRAFTERS (default out/pipeline/drafters); DRAFTERS=drafters
# replaces the shipped ones. Wall times on a 2-core CPU: data ~9 min, eagle3 ~19 min, vsd ~25
# min, medusa ~8 min, standalone ~19 min, tau ~10 min, bench (cpu, trees
# included: scripts/run_suite.sh) ~2.5 h.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
RUNS="${RUNS:-out/pipeline/runs}"
DRAFTERS="${DRAFTERS:-out/pipeline/drafters}"
TRAIN=("$PY" -m vsd_jax.train --mesh=1x1 --no-progress)

stage() {
  echo "== $1 ($(date +%T))"
  case "$1" in
    prepare)    "$PY" -c "from models.load import load_decoder; load_decoder('smollm2-135m')" ;;
    data)       "$PY" -m vsd_jax.build_dataset --config=smollm2_eagle3 ;;
    eagle3)     "${TRAIN[@]}" --config=smollm2_eagle3 --workdir="$RUNS/eagle3" \
                  --export="$DRAFTERS/smollm2-135m-eagle3" ;;
    vsd)        "${TRAIN[@]}" --config=smollm2_eagle3 --objective=vsd --workdir="$RUNS/vsd" \
                  --export="$DRAFTERS/smollm2-135m-eagle3-vsd" ;;
    medusa)     "${TRAIN[@]}" --config=smollm2_medusa --workdir="$RUNS/medusa" \
                  --set steps=100 --set eval_every=50 --set ckpt_every=50 \
                  --export="$DRAFTERS/smollm2-135m-medusa" ;;
    standalone) "$PY" -m scripts.distill_standalone_drafter --cache-dir "$RUNS/standalone" \
                  --out "$DRAFTERS/smollm2-135m-standalone" ;;
    tau)        "$PY" scripts/drafter_tau.py --tree 4,4,16 --num-prompts 10 --max-new-tokens 128 \
                  --draft "$DRAFTERS/smollm2-135m-eagle3,$DRAFTERS/smollm2-135m-eagle3-vsd" \
                  --json "$RUNS/drafter_tau.json" ;;
    bench)      DRAFTS="${DRAFTS:-ngram+store@5,$DRAFTERS/smollm2-135m-standalone@2,$DRAFTERS/smollm2-135m-eagle3@3}" \
                  scripts/run_suite.sh ;;
    sampled)    "$PY" -m vsd_jax.build_dataset --config=smollm2_eagle3_sampled
                for obj in baseline vsd; do
                  "${TRAIN[@]}" --config=smollm2_eagle3_sampled --objective=$obj \
                    --workdir="$RUNS/sampled_$obj" --export="$DRAFTERS/sampled_$obj"
                done
                "$PY" scripts/drafter_tau.py --tree 4,4,16 --num-prompts 10 --max-new-tokens 128 \
                  --draft "$DRAFTERS/sampled_baseline,$DRAFTERS/sampled_vsd" \
                  --json "$RUNS/drafter_tau_sampled.json" ;;
    *) echo "unknown stage '$1' (stages: prepare data eagle3 vsd medusa standalone tau bench" \
            "sampled)" >&2
       exit 2 ;;
  esac
}

[ $# -gt 0 ] || { sed -n '2,21p' "$0"; exit 2; }
if [ "$1" = all ]; then
  set -- prepare data eagle3 vsd medusa standalone tau bench
fi
for s in "$@"; do stage "$s"; done

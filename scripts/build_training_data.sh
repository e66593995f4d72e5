#!/usr/bin/env bash
# Builds the drafter-training dataset of a preset (default: SmolLM2-135M, shared by the
# smollm2_* presets) and trains the EAGLE-3 baseline on it.
#   scripts/build_training_data.sh [PRESET] [WORKDIR]
# The target's greedy answers are cached in out/ (distill_data_*.npz): a rebuild costs no
# target time. Generation of 700 + 48 prompts x <= 128 tokens took ~8.7 min (159 tok/s,
# batch 32) on a 2-core CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET="${1:-smollm2_eagle3}"
WORKDIR="${2:-out/runs/${PRESET}}"
PY="${PY:-.venv/bin/python}"
"$PY" -m vsd_jax.build_dataset --config="$PRESET"
"$PY" -m vsd_jax.train --config="$PRESET" --mesh=1x1 --workdir="$WORKDIR"

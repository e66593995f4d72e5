#!/usr/bin/env bash
# The benchmark suite behind the README's suite table and plots (docs/bench/*.png).
#
#   scripts/run_suite.sh            # the small CPU run in the README (see ARGS below)
#   SIZE=full scripts/run_suite.sh  # issue #8's full workload: 80 MT-Bench + 164 HumanEval
#                                   # prompts, 256 new tokens (hours on a CPU; use an accelerator)
#
# Writes out/suite_${SIZE}.json (rows, calibration, protocol raw passes), the printed table in
# out/suite_${SIZE}.txt, and the plots into docs/bench/ (small) or out/plots_full/ (full).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
SIZE=${SIZE:-small}
if [[ $SIZE == full ]]; then
  DRAFTS=${DRAFTS:-smollm2-135m-standalone,smollm2-135m-eagle3}
  ARGS=(--num-prompts 164 --max-new-tokens 256 --quality-max-new-tokens 512
        --asd-budgets 0,1,2,4,8 --calibrate-prompts 16 --calibration-source training)
  PLOTS=out/plots_full
else
  # Sized for a 2-core CPU shared with other jobs (about 20 minutes).
  DRAFTS=${DRAFTS:-smollm2-135m-standalone}
  ARGS=(--num-prompts 3 --max-new-tokens 64 --quality-max-new-tokens 96
        --asd-budgets 0,2,8 --calibrate-prompts 4)
  PLOTS=docs/bench
fi
mkdir -p out
"$PY" -m asd_jax.bench --mode suite --draft "$DRAFTS" --k 2 "${ARGS[@]}" --json "out/suite_${SIZE}.json" | tee "out/suite_${SIZE}.txt"
"$PY" -m asd_jax.bench_plots "out/suite_${SIZE}.json" --out "$PLOTS"

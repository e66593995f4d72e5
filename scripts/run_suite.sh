#!/usr/bin/env bash
# The benchmark suite behind the README's suite table and plots (docs/bench/*.png).
#
#   scripts/run_suite.sh            # the CPU run in the README (see ARGS below; ~2.5 h on 2 cores)
#   SIZE=full scripts/run_suite.sh  # issue #8's full workload: 80 MT-Bench + 164 HumanEval
#                                   # prompts, 256 new tokens (hours on a CPU; use an accelerator)
#
# Writes out/suite_${SIZE}.json (rows, calibration, protocol raw passes), the printed table in
# out/suite_${SIZE}.txt, and the plots into docs/bench/ (cpu) or out/plots_full/ (full).
# The llama.cpp row is added when the optional llama-cpp-python is installed
# (.venv/bin/pip install -e '.[llamacpp]', ~9 min to build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
SIZE=${SIZE:-cpu}
# The first drafter gets the calibrated preset and the budget sweep; the standalone drafter also
# serves transformers' assisted generation. @K is each drafter's chain length.
DRAFTS=${DRAFTS:-ngram+store@5,smollm2-135m-standalone@2,smollm2-135m-eagle3@3}
# Tree rows (strict and ASD paper) for every drafter that drafts trees (the n-gram store drafts
# chains only): EAGLE-2 style dynamic trees, DEPTH,TOPK,NODES. TREE= (empty) runs chains only.
TREE=${TREE-4,4,16}
if [[ $SIZE == full ]]; then
  ARGS=(--num-prompts 164 --max-new-tokens 256 --quality-max-new-tokens 512
        --asd-budgets 0,1,2,4,8 --calibrate-prompts 16 --calibration-source training)
  PLOTS=out/plots_full
elif [[ $SIZE == cpu ]]; then
  # 10 MT-Bench + 10 HumanEval prompts, 256 new tokens: one run of every row on 2 cores.
  ARGS=(--num-prompts 10 --max-new-tokens 256 --quality-max-new-tokens 256
        --asd-budgets 0,1,2,4,8 --calibrate-prompts 8)
  PLOTS=docs/bench
else
  echo "SIZE must be cpu or full, got $SIZE" >&2
  exit 2
fi
if [[ -n $TREE ]]; then
  ARGS+=(--tree "$TREE")
fi
if "$PY" -c "import llama_cpp" 2>/dev/null; then
  ARGS+=(--llama-cpp)
fi
mkdir -p out
"$PY" -m asd_jax.bench --mode suite --draft "$DRAFTS" --k 2 "${ARGS[@]}" --json "out/suite_${SIZE}.json" | tee "out/suite_${SIZE}.txt"
"$PY" -m asd_jax.bench_plots "out/suite_${SIZE}.json" --out "$PLOTS"

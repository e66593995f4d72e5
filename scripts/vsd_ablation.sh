#!/usr/bin/env bash
# VSD vs the EAGLE-3 baseline on SmolLM2 (specs/vsd.md "Metrics that decide whether it works"):
# same data, same steps, same drafter architecture and seed; only the objective differs.
#   scripts/vsd_ablation.sh [STEPS] [VARIANT...]
#   STOP=80 scripts/vsd_ablation.sh 240 wl   # stop at step 80 of the 240-step schedule
# Variants (default: all): baseline wl wl_arw vsd s4 s32. Each trains in out/runs/vsd_ablation/
# <variant> (resumable: rerun the same command), then `scripts/vsd_report.py` prints the table
# (held-out simulated tau, tree diagnostics) and, with --decode, real tree-decoding tau.
# Cost on a 2-core CPU: ~5 s/step baseline, ~6 s/step VSD (S=16) when the machine is quiet.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
STEPS="${1:-240}"
shift || true
VARIANTS=("$@")
[ ${#VARIANTS[@]} -eq 0 ] && VARIANTS=(baseline wl wl_arw vsd s4 s32)
for v in "${VARIANTS[@]}"; do
  case "$v" in
    baseline) args=(--objective=baseline) ;;
    wl)       args=(--objective=vsd --set vsd_arw=off --set vsd_car=off) ;;
    wl_arw)   args=(--objective=vsd --set vsd_car=off) ;;
    vsd)      args=(--objective=vsd) ;;
    s4)       args=(--objective=vsd --set vsd_paths=4) ;;
    s32)      args=(--objective=vsd --set vsd_paths=32) ;;
    *) echo "unknown variant $v" >&2; exit 2 ;;
  esac
  "$PY" -m vsd_jax.train --config=smollm2_eagle3 --mesh=1x1 --no-progress \
      --workdir="out/runs/vsd_ablation/$v" --set steps="$STEPS" "${args[@]}" \
      ${STOP:+--steps "$STOP"} --export="out/drafters/vsd_ablation/$v"
done
"$PY" scripts/vsd_report.py out/runs/vsd_ablation/*

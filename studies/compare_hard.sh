#!/usr/bin/env bash
# Issue 10's comparison in the paper's hard regime with language modelling: `+experiment=lm_mix_1kv_w8s8` (one KV head
# under 4 query heads, W8/S8, byte-level Python source around the records; summary.json and MLflow carry lm_loss),
# unmitigated and with each mitigation that applies to one KV head (head_coord needs two heads per layer).
# Tagged comparison=$TAG; `python -m phasefix.report tag.comparison=$TAG` writes the table (seeds.md with lm_loss).
# Two runs at a time, one thread each: about 12 minutes per pair on the 2-core development VM.
# Usage: [JOBS=2] bash studies/compare_hard.sh [TAG [SEEDS]]
set -euo pipefail
cd "$(dirname "$0")/.."
TAG="${1:-hard_v1}"
SEEDS="${2:-0 1 2}"
COMMON="+experiment=lm_mix_1kv_w8s8 trainer.num_threads=1 trainer.progress_bar=false +logger.tags.comparison=$TAG"
{
  for seed in $SEEDS; do
    echo "seed=$seed run_name=lm1kv-baseline-s$seed"
    echo "seed=$seed run_name=lm1kv-gate_diversity-s$seed +mitigation=gate_diversity"
    echo "seed=$seed run_name=lm1kv-layer_coord-s$seed +mitigation=layer_coord"
    echo "seed=$seed run_name=lm1kv-staggered_offsets-s$seed +mitigation=staggered_offsets"
  done
} | xargs -P "${JOBS:-2}" -I{} sh -c "python -m phasefix.fit $COMMON {} > /dev/null 2>&1 || echo 'failed: {}'"

#!/usr/bin/env bash
# Issue 10's comparison with language modelling (docs/results.md): a language-modelling mix experiment, unmitigated and
# with each mitigation, 3 seeds; tagged comparison=$TAG so `python -m phasefix.report tag.comparison=$TAG` writes the
# table (seeds.md with lm_loss). EXPERIMENT: lm_mix_w4s4 (default: the CPU model, 2 KV heads) or lm_mix_1kv_w8s8
# (one KV head: head_coord, which needs two KV heads per layer, is left out).
# Two runs at a time, one thread each: about 11 minutes per pair on the 2-core development VM.
# Usage: [JOBS=2] bash studies/compare_hard.sh [TAG [SEEDS [EXPERIMENT]]]
set -euo pipefail
cd "$(dirname "$0")/.."
TAG="${1:-lm_v2}"
SEEDS="${2:-0 1 2}"
EXPERIMENT="${3:-lm_mix_w4s4}"
COMMON="+experiment=$EXPERIMENT trainer.num_threads=1 trainer.progress_bar=false +logger.tags.comparison=$TAG"
MITIGATIONS="gate_diversity head_coord layer_coord"
[ "$EXPERIMENT" = lm_mix_1kv_w8s8 ] && MITIGATIONS="gate_diversity layer_coord staggered_offsets"
{
  for seed in $SEEDS; do
    echo "seed=$seed run_name=$EXPERIMENT-baseline-s$seed"
    for m in $MITIGATIONS; do
      echo "seed=$seed run_name=$EXPERIMENT-$m-s$seed +mitigation=$m"
    done
  done
} | xargs -P "${JOBS:-2}" -I{} sh -c "python -m phasefix.fit $COMMON {} > /dev/null 2>&1 || echo 'failed: {}'"

#!/usr/bin/env bash
# Issue 10's comparison with language modelling (docs/results.md): a language-modelling mix experiment, unmitigated and
# with each mitigation, 3 seeds; tagged comparison=$TAG so `python -m phasefix.report tag.comparison=$TAG` writes the
# table (seeds.md with lm_loss). EXPERIMENT: lm_mix_w4s4 (default: the CPU model, 2 KV heads), records64,
# in_sequence, overlap_w8s4 (conf/experiment/), or a one-KV-head one (*1kv*: head_coord, which needs two KV heads
# per layer, is left out).
# Two runs at a time, one thread each: about 11 minutes per pair on the 2-core development VM.
# Usage: [JOBS=2] bash studies/compare_hard.sh [TAG [SEEDS [EXPERIMENT [REGEX]]]]   (REGEX: only the matching runs)
set -euo pipefail -f  # -f: no globbing of [a,b] mitigation lists
cd "$(dirname "$0")/.."
TAG="${1:-lm_v2}"
SEEDS="${2:-0 1 2}"
EXPERIMENT="${3:-lm_mix_w4s4}"
ONLY="${4:-.}"
COMMON="+experiment=$EXPERIMENT trainer.num_threads=1 trainer.progress_bar=false +logger.tags.comparison=$TAG"
MITIGATIONS="gate_diversity head_coord layer_coord [head_coord,layer_coord]"  # the pair: both learned in every seed
case "$EXPERIMENT" in  # one KV head: head_coord needs two KV heads per layer
  *1kv*) MITIGATIONS="gate_diversity layer_coord staggered_offsets [gate_diversity,layer_coord]" ;;
esac
{
  for seed in $SEEDS; do
    echo "seed=$seed run_name=$EXPERIMENT-baseline-s$seed"
    for m in $MITIGATIONS; do
      echo "seed=$seed run_name=$EXPERIMENT-$(echo "$m" | tr -d '[]' | tr , +)-s$seed +mitigation=$m"
    done
  done
} | grep -E -- "$ONLY" | xargs -P "${JOBS:-2}" -I{} sh -c "python -m phasefix.fit $COMMON {} > /dev/null 2>&1 || echo 'failed: {}'"

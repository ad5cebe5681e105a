#!/usr/bin/env bash
# The measured mitigation comparison of docs/results.md: every run is a plain `python -m phasefix.fit` on the CPU
# default (tiny: W4/S4, 2 KV heads, tail, 800 steps), tagged comparison=$TAG so `python -m phasefix.report
# tag.comparison=$TAG` selects them. Two runs at a time, one thread each (2 cores), about 45 minutes in all.
# Usage: bash studies/compare_mitigations.sh [TAG]
set -euo pipefail
cd "$(dirname "$0")/.."
TAG="${1:-mitigations_v1}"
COMMON="trainer.num_threads=1 trainer.progress_bar=false +logger.tags.comparison=$TAG"
{
  # stride 8 needs a longer budget to learn the task at all (at 800 steps its mean stays near 0.2)
  echo "seed=0 run_name=S8-baseline-1600 model.stride=8 trainer.max_steps=1600"
  for seed in 0 1 2; do
    echo "seed=$seed run_name=S4-baseline-s$seed"
    echo "seed=$seed run_name=S4-gate_diversity-s$seed +mitigation=gate_diversity"
    echo "seed=$seed run_name=S4-head_coord-s$seed +mitigation=head_coord"
  done
  echo "seed=0 run_name=S4-gate_diversity_hard-s0 +mitigation=gate_diversity mitigation.gate_diversity.mode=hard"
  echo "seed=0 run_name=S4-phase_jitter-s0 +mitigation=phase_jitter"
  echo "seed=0 run_name=S4-staggered_offsets-s0 +mitigation=staggered_offsets"
  echo "seed=0 run_name=S4-gate_diversity+head_coord-s0 +mitigation=[gate_diversity,head_coord]"
} | xargs -P 2 -I{} sh -c "python -m phasefix.fit $COMMON {} > /dev/null 2>&1 || echo 'failed: {}'"

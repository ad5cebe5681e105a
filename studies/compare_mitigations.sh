#!/usr/bin/env bash
# The measured mitigation comparison of docs/results.md: every run is a plain `python -m phasefix.fit` on the CPU
# default (tiny: 2 KV heads, tail, 800 steps) at stride 4 (W4/S4) and stride 8 (W8/S8), tagged comparison=$TAG so
# `python -m phasefix.report tag.comparison=$TAG` selects them (and writes seeds.md, the table over seeds).
# Two runs at a time, one thread each (2 cores): about 5-6 minutes per pair on the development VM, ~2 h in all.
# Usage: [JOBS=2] bash studies/compare_mitigations.sh [TAG [REGEX]]   (REGEX: only the runs whose line matches, e.g. 'S8-')
set -euo pipefail
cd "$(dirname "$0")/.."
TAG="${1:-mitigations_v2}"
ONLY="${2:-.}"
COMMON="trainer.num_threads=1 trainer.progress_bar=false +logger.tags.comparison=$TAG"
{
  for S in 4 8; do
    for seed in 0 1 2; do
      echo "seed=$seed model.stride=$S run_name=S$S-baseline-s$seed"
    done
  done
  for S in 8 4; do
    for seed in 0 1 2; do
      echo "seed=$seed model.stride=$S run_name=S$S-gate_diversity-s$seed +mitigation=gate_diversity"
      echo "seed=$seed model.stride=$S run_name=S$S-head_coord-s$seed +mitigation=head_coord"
      echo "seed=$seed model.stride=$S run_name=S$S-staggered_offsets-s$seed +mitigation=staggered_offsets"
      echo "seed=$seed model.stride=$S run_name=S$S-layer_coord-s$seed +mitigation=layer_coord"
    done
    for seed in 0 1 2; do  # the combination: heads cover complementary phases, layers move the boundary
      echo "seed=$seed model.stride=$S run_name=S$S-head_coord+staggered_offsets-s$seed +mitigation=[head_coord,staggered_offsets]"
    done
    for seed in 0 1 2; do
      echo "seed=$seed model.stride=$S run_name=S$S-gate_diversity_hard-s$seed +mitigation=gate_diversity mitigation.gate_diversity.mode=hard"
      echo "seed=$seed model.stride=$S run_name=S$S-phase_jitter-s$seed +mitigation=phase_jitter"
    done
  done
} | grep -E -- "$ONLY" | xargs -P "${JOBS:-2}" -I{} sh -c "python -m phasefix.fit $COMMON {} > /dev/null 2>&1 || echo 'failed: {}'"

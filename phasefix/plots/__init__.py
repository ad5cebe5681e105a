"""Every figure phasefix draws (nothing here talks to MLflow; `phasefix.tracking.log_figure` logs them), in three
modules: `one_run` (one run and its probes), `across_runs` (several runs), `study` (studies, theory); all exported
here:

- a run's phase curves (`phase_curves`) and static gates (`gate_heatmap`): fit and evaluate; the flip probe's
  log-probability difference by filler length (`flip_curve`): evaluate task=flip; accuracy by fact phase x end
  phase (`phase_grid_heatmap`): evaluate phase_of=both;
- one run's mechanism probes (phasefix.analyze): knockout by residue (`knockout_heatmap`), gate statistics
  (`gate_stats_heatmap`), gate cycling (`cycle_prediction`), the dominant period (`period_curve`); the weights-only
  phase audit's predicted phase mass (`audit_phase_heatmap`). These take the probes' results and draw them; plots
  imports nothing from phasefix.analyze or phasefix.evaluate (they import plots);
- several runs (`phasefix.run_scores.collect`'s rows and curves, `phasefix.decisive.run_facts` per run): overlaid
  phase curves, the Pareto front of study members, the decisive comparison's small multiples (`phase_grid`),
  worst-vs-mean scatter and training losses; the headline's runs by regime (`headline_worst_vs_mean`); an
  unmitigated run's phase curve beside the recommended arm's (`fix_side_by_side`: the README's figure); two audits
  of the same prompts (`side_by_side`, phasefix.side_by_side's rows);
- a study's trials and Pareto front (`study_pareto`); the idealised induction model (`theory_gates`).
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported anywhere below
import matplotlib.pyplot as plt  # noqa: E402


def save(fig, path: str | Path) -> None:
    """The figure as a PNG at 110 dpi (every figure file phasefix writes), then closed; cropped to what is drawn, so
    a legend placed outside the axes is never cut off."""
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.08)
    plt.close(fig)


from phasefix.plots.one_run import (audit_phase_heatmap, cycle_prediction, flip_curve, gate_heatmap,  # noqa: E402
                                gate_stats_heatmap, knockout_heatmap, period_curve, phase_curves,
                                phase_grid_heatmap)
from phasefix.plots.across_runs import (fix_side_by_side, headline_worst_vs_mean, loss_curves, phase_grid,  # noqa: E402
                                        phase_grid_rows, runs_pareto, runs_phase_curves, side_by_side, worst_vs_mean)
from phasefix.plots.study import study_pareto, theory_gates  # noqa: E402

__all__ = ["audit_phase_heatmap", "cycle_prediction", "fix_side_by_side", "flip_curve", "gate_heatmap",
           "gate_stats_heatmap", "headline_worst_vs_mean", "knockout_heatmap", "loss_curves", "period_curve", "phase_curves", "phase_grid",
           "phase_grid_heatmap", "phase_grid_rows", "runs_pareto", "runs_phase_curves", "save", "side_by_side", "study_pareto",
           "theory_gates", "worst_vs_mean"]

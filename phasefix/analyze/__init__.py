"""Mechanism tools (science.md §5; docs/mechanism.md): `python -m phasefix.analyze TOOL run=<run> [key=value ...]`.

TOOL is one of `knockout`, `gates`, `cycle`, `period`, `confusions`. Every tool loads the run's checkpoint, rebuilds the
phase-controlled evaluation task the model was trained on (from the run's `config.yaml`), prints a table and logs
metrics `analyze/<tool>/<padding>/...` and a figure `analyze/<tool>.png` (`analyze/<tool>-<padding>.png` for
paddings other than prefix) into the same MLflow run.

A Hydra app: the keys and defaults are `phasefix.config.AnalyzeConfig` (conf/analyze.yaml, `--help` lists them).
This module holds what the tools share: the run context (`load_run`), the options (`parse_options`),
evaluation sets (`eval_set`), accuracy by residue and by phase. Per-prompt correctness is `phasefix.predict`.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from phasefix.errors import ConfigError, check

TOOLS = ("knockout", "gates", "cycle", "period", "confusions")  # on a trained run (run=); `audit`: audit.py


def tool_options(cfg: DictConfig, kind: str) -> dict:
    """The options of the mechanism tools (kind 'run') or of the audit ('audit') from the composed config, with the
    defaults that depend on the kind filled in; ConfigError naming a key set that this kind does not take."""
    from phasefix.config import AnalyzeConfig

    fields = dataclasses.fields(AnalyzeConfig)
    allowed = [f.name for f in fields if kind in f.metadata["tools"].split(",")]
    opts = {}
    for f in fields:
        value = cfg[f.name]
        if f.name not in allowed:
            if value != f.default:
                where = f"analyze {cfg.tool} {'run=' if kind == 'run' else 'model='}"
                raise ConfigError(f"{f.name} is not an option of {where}: allowed keys are {', '.join(allowed)}")
            continue
        opts[f.name] = f.metadata.get(kind) if value is None else value
    return opts


def parse_options(args) -> dict:
    """The options of a mechanism tool (key=value words, a mapping or the composed config), with defaults;
    ConfigError on an unknown key or a bad value."""
    from phasefix.cli import options

    opts = tool_options(options(args, "analyze", "tool"), "run")
    check(opts["run"] is not None, "run", None, "is required: an MLflow run id, a run output directory or a .ckpt")
    check(opts["padding"] in ("prefix", "in_sequence", "both"), "padding", opts["padding"],
          "allowed values are 'prefix', 'in_sequence', 'both'")
    check(opts["which"] in ("last", "best"), "which", opts["which"], "allowed values are 'last', 'best'")
    for key in ("per_residue", "batch_size", "n_boot", "max_prompts"):
        check(opts[key] >= 1, key, opts[key], "must be an integer >= 1")
    return opts


def parse_shifts(spec: str) -> list[int]:
    """'-3..3' -> [-3, ..., 3]; '0,1,4' -> [0, 1, 4]."""
    try:
        if ".." in spec:
            a, b = spec.split("..")
            out = list(range(int(a), int(b) + 1))
        else:
            out = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"shifts={spec!r} is invalid: use 'a..b' or a comma-separated list of integers") from None
    check(bool(out), "shifts", spec, "must name at least one shift")
    return out


# ------------------------------------------------------------------------------------------------ run context
@dataclasses.dataclass
class RunContext:
    """A trained run: its model (eval mode), model config, the evaluation task and where to log."""

    module: object
    model: torch.nn.Module
    config: object  # ModelConfig
    hparams: dict
    period: int
    data_cfg: object  # the training data config (RetrievalConfig or LMMixConfig): the task evaluated
    eval_seed: int
    output_dir: Path | None
    run_id: str | None
    tracking_uri: str | None

    @property
    def stride(self) -> int:
        return self.config.phase_stride

    def paddings(self, padding: str) -> list[str]:
        return ["prefix", "in_sequence"] if padding == "both" else [padding]


def load_run(run: str, tracking_uri: str | None = None, which: str = "last") -> RunContext:
    """The run's trained model and evaluation task. `run`: as `phasefix.fit_run.Run.open` takes it (an MLflow run id
    or a unique prefix of one, a run output directory, a .ckpt path, last)."""
    from omegaconf import OmegaConf

    from phasefix.cli import compose
    from phasefix.data import data_config
    from phasefix.fit_run import Run

    r = Run.open(run, tracking_uri)
    module, hp = r.load_module(which)
    cfg = r.config
    if cfg is None:
        warnings.warn(f"no config.yaml beside {r.checkpoint(which)}: evaluating on the default data config",
                      stacklevel=2)
        cfg = compose([])
    data_cfg = data_config(OmegaConf.to_container(cfg.data, resolve=True))
    model = module.model.eval()
    return RunContext(module=module, model=model, config=model.config, hparams=hp, period=int(hp["period"]),
                      data_cfg=data_cfg, eval_seed=int(cfg.eval.seed), output_dir=r.dir,
                      run_id=r.run_id, tracking_uri=r.tracking_uri or tracking_uri)


def eval_set(ctx: RunContext, padding: str, per_residue: int, seed: int):
    """The prompts `phasefix.fit` evaluates this run on (for the LM mix: with held-out text before the records)."""
    from phasefix.data import eval_set as data_eval_set

    return data_eval_set(ctx.data_cfg, padding, ctx.period, per_residue, seed)


# ------------------------------------------------------------------------------------------------ evaluation
def accuracy_by(correct: np.ndarray, groups: np.ndarray, n: int) -> np.ndarray:
    """Mean of `correct` per group 0..n-1 (nan where a group is empty)."""
    k = np.bincount(groups, weights=np.asarray(correct, dtype=np.float64), minlength=n)
    c = np.bincount(groups, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return k / c


def relative_change(new: np.ndarray, base: np.ndarray) -> np.ndarray:
    """(new - base) / base, nan where base is 0."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(base > 0, (new - base) / np.where(base > 0, base, 1.0), np.nan)


# ------------------------------------------------------------------------------------------------ logging
def figure_path(tool: str, padding: str) -> str:
    return f"analyze/{tool}.png" if padding == "prefix" else f"analyze/{tool}-{padding}.png"


def log_results(ctx: RunContext, tool: str, padding: str, scalars: Mapping[str, float],
                curves: Mapping[str, Sequence[float]] = {}, figure=None, opts: Mapping | None = None) -> str:
    """Log `analyze/<tool>/<padding>/<name>` scalars and curves (step = index) and the figure into the run
    (unless opts["log"] is false); save the figure under opts["out"] if given. Returns a note of where they went."""
    from phasefix import tracking

    opts = opts or {}
    note = ""
    if figure is not None and opts.get("out"):
        out = Path(opts["out"]).expanduser()
        out.mkdir(parents=True, exist_ok=True)
        path = out / Path(figure_path(tool, padding)).name
        figure.savefig(path, dpi=110)
        note = f"; figure saved to {path}"
    if not opts.get("log", True):
        _close(figure)
        return "not logged (log=false)" + note
    if ctx.run_id is None:
        _close(figure)
        return "not logged: no MLflow run for this checkpoint (no run.json beside it; pass an MLflow run id)" + note
    c = tracking.client(ctx.tracking_uri)
    prefix = f"analyze/{tool}/{padding}/"
    tracking.log_metric_values(c, ctx.run_id, {prefix + k: v for k, v in scalars.items()},
                               {prefix + k: v for k, v in curves.items()})
    if figure is not None:
        tracking.log_figure(c, ctx.run_id, figure, figure_path(tool, padding))
    return f"logged to MLflow run {ctx.run_id} ({c.tracking_uri})" + note


def _close(fig) -> None:
    if fig is not None:
        import matplotlib.pyplot as plt

        plt.close(fig)


def nanmean(x) -> float:
    """np.nanmean without the all-nan RuntimeWarning (nan then)."""
    x = np.asarray(x, dtype=np.float64)
    return float(np.nanmean(x)) if np.isfinite(x).any() else float("nan")


def fmt(x, width: int = 7, digits: int = 3) -> str:
    x = float(x)
    return f"{'nan':>{width}}" if x != x else f"{x:>{width}.{digits}f}"


__all__ = ["TOOLS", "RunContext", "accuracy_by", "eval_set", "load_run", "log_results", "nanmean",
           "parse_options", "parse_shifts", "relative_change", "tool_options"]

"""Mechanism tools (science.md §5; docs/mechanism.md): `python -m phasefix.analyze TOOL run=<run> [key=value ...]`.

TOOL is one of `knockout`, `gates`, `cycle`, `period`, `confusions`. Every tool loads the run's checkpoint, rebuilds the
phase-controlled evaluation task the model was trained on (from the run's `config.yaml`), prints a table and logs
metrics `analyze/<tool>/<padding>/...` and a figure `analyze/<tool>.png` (`analyze/<tool>-<padding>.png` for
paddings other than prefix) into the same MLflow run.

This module holds what the tools share: the run context (`load_run`), the options (`OPTIONS`, `parse_options`),
evaluation sets and per-prompt correctness (`eval_set`, `predict_correct`), accuracy by residue and by phase.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from phasefix.errors import ConfigError, check

TOOLS = ("knockout", "gates", "cycle", "period", "confusions")

# key -> (default, parser, help). `None` defaults are filled from the run (eval seed) or left unset.
OPTIONS: dict[str, tuple] = {
    "run": (None, str, "MLflow run id (or a unique prefix), run output directory or .ckpt path (required)"),
    "tracking_uri": (None, str, "MLflow tracking URI (default: the run's, else MLFLOW_TRACKING_URI/the project's)"),
    "which": ("last", str, "checkpoint of a run directory / run id: last or best"),
    "padding": ("prefix", str, "prefix, in_sequence or both"),
    "per_residue": (24, int, "prompts per residue group"),
    "seed": (None, int, "evaluation seed (default: the run's eval.seed)"),
    "calib_seed": (None, int, "knockout: seed of the calibration set (default: seed + 2, disjoint prompts)"),
    "batch_size": (128, int, "prompts per forward pass"),
    "n_boot": (500, int, "cluster-bootstrap replicates (cycle, period)"),
    "shifts": ("-3..3", str, "cycle: gate shifts d, as 'a..b' or 'a,b,c'"),
    "max_prompts": (512, int, "gates: prompts the gate statistics average over"),
    "log": (True, bool, "log metrics and the figure into the MLflow run"),
    "out": (None, str, "also save the figure as <out>/<tool>[-<padding>].png"),
    "threads": (None, int, "torch threads (default: torch's)"),
}


def _parse_bool(v: str) -> bool:
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(v)


def parse_key_values(args: Sequence[str], options: dict, where: str = "") -> dict:
    """`key=value` arguments -> {key: typed value} over `options` {key: (default, type, help)}; ConfigError on an
    unknown key or a value of the wrong type. `where` names the command in the unknown-key message."""
    opts = {k: d for k, (d, _, _) in options.items()}
    for arg in args:
        key, eq, value = arg.partition("=")
        if not eq:
            raise ConfigError(f"argument {arg!r} is invalid: expected key=value with key in {', '.join(options)}")
        if key not in options:
            raise ConfigError(f"{key} is not an option{' of ' + where if where else ''}: allowed keys are "
                              f"{', '.join(options)}")
        kind = options[key][1]
        try:
            opts[key] = _parse_bool(value) if kind is bool else kind(value)
        except ValueError:
            raise ConfigError(f"{key}={value!r} is invalid: must be {kind.__name__}") from None
    return opts


def parse_options(args: Sequence[str]) -> dict:
    """`key=value` arguments -> options with defaults; ConfigError on an unknown key or a bad value."""
    opts = parse_key_values(args, OPTIONS)
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
        return self.config.stride

    def paddings(self, padding: str) -> list[str]:
        return ["prefix", "in_sequence"] if padding == "both" else [padding]


def load_run(run: str, tracking_uri: str | None = None, which: str = "last") -> RunContext:
    """The run's trained model and evaluation task. `run`: as `phasefix.run.Run.open` takes it (an MLflow run id or a
    unique prefix of one, a run output directory, a .ckpt path, last)."""
    from omegaconf import OmegaConf

    from phasefix import fit as F
    from phasefix.run import Run

    r = Run.open(run, tracking_uri)
    module, hp = r.load_module(which)
    cfg = r.config
    if cfg is None:
        warnings.warn(f"no config.yaml beside {r.checkpoint(which)}: evaluating on the default data config",
                      stacklevel=2)
        cfg = F.compose([])
    data_cfg = F.data_config(OmegaConf.to_container(cfg.data, resolve=True))
    model = module.model.eval()
    return RunContext(module=module, model=model, config=model.config, hparams=hp, period=int(hp["period"]),
                      data_cfg=data_cfg, eval_seed=int(cfg.eval.seed), output_dir=r.dir,
                      run_id=r.run_id, tracking_uri=r.tracking_uri or tracking_uri)


def eval_set(ctx: RunContext, padding: str, per_residue: int, seed: int):
    """The prompts `phasefix.fit` evaluates this run on (for the LM mix: with held-out text before the records)."""
    from phasefix.fit import eval_set as fit_eval_set

    return fit_eval_set(ctx.data_cfg, padding, ctx.period, per_residue, seed)


# ------------------------------------------------------------------------------------------------ evaluation
@dataclasses.dataclass
class Outcome:
    """Per-prompt results of one evaluation: correct [n] bool, residue [n], cluster [n], pred [n] (the top-1 token)
    (numpy)."""

    correct: np.ndarray
    residue: np.ndarray
    cluster: np.ndarray
    pred: np.ndarray | None = None  # predict_correct fills it (the knockout pass does not need it)


@torch.no_grad()
def predict_correct(model, dataset, batch_size: int = 128) -> Outcome:
    """Top-1 correctness at `query_pos` of every prompt, in dataset order."""
    device = next(model.parameters()).device
    correct, residue, cluster, preds = [], [], [], []
    for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        logits = model(batch["input_ids"].to(device))
        rows = torch.arange(logits.shape[0], device=device)
        pred = logits[rows, batch["query_pos"].to(device)].argmax(-1).cpu()
        preds.append(pred.numpy())
        correct.append((pred == batch["answer"]).numpy())
        residue.append(batch["residue"].numpy())
        cluster.append(batch["cluster"].numpy())
    return Outcome(np.concatenate(correct), np.concatenate(residue).astype(np.int64),
                   np.concatenate(cluster).astype(np.int64), np.concatenate(preds))


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


__all__ = ["OPTIONS", "TOOLS", "Outcome", "RunContext", "accuracy_by", "eval_set", "load_run", "log_results",
           "nanmean", "parse_options", "parse_shifts", "predict_correct", "relative_change"]

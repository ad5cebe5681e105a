"""A fit run's home (what `phasefix.fit` trains): its output directory, config, checkpoints and MLflow run id.

Every command that names a run (`fit resume=`, `evaluate model=`, `analyze run=`, `report runs=`) goes through
`Run.open(spec)`, or through `tracking.resolve_run_id` when only the MLflow run is needed. `spec` is one of

  last                     the run trained most recently (newest checkpoints/last.ckpt under the outputs directory)
  a run output directory   outputs/<date>/<time>-<name>/ (run.json, config.yaml, checkpoints/)
  a .ckpt file             that checkpoint (its run is the directory above checkpoints/, when there is one)
  an MLflow run id         or any unique prefix of one, such as the 8 characters the tools print

The outputs directory is <project>/outputs, or $PHASEFIX_OUTPUTS when set.
"""
from __future__ import annotations

import dataclasses
import os
from datetime import datetime
from pathlib import Path

from phasefix.errors import check
from phasefix.paths import OUTPUTS_DIR

RUN_FILE = "run.json"
RUN_SPEC = "'last', an MLflow run id (or a unique prefix of one), a run output directory or a .ckpt file"


def outputs_dir() -> Path:
    return Path(os.environ.get("PHASEFIX_OUTPUTS") or OUTPUTS_DIR)


def checkpoint_path(run_dir: Path | str, which: str = "last") -> Path:
    """Where a run keeps a checkpoint: `last` (what a resume continues from) or `best`; it may not exist yet."""
    return Path(run_dir) / "checkpoints" / f"{which}.ckpt"


def check_spec(spec: str, key: str = "run", what: str = RUN_SPEC) -> None:
    """`Run.open`'s checks that need no MLflow (the app checks them with its other options, before any import):
    a file must be a .ckpt, a directory a run output directory, and a path must exist; anything else may be an
    MLflow run id. `what`: the message's list of what `key` accepts."""
    path = Path(str(spec)).expanduser()
    if path.is_file():
        check(path.suffix == ".ckpt", key, spec, f"must be {what}")
    elif path.is_dir():
        check((path / RUN_FILE).exists() or (path / "checkpoints").is_dir(), key, spec,
              "the directory is not a run output directory (no run.json, no checkpoints/)")
    else:
        looks_like_path = "/" in spec or spec.endswith(".ckpt") or spec.startswith((".", "~"))
        check(not looks_like_path, key, spec, f"does not exist (must be {what})")


@dataclasses.dataclass
class Run:
    """A run of `phasefix.fit`: `dir` (None for a bare .ckpt file), its MLflow run id and store (None when unknown),
    and `ckpt` when a checkpoint file was named explicitly."""

    dir: Path | None
    run_id: str | None = None
    tracking_uri: str | None = None
    ckpt: Path | None = None

    # ---- finding a run
    @classmethod
    def open(cls, spec: str, tracking_uri: str | None = None, key: str = "run") -> "Run":
        """The run `spec` names (see the module doc); ConfigError naming `key` when it names none."""
        spec = str(spec).strip()
        check(spec != "", key, spec, f"must be {RUN_SPEC}")
        if spec == "last":
            return cls.last(key)
        check_spec(spec, key)
        path = Path(spec).expanduser()
        if path.is_file():
            d = path.resolve().parent.parent
            home = d if (d / RUN_FILE).exists() or (d / "config.yaml").exists() else None
            return cls._from_dir(home, tracking_uri, ckpt=path.resolve()) if home else cls(None, ckpt=path.resolve())
        if path.is_dir():
            return cls._from_dir(path.resolve(), tracking_uri)
        from phasefix import tracking

        c = tracking.client(tracking_uri)
        run_id = tracking.resolve_run_id(c, spec, key)
        run = c.get_run(run_id)
        out = run.data.tags.get("output_dir")
        check(run.data.tags.get("phasefix.kind", "fit") == "fit" and out is not None, key, spec,
              f"MLflow run {run_id} is not a run of phasefix.fit (kind {run.data.tags.get('phasefix.kind')!r})")
        check(Path(out).is_dir(), key, spec, f"the output directory of MLflow run {run_id} is gone: {out}")
        return cls(Path(out), run_id, c.tracking_uri)

    @classmethod
    def last(cls, key: str = "resume") -> "Run":
        """The run whose last checkpoint was written most recently (an interrupted run included)."""
        ckpts = [p for p in outputs_dir().glob(str(checkpoint_path("*/*"))) if (p.parent.parent / RUN_FILE).exists()]
        check(bool(ckpts), key, "last", f"no run with a last checkpoint under {outputs_dir()}")
        newest = max(ckpts, key=lambda p: p.stat().st_mtime)
        return cls._from_dir(newest.parent.parent, None)

    @classmethod
    def _from_dir(cls, d: Path, tracking_uri: str | None, ckpt: Path | None = None) -> "Run":
        from phasefix.tracking import read_json

        info = read_json(d / RUN_FILE) if (d / RUN_FILE).exists() else {}
        return cls(d, info.get("mlflow_run_id"), tracking_uri or info.get("tracking_uri"), ckpt)

    @staticmethod
    def new_dir(output_dir: str | None, name: str) -> Path:
        """Where a new run lives: `output_dir` as given, refused when it already holds a run (Lightning would load
        that run's checkpoints), else <outputs>/<date>/<time>-<name>. Nothing is created yet."""
        if output_dir:
            d = Path(output_dir)
            check(not (d / RUN_FILE).exists() and not (d / "checkpoints").exists(), "output_dir", output_dir,
                  f"holds a run already: continue it with resume={d}, or choose another directory")
            return d
        now = datetime.now()
        return outputs_dir() / f"{now:%Y-%m-%d}" / f"{now:%H%M%S}-{name}"

    @classmethod
    def create(cls, out_dir: Path, run_id: str, tracking_uri: str, config_yaml: str) -> "Run":
        """A new run's home: config.yaml and run.json (the MLflow run it logs to)."""
        from phasefix.tracking import write_json

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.yaml").write_text(config_yaml)
        write_json(out_dir / RUN_FILE, {"mlflow_run_id": run_id, "tracking_uri": tracking_uri})
        return cls(out_dir, run_id, tracking_uri)

    # ---- what it holds
    @property
    def name(self) -> str:
        return str(self.dir or self.ckpt)

    @property
    def config(self):
        """The resolved config the run was trained with (config.yaml), or None."""
        from omegaconf import OmegaConf

        if self.dir is None or not (self.dir / "config.yaml").exists():
            return None
        return OmegaConf.load(self.dir / "config.yaml")

    @property
    def summary(self) -> dict | None:
        from phasefix.tracking import read_json

        p = self.dir / "summary.json" if self.dir else None
        return read_json(p) if p and p.exists() else None

    def checkpoint(self, which: str = "last", key: str = "run") -> Path:
        """checkpoints/<which>.ckpt (the named .ckpt when the run was opened from one)."""
        if self.ckpt is not None:
            return self.ckpt
        ckpt = checkpoint_path(self.dir, which)
        check(ckpt.exists(), key, str(self.dir), f"the directory holds no checkpoints/{which}.ckpt")
        return ckpt

    def load_module(self, which: str = "last", key: str = "run"):
        """(PhaseFixModule in eval mode with the trained weights, its hyper-parameters); weights_only=True."""
        import torch

        from phasefix.module import PhaseFixModule

        ckpt = torch.load(self.checkpoint(which, key), map_location="cpu", weights_only=True)
        hp = dict(ckpt["hyper_parameters"])
        module = PhaseFixModule(**hp)
        module.load_state_dict(ckpt["state_dict"])
        return module.eval(), hp

    def progress(self, which: str = "last", key: str = "run") -> tuple[int, float | None]:
        """(the training step its checkpoint was saved at, seconds trained up to it, None when not recorded)."""
        import torch

        ckpt = torch.load(self.checkpoint(which, key), map_location="cpu", weights_only=True)
        seconds = (ckpt.get("callbacks") or {}).get("TrainClock", {}).get("seconds")
        return int(ckpt["global_step"]), seconds


def open_fit_run(cfg, piece, name: str, model_cfg, tags: dict):
    """(the Run one piece of `phasefix.fit` logs to, its MLflow client). A new run: its MLflow run (tagged with what it
    is and where it was made, params, config; a fork's metric history copied up to its step), then its directory
    (config.yaml, run.json). A continued run: the points its checkpoint's step on rewound (they are logged again),
    config.yaml written again (e.g. a raised max_steps). `model_cfg`: the model as planned (its shape tags);
    `tags`: how this piece trains (precision, compile)."""
    from omegaconf import OmegaConf

    from phasefix import tracking
    from phasefix.config import to_container

    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    run, source = piece.run, piece.source
    c = tracking.client(run.tracking_uri if run is not None else cfg.logger.tracking_uri)  # a resumed run: its store
    if run is None:
        run_id = tracking.create_run(c, cfg.logger.experiment_name, name, tags={
            "model": cfg.model.name, "attention": cfg.model.attention,
            **{k: str(v) for k, v in model_cfg.shape_tags().items()}, "seed": str(cfg.seed), "phasefix.kind": "fit",
            "mitigations": ",".join(cfg.mitigation.keys()) if cfg.get("mitigation") else "none",
            "output_dir": str(piece.out_dir), **tracking.provenance(),
            **({"mlflow.parentRunId": cfg.logger.parent_run_id} if cfg.logger.parent_run_id else {}),
            **({"forked_from": f"{source.run_id} at step {piece.step} ({source.checkpoint()})"} if source else {}),
            **{g: str(cfg[g]) for g in ("regime", "arm") if cfg.get(g)},  # Hydra's choices (phasefix.cli.compose)
            **{str(k): str(v) for k, v in (cfg.logger.tags or {}).items()}})
        tracking.log_params(c, run_id, to_container(cfg))
        tracking.log_config(c, run_id, config_yaml)
        if source is not None:
            tracking.copy_history(tracking.client(source.tracking_uri), source.run_id, c, run_id, piece.step)
        run = Run.create(piece.out_dir, run_id, c.tracking_uri, config_yaml)
    else:
        tracking.rewind(c, run.run_id, step=piece.step)  # the points this piece logs again (from the checkpoint on)
        tracking.set_tags(c, run.run_id, {"resumed_from": f"{run.checkpoint()} (step {piece.step})"})
        (run.dir / "config.yaml").write_text(config_yaml)
        tracking.log_config(c, run.run_id, config_yaml)
    tracking.set_tags(c, run.run_id, tags)
    return run, c


__all__ = ["RUN_FILE", "Run", "check_spec", "open_fit_run", "outputs_dir"]

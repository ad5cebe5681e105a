"""Structured configs behind conf/ (Hydra), and turning a composed config into validated objects.

Every check runs here, before any training or MLflow run starts; a bad value raises `ConfigError` with one line
naming the key and what is allowed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from phasefix.data.layout import PADDINGS
from phasefix.errors import ConfigError, check, check_choice
from phasefix.model.config import ModelConfig

ACCELERATORS = ("cpu", "gpu", "cuda", "auto")


@dataclass
class TrainerConfig:
    accelerator: str = "cpu"
    devices: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    num_threads: int = 2
    max_steps: int = 800
    batch_size: int = 64
    gradient_clip_val: float = 1.0
    val_every_n_steps: int = 250
    checkpoint_every_n_steps: int = 100
    log_every_n_steps: int = 10
    deterministic: bool = True
    progress_bar: bool = True


@dataclass
class OptimConfig:
    lr: float = 3e-3
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    warmup_steps: int = 200
    min_lr_ratio: float = 0.1


@dataclass
class EvalConfig:
    paddings: list[str] = field(default_factory=lambda: list(PADDINGS))
    period: int = 24
    per_residue: int = 48
    val_per_residue: int = 24
    n_boot: int = 2000
    batch_size: int = 256
    seed: int = 1234


@dataclass
class LoggerConfig:
    tracking_uri: str | None = None
    experiment_name: str = "phasefix"
    parent_run_id: str | None = None  # nests the run under a parent (a study's run)
    tags: dict[str, str] = field(default_factory=dict)  # extra MLflow tags


@dataclass
class FitConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: dict[str, Any] = field(default_factory=dict)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    mitigation: dict[str, Any] | None = None
    experiment: dict[str, Any] | None = None
    seed: int = 0
    run_name: str | None = None
    output_dir: str | None = None
    resume: str | None = None
    verbose: bool = False  # the libraries' own output (Lightning, MLflow, datasets) besides phasefix's bars


def register_configs() -> None:
    ConfigStore.instance().store(name="fit_schema", node=FitConfig)


register_configs()


def validate_trainer(t: TrainerConfig | DictConfig) -> None:
    check_choice("trainer.accelerator", t.accelerator, ACCELERATORS)
    for key in ("devices", "max_steps", "batch_size", "val_every_n_steps", "checkpoint_every_n_steps",
                "log_every_n_steps", "num_threads"):
        check(getattr(t, key) >= 1, f"trainer.{key}", getattr(t, key), "must be >= 1")
    check(t.devices == 1 or t.strategy != "auto", "trainer.strategy", t.strategy,
          "must be 'ddp_spawn' or 'ddp' when trainer.devices > 1")
    if t.accelerator in ("gpu", "cuda"):
        import torch

        check(torch.cuda.is_available(), "trainer", "gpu", "no CUDA device is available here: use trainer=cpu")


def validate_optim(o) -> None:
    check(o.lr > 0, "optim.lr", o.lr, "must be > 0")
    check(o.weight_decay >= 0, "optim.weight_decay", o.weight_decay, "must be >= 0")
    check(o.warmup_steps >= 0, "optim.warmup_steps", o.warmup_steps, "must be >= 0")
    check(0 <= o.min_lr_ratio <= 1, "optim.min_lr_ratio", o.min_lr_ratio, "must be in [0, 1]")
    check(len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas), "optim.betas", list(o.betas),
          "must be two numbers in [0, 1)")


def validate_eval(e) -> None:
    for p in e.paddings:
        check_choice("eval.paddings", p, PADDINGS)
    check(len(e.paddings) >= 1, "eval.paddings", list(e.paddings), "must name at least one padding mode")
    for key in ("period", "per_residue", "val_per_residue", "batch_size"):
        check(getattr(e, key) >= 1, f"eval.{key}", getattr(e, key), "must be >= 1")
    check(e.n_boot >= 1, "eval.n_boot", e.n_boot, "must be >= 1")


def model_config(cfg: DictConfig) -> ModelConfig:
    return ModelConfig.from_dict(OmegaConf.to_container(cfg.model, resolve=True))


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


__all__ = ["ConfigError", "EvalConfig", "FitConfig", "LoggerConfig", "OptimConfig", "TrainerConfig",
           "model_config", "to_container", "validate_eval", "validate_optim", "validate_trainer"]

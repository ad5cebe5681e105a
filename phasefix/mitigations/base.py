"""The `Mitigation` interface the training loop calls, and option validation shared by every mitigation.

Call order in the loop: `configure_model` (before the model is built) -> `setup(model)` (after) -> every step
`transform_batch` (data-side controls), `before_forward(step, generator)` (model-side switches for that step's
forward), then, when any mitigation `needs_gates`, `loss(model, model.gates(), step)`:
named scalar terms, already weighted, added to the LM loss and logged as `train/mitigation/<name>`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from phasefix.errors import ConfigError
from phasefix.model.config import ModelConfig

BRANCHES = ("key", "value", "both")


def loss_ramp(step: int, start_step: int = 0, ramp_steps: int = 0) -> float:
    """The warm-up of an added loss term: 0 before start_step, then (step - start_step + 1) / ramp_steps, capped
    at 1 (1 from start_step on when ramp_steps is 0)."""
    if step < start_step:
        return 0.0
    return min(1.0, (step - start_step + 1) / ramp_steps) if ramp_steps > 0 else 1.0


@dataclasses.dataclass
class NoOptions:
    pass


class Mitigation:
    """Base class: every hook is a no-op. Subclasses set `name` and `Options`, a dataclass of the options and their
    defaults (the one source: it is also the Hydra schema of conf/mitigation/<name>.yaml, so a misspelt or mistyped
    option fails at composition), and check values in `validate()` with `self.check` (options given in Python
    skip Hydra's type check)."""

    name: ClassVar[str] = "mitigation"
    Options: ClassVar[type] = NoOptions
    defaults: ClassVar[dict[str, Any]] = {}  # derived from Options for every subclass
    needs_gates: bool = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.defaults = dataclasses.asdict(cls.Options())

    def __init__(self, **options):
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            raise ConfigError(f"mitigation.{self.name}.{unknown[0]} is not an option of {self.name}: allowed keys "
                              f"are {', '.join(sorted(self.defaults)) or '(none)'}")
        self.options = {**self.defaults, **options}
        for key, value in self.options.items():
            setattr(self, key, value)
        self.validate()

    # ---- validation ----
    def validate(self) -> None:
        if "weight" in self.defaults:
            self.check_number("weight", minimum=0.0)
        if "branch" in self.defaults:
            self.check_choice("branch", BRANCHES)
        self.check_schedule()

    def check_schedule(self) -> None:
        """`start_step` and `ramp_steps` (the loss_ramp of a loss term), where the mitigation has them."""
        for key in ("start_step", "ramp_steps"):
            if key in self.defaults:
                self.check_number(key, minimum=0, integer=True)

    def fail(self, key: str, rule: str):
        raise ConfigError(f"mitigation.{self.name}.{key}={self.options.get(key)!r} is invalid: {rule}")

    def check(self, cond: bool, key: str, rule: str) -> None:
        if not cond:
            self.fail(key, rule)

    def check_choice(self, key: str, allowed) -> None:
        self.check(self.options[key] in allowed, key,
                   f"allowed values are {', '.join(repr(a) for a in allowed)}")

    def check_number(self, key: str, minimum: float | None = None, integer: bool = False,
                     nullable: bool = False) -> None:
        value = self.options[key]
        if value is None and nullable:
            return
        kinds = (int,) if integer else (int, float)
        ok = isinstance(value, kinds) and not isinstance(value, bool) and (minimum is None or value >= minimum)
        what = "an integer" if integer else "a number"
        bound = f" >= {minimum}" if minimum is not None else ""
        if not ok:
            self.fail(key, f"must be {'null or ' if nullable else ''}{what}{bound}")

    def require_learned_gates(self, cfg: ModelConfig) -> None:
        """Gate mitigations need compressed attention with learned gates (and a value branch if they use it)."""
        if cfg.attention != "compressed":
            raise ConfigError(f"mitigation={self.name} is invalid with model.attention={cfg.attention!r}: it acts "
                              "on the compressor's gates; use model.attention='compressed'")
        if cfg.gate == "uniform":
            raise ConfigError(f"mitigation={self.name} is invalid with model.gate='uniform': uniform averaging has "
                              "no gates to act on; use model.gate='scalar' or 'vector'")
        if any(shape[0] < 2 for shape in cfg.layer_shapes() if shape):
            raise ConfigError(f"mitigation={self.name} is invalid with a one-slot window (model.window="
                              f"{cfg.window}, model.layer_compression={cfg.layer_compression}): it has nothing to "
                              "spread")
        if getattr(self, "branch", None) == "value" and cfg.tied_kv:
            raise ConfigError(f"mitigation.{self.name}.branch='value' is invalid with model.tied_kv=true: tied "
                              "K/V has no value gate; use branch='key'")

    def branches(self, available) -> list[str]:
        """The gate branches this mitigation acts on, among those the model has."""
        branch = getattr(self, "branch", None) or "key"  # resolved by validate() where the default depends on a mode
        want = ("key", "value") if branch == "both" else (branch,)
        return [b for b in want if b in available]

    # ---- hooks the loop calls ----
    def configure_model(self, model_cfg: ModelConfig) -> ModelConfig:
        """Before the model is built; return a (possibly new) config, or raise ConfigError if incompatible."""
        return model_cfg

    def setup(self, model: torch.nn.Module) -> None:
        """After the model is built (and before the optimiser is)."""

    def transform_batch(self, input_ids: torch.Tensor, labels: torch.Tensor, generator: torch.Generator | None):
        """Data-side controls: return (input_ids, labels), labels aligned with input_ids as given."""
        return input_ids, labels

    def before_forward(self, step: int, generator: torch.Generator | None) -> None:
        """Before each training step's forward (after `transform_batch`, from the same generator)."""

    def loss(self, model: torch.nn.Module, gates: list[dict], step: int = 0) -> dict[str, torch.Tensor]:
        """Named scalar terms at training step `step`, already weighted; empty when the mitigation has no loss."""
        return {}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({opts})"


def as_options(value) -> dict:
    """A mitigation's options from a DictConfig/dict/None."""
    if value is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(value, DictConfig):
            value = OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    if not isinstance(value, Mapping):
        raise ConfigError(f"mitigation options must be a mapping of option -> value, got {value!r}")
    return dict(value)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The CompressedQwen3 inside torch.compile / DDP wrappers."""
    for attr in ("_orig_mod", "module"):
        while hasattr(model, attr) and not hasattr(model, "compressors"):
            model = getattr(model, attr)
    return model

"""Mitigations of phase sensitivity (science.md §6; math in docs/mitigations.md).

`build_mitigations(cfg.mitigation)` validates every option and returns the `Mitigation`s the training loop calls:
gate-diversity constraints (per head by default, the union, or a hard parametrisation), head and layer coordination
losses on key and value gates, the heads' joint slot coverage, entry dropout across layers, and the control
baselines phase_jitter and staggered_offsets. Select them with `+mitigation=NAME` or `+mitigation=[a,b]`; each class's `Options` dataclass
holds its options and defaults (the schema conf/mitigation/NAME.yaml selects).
"""
from __future__ import annotations

from collections.abc import Mapping

from phasefix.errors import ConfigError
from phasefix.model.config import ModelConfig
from phasefix.mitigations.base import Mitigation, as_options
from phasefix.mitigations.controls import PhaseJitter, StaggeredOffsets
from phasefix.mitigations.entry_dropout import EntryDropout
from phasefix.mitigations.gate_losses import (GateDiversity, HeadCoord, LayerCoord, SlotCoverage, phase_coverage,
                                              slot_assignment, token_phase_distribution)
from phasefix.mitigations.gates import answered_phases, effective_slots, static_gate_distribution

REGISTRY: dict[str, type[Mitigation]] = {
    cls.name: cls for cls in (GateDiversity, HeadCoord, LayerCoord, SlotCoverage, EntryDropout, PhaseJitter,
                              StaggeredOffsets)
}


def build_mitigations(cfg: Mapping | None) -> list[Mitigation]:
    """cfg: mitigation name -> options (the Hydra node `cfg.mitigation`), or None/empty for none. A list of
    names (default options) is accepted too. Raises ConfigError on an unknown name or a bad option."""
    if cfg is None:
        return []
    if isinstance(cfg, str):
        cfg = [cfg]
    items = [(name, None) for name in cfg] if not isinstance(cfg, Mapping) else list(cfg.items())
    out = []
    for name, options in items:
        if name not in REGISTRY:
            raise ConfigError(f"mitigation={name} is invalid: allowed values are {', '.join(sorted(REGISTRY))}")
        out.append(REGISTRY[name](**as_options(options)))
    return out


def configured_model(model: Mapping, mitigation: Mapping | None) -> tuple[ModelConfig, list[Mitigation]]:
    """The one rule that turns a run's `model` and `mitigation` nodes into objects: the model config as the
    mitigations change it (`Mitigation.configure_model`, in order) and the mitigations. `phasefix.fit.plan` builds
    a run's with it and hands them to the module; a checkpoint's hyper-parameters are rebuilt with it too."""
    model_cfg = ModelConfig.from_dict(dict(model))
    mitigations = build_mitigations(mitigation)
    for m in mitigations:
        model_cfg = m.configure_model(model_cfg)
    return model_cfg, mitigations


def mitigation_names(mitigations: list[Mitigation]) -> str:
    """A short tag for run names, e.g. 'gate_diversity+head_coord'."""
    return "+".join(m.name for m in mitigations)


__all__ = ["EntryDropout", "GateDiversity", "HeadCoord", "LayerCoord", "Mitigation", "PhaseJitter", "REGISTRY", "SlotCoverage",
           "StaggeredOffsets", "answered_phases", "build_mitigations", "configured_model", "effective_slots",
           "mitigation_names", "phase_coverage", "slot_assignment", "static_gate_distribution",
           "token_phase_distribution"]

"""entry_dropout: what one layer's entries carry, another layer must be able to carry (docs/mitigations.md).

Issue 70's depth failure: in coverage_w8s8_curric the seeds that miss the goal with late gate diversity (and with the
bridge and late gate diversity together) leave layer 0's compressed entries idle (knocking either of its heads out
costs nothing) while layer 1's two heads split the phases, so a phase one of them carries weakly has no second
reader. The gate terms read the gates, and layer 0's near-uniform gates already look well spread. This acts on the
lookup itself, as dropout does on units: on a share `p` of the training steps one compressed layer, drawn uniformly,
attends without its entries (its local window only), so the loss of that step is paid through the other layers'
entries. Training only: the model, its cache and its evaluation are unchanged.
"""
from __future__ import annotations

import torch

from phasefix.config import EntryDropoutOptions
from phasefix.errors import ConfigError
from phasefix.mitigations.base import Mitigation
from phasefix.model.config import ModelConfig


class EntryDropout(Mitigation):
    """On a share `p` of the training steps from `start_step` on, one compressed layer (drawn uniformly from the
    step's generator) loses its compressed entries for that step's forward (`Attention.drop_entries`)."""

    name = "entry_dropout"
    Options = EntryDropoutOptions

    def validate(self):
        super().validate()
        self.check_number("p", minimum=0.0)
        self.check(self.p <= 1, "p", "must be a share of the training steps, in [0, 1]")
        self._attentions: list[torch.nn.Module] = []

    def configure_model(self, model_cfg: ModelConfig) -> ModelConfig:
        compressed = sum(1 for shape in model_cfg.layer_shapes() if shape) if model_cfg.attention == "compressed" else 0
        if compressed < 2:
            raise ConfigError(f"mitigation=entry_dropout is invalid with {compressed} compressed layer(s) "
                              f"(model.attention={model_cfg.attention!r}, model.num_layers={model_cfg.num_layers}, "
                              f"model.layer_compression={model_cfg.layer_compression}): it needs at least 2, so "
                              "that another layer's entries can carry what the dropped layer's did")
        return model_cfg

    def setup(self, model: torch.nn.Module) -> None:
        self._attentions = [block.attn for block in model.layers if block.attn.compressor is not None]

    def before_forward(self, step: int, generator: torch.Generator | None) -> None:
        for attn in self._attentions:
            attn.drop_entries = False
        if step < self.start_step or self.p == 0:
            return
        draw = torch.rand((), generator=generator)
        layer = int(torch.randint(len(self._attentions), (), generator=generator))
        if draw < self.p:
            self._attentions[layer].drop_entries = True

    def dropped(self) -> list[int]:
        """The indices (among the compressed layers) whose entries the next forward drops."""
        return [i for i, attn in enumerate(self._attentions) if attn.drop_entries]

"""Control baselines (science.md §6): phase-jittered training data and staggered compression grids."""
from __future__ import annotations

import dataclasses

import torch

from phasefix.config import PhaseJitterOptions, StaggeredOffsetsOptions  # noqa: F401  (the schemas: phasefix.config)
from phasefix.errors import ConfigError
from phasefix.mitigations.base import Mitigation
from phasefix.model.config import ModelConfig

IGNORE_INDEX = -100
JITTER_MODES = ("pad", "crop")


class PhaseJitter(Mitigation):
    """Shift every training sequence by a random k in [0, max_shift] (default S-1) tokens: k filler tokens go in
    after the first `keep_first` tokens (the BOS), so each token's phase moves by k while labels stay aligned (the
    filler is unsupervised). `pad` appends max_shift-k filler at the end (all content kept; T grows by max_shift);
    `crop` keeps T and drops the last k tokens (and their labels). Expected not to help: the data's prefix padding
    already shows every phase in training."""

    name = "phase_jitter"
    Options = PhaseJitterOptions

    def validate(self):
        super().validate()
        self.check_number("max_shift", minimum=0, integer=True, nullable=True)
        self.check_choice("mode", JITTER_MODES)
        self.check_number("keep_first", minimum=0, integer=True)
        self.check_number("filler_token", minimum=0, integer=True)
        self._shift = self.max_shift

    def configure_model(self, model_cfg: ModelConfig) -> ModelConfig:
        if self.max_shift is None:
            self._shift = model_cfg.stride - 1
        if self.filler_token >= model_cfg.vocab_size:
            self.fail("filler_token", f"must be < model.vocab_size ({model_cfg.vocab_size})")
        return model_cfg

    def transform_batch(self, input_ids, labels, generator):
        if self._shift is None:
            raise RuntimeError("phase_jitter: call configure_model first (it reads the stride) or set max_shift")
        K = int(self._shift)
        B, T = input_ids.shape
        if K == 0 or T <= self.keep_first:
            return input_ids, labels
        gen_device = generator.device if generator is not None else torch.device("cpu")
        k = torch.randint(0, K + 1, (B,), generator=generator, device=gen_device).to(input_ids.device)  # [B]
        T_out = T + K if self.mode == "pad" else T
        p = torch.arange(T_out, device=input_ids.device)[None, :]  # [1, T_out]
        head = p < self.keep_first
        src = torch.where(head, p, p - k[:, None])  # [B, T_out] source position of every output token
        valid = head | ((src >= self.keep_first) & (src < T))
        src = src.clamp(0, T - 1)
        ids = torch.where(valid, input_ids.gather(1, src), torch.full_like(src, self.filler_token))
        lab = torch.where(valid, labels.gather(1, src), torch.full_like(src, IGNORE_INDEX))
        return ids.to(input_ids.dtype), lab.to(labels.dtype)


class StaggeredOffsets(Mitigation):
    """Each layer compresses on its own grid: layer l gets offset d_l = floor(l*S_l/L) (spread over [0, S_l): the
    `model.grid_offsets=stagger` rule), or the given `offsets` (cycled over layers), so a phase that is one layer's
    boundary is another's interior. Same windows, same stride: the compression ratio is unchanged."""

    name = "staggered_offsets"
    Options = StaggeredOffsetsOptions

    def validate(self):
        super().validate()
        offs = self.offsets
        ok = offs is None or (isinstance(offs, (list, tuple)) and len(offs) >= 1 and all(
            isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offs))
        self.check(ok, "offsets", "must be null (spread over [0, S)) or a non-empty list of integers >= 0")

    def layer_offsets(self, model_cfg: ModelConfig) -> list[int]:
        if self.offsets is not None:
            return [int(o) for o in self.offsets]
        staggered = dataclasses.replace(model_cfg, grid_offsets="stagger")
        return [staggered.grid_offset(layer) for layer in range(model_cfg.num_layers)]

    def configure_model(self, model_cfg):
        if model_cfg.attention != "compressed":
            raise ConfigError(f"mitigation=staggered_offsets is invalid with model.attention="
                              f"{model_cfg.attention!r}: it shifts the compression grid")
        if model_cfg.grid_offsets != "none" and any(model_cfg.grid_offsets):
            raise ConfigError(f"mitigation=staggered_offsets is invalid with model.grid_offsets="
                              f"{model_cfg.grid_offsets}: set the offsets in mitigation.staggered_offsets.offsets")
        offsets = self.layer_offsets(model_cfg)
        strides = [shape[1] if shape else None for shape in model_cfg.layer_shapes()]
        if any(S is not None and offsets[layer % len(offsets)] >= S for layer, S in enumerate(strides)):
            self.fail("offsets", f"must be integers in [0, S_l) for every layer's stride S_l ({strides})")
        if self.offsets is None and len(set(offsets)) < 2:
            raise ConfigError(f"mitigation=staggered_offsets is invalid with model.num_layers="
                              f"{model_cfg.num_layers}, model.stride={model_cfg.stride}: every layer would get "
                              "offset 0 (needs at least 2 layers and stride >= 2)")
        return dataclasses.replace(model_cfg, grid_offsets=offsets)

"""Mitigations on the gates' static slot preferences (science.md §5-§6): gate diversity (soft penalty or a hard
parametrisation), head coordination, layer coordination and the heads' joint slot coverage. Formulas and reasons:
docs/mitigations.md.

Every term works on the static distributions P [HKV, W] (E over batch and complete windows of the gates), so it
costs a mean over [B, N, W, HKV] and a few [HKV, W]-sized ops per layer: negligible against the forward pass.
"""
from __future__ import annotations

import math

import torch

from phasefix.config import (CoordOptions, GateDiversityOptions,  # noqa: F401  (the schemas: phasefix.config)
                             SlotCoverageOptions)
from phasefix.errors import ConfigError
from phasefix.mitigations.base import BRANCHES, Mitigation, loss_ramp, unwrap
from phasefix.mitigations.gates import (answered_phases, entropy, head_slot_phases, pooled_slots,
                                      static_gate_distribution)
from phasefix.model.config import ModelConfig

HARD_MASK = 1e9  # logit penalty of a slot outside a head's assignment (exp(-1e9) is exactly 0 in float32)
LAYOUTS = ("block", "interleaved")
MODES = ("per_head", "soft", "hard")
COMBINES = ("or", "mean")  # slot_coverage: how the heads' phase distributions make one coverage


class GateMitigation(Mitigation):
    """A loss on the static gate distributions of the chosen branches, averaged over layers and branches."""

    needs_gates = True

    def configure_model(self, model_cfg: ModelConfig) -> ModelConfig:
        self.require_learned_gates(model_cfg)
        return model_cfg

    def statics(self, model, gates) -> tuple[ModelConfig, list[tuple[int, str, torch.Tensor]]]:
        """(config, [(layer, branch, P [HKV, W])]) for the chosen branches of every compressed layer."""
        config = unwrap(model).config
        static = static_gate_distribution(gates, config)
        return config, [(layer, b, branches[b]) for layer, branches in enumerate(static)
                        for b in self.branches(branches)]

    def loss(self, model, gates, step: int = 0):
        ramp = loss_ramp(step, self.start_step, self.ramp_steps)
        config, statics = self.statics(model, gates)
        term = self.term(config, statics)
        return {self.name: self.weight * ramp * term}

    def term(self, config: ModelConfig, statics) -> torch.Tensor:
        raise NotImplementedError


def _mean(terms: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(terms).mean() if terms else torch.zeros(())


# ------------------------------------------------------------------------------------------------ gate diversity
def slot_assignment(window: int, num_kv_heads: int, layout: str = "block") -> torch.Tensor:
    """Which slots each KV head may read: bool [W, HKV]. Every slot has at least one head, every head at least one
    slot, and the sets are disjoint when HKV <= W. `block`: head h gets the contiguous slots i with
    floor(i*HKV/W) = h (anchors spaced W/HKV apart); `interleaved`: slots i with i mod HKV = h. With more heads
    than slots, head h gets the one slot floor(h*W/HKV) (block) or h mod W (interleaved)."""
    W, H = window, num_kv_heads
    i = torch.arange(W)[:, None]
    h = torch.arange(H)[None, :]
    if H <= W:
        owner = (i * H) // W if layout == "block" else i % H
        return owner == h
    slot = (h * W) // H if layout == "block" else h % W
    return slot == i


class GateDiversity(GateMitigation):
    """Gate diversity: no head settles on a fixed slot (per_head), the heads together cover every slot (soft), or
    the heads cannot collapse at all (hard).

    per_head (default): D = mean over layers l, branches and KV heads h of KL(P_{l,h} || uniform) / log W
    = 1 - H(P_{l,h}) / log W: 0 when every head's static distribution is uniform, 1 when a head reads one slot for
    every input. A statically uniform head can still be one-hot in every window: it must route by content instead
    of by slot, so no phase is left to nobody.
    soft: D = 1 - H(m)/log W with m = mean_h P_h, the layer's mean static gate distribution (0 when the heads
    together spread evenly over the slots, 1 when they all sit on one slot). It binds only the union: two heads
    each collapsed on half the slots pay nothing.
    hard: fixed slot priors give each KV head its own slots (`slot_assignment`), so no learned parameter can move
    two heads onto the same slot; the value gate's assignment is the key's shifted by `value_shift` slots (the
    theory's value-on-the-next-slot). `strength: null` masks the other slots (a hard constraint); a number makes
    it a fixed anchor of that many logits that learned gates could overcome. `freeze_bias` also zeroes and
    freezes the learned per-slot bias b_i of the chosen branches, so static preferences come only from the
    data-dependent term Z_i h.
    `branch: null` means both for per_head (a head collapsed on its value slot is as uncovered as on its key slot)
    and key for soft and hard (their behaviour before per_head existed).
    """

    name = "gate_diversity"
    Options = GateDiversityOptions

    def validate(self):
        self.check_number("weight", minimum=0.0)
        self.check_choice("mode", MODES)
        self.check(self.branch is None or self.branch in BRANCHES, "branch",
                   "allowed values are null (both for per_head, key otherwise), 'key', 'value', 'both'")
        if self.branch is None:
            self.branch = "both" if self.mode == "per_head" else "key"
        self.check_choice("layout", LAYOUTS)
        self.check_number("strength", minimum=0.0, nullable=True)
        self.check_number("value_shift", integer=True)
        self.check(isinstance(self.freeze_bias, bool), "freeze_bias", "must be true or false")
        self.check_schedule()
        self.needs_gates = self.mode != "hard"

    def configure_model(self, model_cfg):
        super().configure_model(model_cfg)
        if self.mode == "hard" and model_cfg.num_kv_heads < 2:
            raise ConfigError("mitigation.gate_diversity.mode='hard' is invalid with model.num_kv_heads=1: the one "
                              "head would be assigned every slot (no constraint); use mode='soft'")
        return model_cfg

    def priors(self, config: ModelConfig, window: int | None = None) -> dict[str, torch.Tensor]:
        """The fixed slot priors [W, HKV] of each chosen branch (0 on assigned slots, -strength elsewhere) for a
        compressor of `window` slots (model.window by default)."""
        mask = slot_assignment(window or config.window, config.num_kv_heads, self.layout)
        penalty = HARD_MASK if self.strength is None else float(self.strength)
        branches = self.branches(("key",) if config.tied_kv else ("key", "value"))
        out = {}
        for b in branches:
            m = mask if b == "key" else torch.roll(mask, shifts=self.value_shift, dims=0)
            out[b] = torch.where(m, 0.0, -penalty)
        return out

    def setup(self, model):
        if self.mode != "hard":
            return
        model = unwrap(model)
        for comp in model.compressors():
            for b, prior in self.priors(model.config, comp.window).items():
                buf = getattr(comp, f"{b}_slot_prior")
                buf.copy_(prior.to(buf))
                bias = getattr(comp, f"{b}_gate_bias", None)
                if self.freeze_bias and bias is not None:
                    with torch.no_grad():
                        bias.zero_()
                    bias.requires_grad_(False)

    def loss(self, model, gates, step: int = 0):
        if self.mode == "hard":
            return {}
        return super().loss(model, gates, step)

    def term(self, config, statics):
        if self.mode == "per_head":  # every (layer, branch, head) counts once: [HKV] deficits per layer and branch
            return torch.cat([1.0 - entropy(P) / math.log(P.shape[1]) for _, _, P in statics]).mean() \
                if statics else torch.zeros(())
        return _mean([1.0 - entropy(P.mean(0)) / math.log(P.shape[1]) for _, _, P in statics])


# ------------------------------------------------------------------------------------------------ coordination
def phase_coverage(config: ModelConfig, layer: int, branch: str, P: torch.Tensor) -> torch.Tensor:
    """The static phase distribution q [HKV, S] of a layer's heads: q_h(r) = sum of P_h over the slots that answer
    target-key phase r (`answered_phases`). It sums to 1 minus the mass on the slot that answers nothing."""
    return torch.einsum("hw,hws->hs", P, answered_phases(config, layer, branch, P.device))


class HeadCoord(GateMitigation):
    """KV heads of one layer specialise on complementary phases: the mean pairwise overlap of their static phase
    distributions q_h (`phase_coverage`), plus the mean mass the heads put on the slot that answers nothing,
        O = 1/(HKV(HKV-1)) sum_{h != h'} <q_h, q_h'>  +  1/HKV sum_h (1 - sum_r q_h(r)),
    0 when the heads read disjoint answerable phases, 1 when they all sit on one phase or on the dead slot (a read
    that answers nothing costs as much as a collision, so no head escapes the overlap onto the boundary)."""

    name = "head_coord"
    Options = CoordOptions

    def configure_model(self, model_cfg):
        super().configure_model(model_cfg)
        if model_cfg.num_kv_heads < 2:
            raise ConfigError("mitigation=head_coord is invalid with model.num_kv_heads=1: one head has no other "
                              "head to coordinate with; use layer_coord or gate_diversity")
        return model_cfg

    def term(self, config, statics):
        terms = []
        for layer, branch, P in statics:
            q = phase_coverage(config, layer, branch, P)  # [HKV, S]
            G = q @ q.T  # [HKV, HKV]
            n = q.shape[0]
            dead = 1.0 - q.sum(1)  # [HKV]
            terms.append((G.sum() - G.diagonal().sum()) / (n * (n - 1)) + dead.mean())
        return _mean(terms)


class LayerCoord(GateMitigation):
    """What one layer leaves uncovered another covers: the mean over phases r of the probability that no head of
    any layer reads r, treating the static phase weights q_{l,h}(r) as independent coverage probabilities,
        U = 1/|R| sum_{r in R} prod_{l,h} (1 - q_{l,h}(r)),
    R the phases some layer can answer (a phase that is every layer's boundary has no gradient: left out). A
    layer's own boundary phase is never covered by it (`phase_coverage`). 0 when every answerable phase has some
    head fully on it, (|R|-1)/|R| when every head sits on one phase, 1 when all sit on dead slots. Phases, not
    slots: layers with different grid offsets (or W > S) are compared on the tokens they read."""

    name = "layer_coord"
    Options = CoordOptions

    def configure_model(self, model_cfg):
        super().configure_model(model_cfg)
        if model_cfg.num_layers * model_cfg.num_kv_heads < 2:
            raise ConfigError("mitigation=layer_coord is invalid with one layer and one KV head: the loss is "
                              "constant; use gate_diversity")
        return model_cfg

    def term(self, config, statics):
        terms = []
        for b in dict.fromkeys(b for _, b, _ in statics):
            layers = [(layer, P) for layer, bb, P in statics if bb == b]
            # phases mod the model's phase stride (the layers' strides' lcm): phase r of a layer of stride S_l
            # covers every r' = r mod S_l
            fold = [torch.arange(config.phase_stride) % pooled_slots(config, layer)[1] for layer, _ in layers]
            q = torch.cat([phase_coverage(config, layer, b, P)[:, f.to(P.device)]
                           for (layer, P), f in zip(layers, fold)])  # [L*HKV, phase_stride]
            answerable = torch.stack([(answered_phases(config, layer, b).sum((0, 1)) > 0)[f]
                                      for (layer, _), f in zip(layers, fold)])
            uncovered = torch.prod(1.0 - q, dim=0)  # [S]
            terms.append(uncovered[answerable.any(0).to(q.device)].mean())
        return _mean(terms)


# ------------------------------------------------------------------------------------------------ joint coverage
def token_phase_distribution(config: ModelConfig, layer: int, P: torch.Tensor) -> torch.Tensor:
    """The static weight [HKV, S] each head puts on each token phase: q_h(r) = sum of P_h(i) over the slots i whose
    token has phase r on the head's own grid (`head_slot_phases`: spread offsets shift it per head; with W > S
    several slots share a phase). It sums to 1 per head."""
    S = pooled_slots(config, layer)[1]  # the layer's stride (model.layer_compression)
    phases = torch.nn.functional.one_hot(head_slot_phases(config, layer, P.device), S).to(P.dtype)
    return torch.einsum("hw,hws->hs", P, phases)


class SlotCoverage(GateMitigation):
    """The KV heads of a layer together read every token phase: what the heads carry jointly, not each head's
    entropy. Per layer and branch, the heads' static phase weights q_h(r) (`token_phase_distribution`) combine into
    one coverage u(r) = 1 - prod_h (1 - q_h(r)) (`combine: or`: the chance some head reads r, taking q_h(r) as the
    chance head h does) or mean_h q_h(r) (`mean`). Phase r's share of the weight it needs, `floor` times one
    head's fair share 1/S, is c(r) = min(1, S u(r) / floor), and the term is a log barrier on the shortfall,
        C = 1/S sum_r log((1 + eps) / (c(r) + eps)) / log((1 + eps) / eps):
    0 when every phase has what it needs (floor <= 2 - 1/S: two heads each on half the phases, or both uniform),
    1/S for each phase no head reads, (S-1)/S when all heads sit on one phase. Flat above the floor, so it neither
    rewards nor forbids specialisation; below it the pull on a phase grows as the phase empties (1/(c + eps))."""

    name = "slot_coverage"
    Options = SlotCoverageOptions

    def validate(self):
        super().validate()
        self.check_choice("combine", COMBINES)
        for key in ("floor", "eps"):
            self.check_number(key, minimum=0.0)
        self.check(self.floor > 0, "floor", "must be > 0 (a share of the fair weight 1/S)")
        self.check(self.eps > 0, "eps", "must be > 0 (an unread phase would cost infinitely much)")

    def term(self, config, statics):
        terms = []
        for layer, _, P in statics:
            q = token_phase_distribution(config, layer, P)  # [HKV, S]
            u = 1.0 - torch.prod(1.0 - q, dim=0) if self.combine == "or" else q.mean(0)
            c = (u * q.shape[1] / self.floor).clamp(max=1.0)
            eps = self.eps
            terms.append(torch.log((1 + eps) / (c + eps)).mean() / math.log((1 + eps) / eps))
        return _mean(terms)

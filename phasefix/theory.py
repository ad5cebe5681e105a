"""`python -m phasefix.theory`: the idealised induction model of science.md §5 (last bullet), simulated.

A sequence is L chunks of S distinct tokens, drawn from N fixed near-equiangular embeddings (random unit vectors in
`dim` dimensions). m < S heads each compress every chunk into one key and one value with log-linear gates over the
S slots of the chunk (W = S: slot = phase):

    a^k_{h,j,i} = softmax_i (w^k_{h,i} . e_{j,i} + b^k_{h,i}),   K_{h,j} = sum_i a^k_{h,j,i} e_{j,i}
    a^v_{h,j,i} = softmax_i (w^v_{h,i} . e_{j,i} + b^v_{h,i}),   V_{h,j} = sum_i a^v_{h,j,i} e_{j,i}

(the payload maps are the identity). The induction readout: a query token x = e_{j*,i*} from the context must
retrieve the token after it, e_{j*,i*+1}: every head attends over the chunks with logits beta <x, K_{h,j}>, the
outputs o = sum_h sum_j p_{h,j} V_{h,j} are read out with logits gamma <e_n, o> over the N tokens, and the loss is
the cross-entropy. Only the gates are trained.

Temperatures: with a small readout temperature gamma the loss is nearly linear in the head outputs, so each head's
gradient hardly depends on the others (the theory's regime: spreading heads out changes the loss only at second
order) and heads settle where their random initial preference points, colliding at about the chance rate. With a
large gamma the saturating cross-entropy itself pushes heads apart while the gates are still soft. The attention
temperature beta must be small enough that a uniform key gate barely finds the query's chunk (beta/S < log L);
otherwise every head retrieves every phase roughly and nothing drives the gates to concentrate.

A head whose key gate sits on slot i and whose value gate sits on slot i+1 answers every query of phase i; the
boundary phase S-1 (whose next token is in the next chunk) cannot be answered by any head. With m < S heads at
most m phases are covered, fewer when heads collide on a slot. The optional head-coordination term is the
mitigation's (`phasefix.mitigations.HeadCoord`): the mean pairwise overlap of the heads' static key-gate
distributions, added to the loss with weight `--coord-weight`.

Prints a summary and writes `theory.png` and `summary.json` under `out` (default outputs/theory/). A Hydra app
(conf/theory.yaml over `TheoryConfig`): `python -m phasefix.theory heads=3 stride=6 coord_weight=1`; the earlier
`--heads 3 --coord-weight 1` forms still work (`shim`).
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from hydra.core.config_store import ConfigStore

from phasefix.paths import OUTPUTS_DIR


@dataclass
class SimConfig:
    heads: int = 3  # m < S
    stride: int = 6  # S: slots per chunk (= phases)
    chunks: int = 8  # L
    vocab: int = 64  # N
    dim: int = 32  # embedding dimension (unit vectors; |cos| ~ 1/sqrt(dim) between tokens)
    beta: float = 4.0  # attention temperature: weak enough that a uniform key gate barely finds the chunk
    gamma: float = 1.0  # readout temperature: small = nearly linear readout, heads add up independently
    steps: int = 600
    batch: int = 64
    lr: float = 0.2  # Adam
    init_std: float = 0.1  # std of the gate weights w
    bias_init_std: float = 1.0  # std of the gate biases b (a random initial slot preference per head)
    init_shared: float = 0.0  # share of the bias variance common to all heads (heads start alike: collisions)
    coord_weight: float = 0.0  # weight of the head-coordination term
    seed: int = 0

    def validate(self) -> None:
        from phasefix.errors import check

        check(self.stride >= 2, "stride", self.stride, "must be >= 2")
        check(1 <= self.heads < self.stride, "heads", self.heads, f"must be in [1, stride={self.stride})")
        check(self.vocab >= self.stride, "vocab", self.vocab, f"must be >= stride={self.stride} (distinct tokens "
              "per chunk)")
        check(self.chunks >= 1 and self.steps >= 0 and self.batch >= 1, "chunks/steps/batch",
              (self.chunks, self.steps, self.batch), "must be positive")
        check(self.coord_weight >= 0, "coord_weight", self.coord_weight, "must be >= 0")
        check(0 <= self.init_shared <= 1, "init_shared", self.init_shared, "must be in [0, 1]")


class InductionSim(torch.nn.Module):
    """The gates of m heads (the only parameters) and the fixed embeddings."""

    def __init__(self, cfg: SimConfig, generator: torch.Generator):
        super().__init__()
        self.cfg = cfg
        m, S, d = cfg.heads, cfg.stride, cfg.dim
        emb = torch.randn(cfg.vocab, d, generator=generator)
        self.register_buffer("emb", emb / emb.norm(dim=1, keepdim=True))
        self.key_w = torch.nn.Parameter(torch.randn(m, S, d, generator=generator) * cfg.init_std)
        self.value_w = torch.nn.Parameter(torch.randn(m, S, d, generator=generator) * cfg.init_std)
        self.key_b = torch.nn.Parameter(self._bias_init(generator))
        self.value_b = torch.nn.Parameter(self._bias_init(generator))

    def _bias_init(self, generator) -> torch.Tensor:
        """b_h = std * (sqrt(rho) z + sqrt(1 - rho) z_h), rho = init_shared: a common and a per-head part."""
        cfg = self.cfg
        rho = cfg.init_shared
        common = torch.randn(1, cfg.stride, generator=generator)
        own = torch.randn(cfg.heads, cfg.stride, generator=generator)
        return cfg.bias_init_std * (math.sqrt(rho) * common + math.sqrt(1 - rho) * own)

    def gates(self, E: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """E [B, L, S, d] -> key and value gate distributions [B, m, L, S]."""
        ak = torch.softmax(torch.einsum("blsd,hsd->bhls", E, self.key_w) + self.key_b[None, :, None, :], dim=-1)
        av = torch.softmax(torch.einsum("blsd,hsd->bhls", E, self.value_w) + self.value_b[None, :, None, :], dim=-1)
        return ak, av

    def forward(self, tokens: torch.Tensor, query: torch.Tensor):
        """tokens [B, L, S], query [B] flat position of the query token -> (logits [B, N], ak, av)."""
        cfg = self.cfg
        B = tokens.shape[0]
        E = self.emb[tokens]  # [B, L, S, d]
        ak, av = self.gates(E)
        K = torch.einsum("bhls,blsd->bhld", ak, E)
        V = torch.einsum("bhls,blsd->bhld", av, E)
        x = self.emb[tokens.reshape(B, -1)[torch.arange(B), query]]  # [B, d]
        p = torch.softmax(cfg.beta * torch.einsum("bd,bhld->bhl", x, K), dim=-1)
        o = torch.einsum("bhl,bhld->bd", p, V)
        return cfg.gamma * o @ self.emb.T, ak, av


def sample(cfg: SimConfig, batch: int, generator: torch.Generator):
    """Tokens [B, L, S] (S distinct tokens per chunk), query positions [B] (any token but the last), targets [B]."""
    L, S = cfg.chunks, cfg.stride
    tokens = torch.rand(batch, L, cfg.vocab, generator=generator).argsort(dim=-1)[..., :S]
    query = torch.randint(0, L * S - 1, (batch,), generator=generator)
    target = tokens.reshape(batch, -1)[torch.arange(batch), query + 1]
    return tokens, query, target


def coordination(P: torch.Tensor, weight: float) -> torch.Tensor:
    """The head-coordination mitigation's term on static key-gate distributions P [m, S] (W = S, one layer)."""
    from phasefix.mitigations import HeadCoord
    from phasefix.model.config import ModelConfig

    m, S = P.shape
    if m < 2:
        return P.new_zeros(())
    config = ModelConfig(window=S, stride=S, num_heads=m, num_kv_heads=m)
    return weight * HeadCoord(weight=weight).term(config, [(0, "key", P)])


def train(cfg: SimConfig, log_every: int = 0) -> dict:
    """Train the gates; returns the model, the loss curve and the final statistics (see `statistics`)."""
    cfg.validate()
    g = torch.Generator().manual_seed(cfg.seed)
    model = InductionSim(cfg, g)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    losses, coords = [], []
    for step in range(cfg.steps):
        tokens, query, target = sample(cfg, cfg.batch, g)
        logits, ak, _ = model(tokens, query)
        loss = F.cross_entropy(logits, target)
        total = loss
        if cfg.coord_weight > 0:
            c = coordination(ak.mean(dim=(0, 2)), cfg.coord_weight)
            total = total + c
            coords.append(float(c.detach()))
        opt.zero_grad()
        total.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if log_every and (step + 1) % log_every == 0:
            print(f"  step {step + 1:>5}  loss {np.mean(losses[-log_every:]):.3f}")
    stats = statistics(model, torch.Generator().manual_seed(cfg.seed + 10_000))
    return {"model": model, "losses": losses, "coord": coords, **stats}


@torch.no_grad()
def statistics(model: InductionSim, generator: torch.Generator, n: int = 4096) -> dict:
    """Static key/value gate distributions [m, S], static and per-window effective slots, preferred slots,
    collisions, accuracy by query phase, and coverage (of the S-1 phases that can be answered: those whose
    accuracy is >= 0.5, and those with a head whose key gate prefers the phase and value gate the next slot)."""
    cfg = model.cfg
    S = cfg.stride
    tokens, query, target = sample(cfg, n, generator)
    logits, ak, av = model(tokens, query)
    correct = (logits.argmax(-1) == target).double()
    phase = query % S
    acc = torch.zeros(S, dtype=torch.float64).index_add_(0, phase, correct) / torch.bincount(phase, minlength=S)
    Pk, Pv = ak.mean(dim=(0, 2)), av.mean(dim=(0, 2))  # [m, S]
    ent = lambda p: torch.exp(-torch.special.xlogy(p, p).sum(-1))  # noqa: E731
    key_slot, value_slot = Pk.argmax(-1), Pv.argmax(-1)
    structural = {int(k) for k, v in zip(key_slot, value_slot) if int(k) < S - 1 and int(v) == int(k) + 1}
    counts = torch.bincount(key_slot, minlength=S)
    acc_np = acc.numpy()
    return {"key_static": Pk.numpy(), "value_static": Pv.numpy(),
            "key_static_eff": ent(Pk).numpy(), "key_window_eff": ent(ak).mean(dim=(0, 2)).numpy(),
            "value_static_eff": ent(Pv).numpy(), "value_window_eff": ent(av).mean(dim=(0, 2)).numpy(),
            "key_slot": key_slot.numpy(), "value_slot": value_slot.numpy(),
            "value_is_next": (value_slot == key_slot + 1).numpy(),
            "collisions": int((counts[counts > 1] - 1).sum()),
            "acc_phase": acc_np, "acc_mean": float(correct.mean()),
            "coverage": float((acc_np[: S - 1] >= 0.5).mean()),
            "structural_coverage": len(structural) / (S - 1)}


# ------------------------------------------------------------------------------------------------ report
def summary_line(r: dict) -> str:
    heads = " ".join(f"h{h}:k{int(k)}/v{int(v)}" for h, (k, v) in enumerate(zip(r["key_slot"], r["value_slot"])))
    return (f"coverage {r['coverage']:.2f} (structural {r['structural_coverage']:.2f}), collisions "
            f"{r['collisions']}, acc {r['acc_mean']:.2f}, slots [{heads}]")


def simulate(cfg: SimConfig, seeds: int = 4, out: Path | None = None, verbose: bool = True) -> dict:
    """Train `seeds` seeds without and (if cfg.coord_weight > 0) with the head-coordination term."""
    from dataclasses import replace

    conditions = {"no coordination": 0.0}
    if cfg.coord_weight > 0:
        conditions[f"head_coord {cfg.coord_weight:g}"] = cfg.coord_weight
    runs: dict[str, list[dict]] = {}
    for cond, w in conditions.items():
        runs[cond] = []
        for s in range(seeds):
            r = train(replace(cfg, coord_weight=w, seed=cfg.seed + s))
            runs[cond].append(r)
            if verbose:
                print(f"  {cond:<20} seed {cfg.seed + s}: {summary_line(r)}")
    summary = {"config": asdict(cfg), "seeds": seeds, "conditions": {}}
    for cond, rs in runs.items():
        summary["conditions"][cond] = {
            "coverage_mean": float(np.mean([r["coverage"] for r in rs])),
            "structural_coverage_mean": float(np.mean([r["structural_coverage"] for r in rs])),
            "collisions_mean": float(np.mean([r["collisions"] for r in rs])),
            "acc_mean": float(np.mean([r["acc_mean"] for r in rs])),
            "acc_phase_mean": np.mean([r["acc_phase"] for r in rs], axis=0).round(4).tolist(),
            "key_static_eff_mean": float(np.mean([r["key_static_eff"].mean() for r in rs])),
            "key_window_eff_mean": float(np.mean([r["key_window_eff"].mean() for r in rs])),
            "value_next_fraction": float(np.mean([r["value_is_next"].mean() for r in rs])),
            "per_seed": [{"coverage": r["coverage"], "collisions": r["collisions"], "acc_mean": r["acc_mean"],
                          "key_slot": r["key_slot"].tolist(), "value_slot": r["value_slot"].tolist()} for r in rs],
        }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        from phasefix import plots

        plots.save(plots.theory_gates(runs, cfg), out / "theory.png")
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        summary["files"] = [str(out / "theory.png"), str(out / "summary.json")]
    summary["runs"] = runs
    return summary


def print_summary(summary: dict) -> None:
    cfg = summary["config"]
    print(f"\nidealised induction model: m={cfg['heads']} heads, S={cfg['stride']} slots, L={cfg['chunks']} chunks, "
          f"N={cfg['vocab']} tokens, {cfg['steps']} steps, {summary['seeds']} seeds")
    print(f"{'condition':<20}{'coverage':>9}{'struct.':>8}{'collide':>8}{'acc':>6}{'key eff':>9}{'win eff':>9}"
          f"{'v=k+1':>7}  accuracy by phase (mean over seeds)")
    for cond, s in summary["conditions"].items():
        print(f"{cond:<20}{s['coverage_mean']:>9.2f}{s['structural_coverage_mean']:>8.2f}"
              f"{s['collisions_mean']:>8.2f}{s['acc_mean']:>6.2f}{s['key_static_eff_mean']:>9.2f}"
              f"{s['key_window_eff_mean']:>9.2f}{s['value_next_fraction']:>7.2f}  "
              + " ".join(f"{a:.2f}" for a in s["acc_phase_mean"]))
    print("coverage: share of the S-1 answerable phases with accuracy >= 0.5 (struct.: with a head whose key gate "
          "prefers the phase and value gate the next slot); key eff: static exp(H(E[a])), win eff: per-window "
          "E[exp(H(a))]; v=k+1: share of heads whose value gate prefers the slot after their key gate's")
    for f in summary.get("files", []):
        print(f"wrote {f}")


@dataclass
class TheoryConfig(SimConfig):
    """The command line's config: the simulation's keys, and how many seeds of which conditions to run."""

    coord_weight: float = 1.0  # the second condition's head-coordination weight (0: only the first condition)
    seeds: int = 6  # seeds per condition, from `seed` on
    threads: int = 1
    out: str | None = None  # default outputs/theory
    verbose: bool = False


ConfigStore.instance().store(name="theory_schema", node=TheoryConfig)


def shim(argv: list[str]) -> list[str]:
    """The earlier argparse forms as overrides: `--heads 3`, `--coord-weight=1` -> `heads=3`, `coord_weight=1`."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and a != "--cfg":
            key, eq, value = a[2:].partition("=")
            if not eq:
                from phasefix.errors import check

                check(i + 1 < len(argv), a, None, "needs a value")
                value, i = argv[i + 1], i + 1
            a = f"{key.replace('-', '_')}={value}"
        out.append(a)
        i += 1
    return out


def main(argv=None) -> int:
    """`python -m phasefix.theory [key=value ...]`: 0 done, 2 a bad value (one line)."""
    from phasefix.cli import run

    def work(cfg) -> int:
        torch.set_num_threads(cfg.threads)
        sim = SimConfig(**{f.name: cfg[f.name] for f in fields(SimConfig)})
        t = time.time()
        sim.validate()
        summary = simulate(sim, seeds=cfg.seeds, out=Path(cfg.out) if cfg.out else OUTPUTS_DIR / "theory")
        print_summary(summary)
        print(f"({time.time() - t:.0f}s)")
        return 0

    return run("theory", argv, work, shim)


if __name__ == "__main__":
    sys.exit(main())

"""Structured configs behind conf/ (Hydra), and turning a composed config into validated objects.

Every check runs here, before any training or MLflow run starts; a bad value raises `ConfigError` with one line
naming the key and what is allowed.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from phasefix.data.layout import PADDINGS
from phasefix.data.lm_mix import LMMixConfig
from phasefix.data.retrieval import RetrievalConfig
from phasefix.errors import ConfigError, check, check_choice
from phasefix.model.config import ModelConfig

ACCELERATORS = ("cpu", "gpu", "cuda", "auto")
PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed", "64-true", "bf16-true", "16-true")  # auto: phasefix.precision


@dataclass
class TrainerConfig:
    accelerator: str = "cpu"
    devices: int = 1
    strategy: str = "auto"
    precision: str = "auto"
    num_threads: int = 2
    max_steps: int = 800
    batch_size: int = 64
    gradient_clip_val: float = 1.0
    val_every_n_steps: int = 250
    checkpoint_every_n_steps: int = 100
    log_every_n_steps: int = 10
    deterministic: bool = True
    progress_bar: bool = True
    compile: Any = "auto"  # true, false or auto: training steps through torch.compile (phasefix.precision)


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
class RetrievalData(RetrievalConfig):
    """The `data` group's schema for the retrieval task (conf/data/retrieval.yaml): RetrievalConfig's keys and
    defaults, and the kind that selects it."""
    kind: str = "retrieval"


@dataclass
class LMMixData(LMMixConfig):
    """The `data` group's schema for the LM mix (conf/data/lm_mix.yaml)."""
    kind: str = "lm_mix"


# ------------------------------------------------------------------------------------------------ mitigations
# Each mitigation's options: its class's `Options` (phasefix/mitigations/) and the schema of conf/mitigation/NAME.yaml.
# They live here, beside the other schemas, so that a config is checked without importing torch.

@dataclass
class PhaseJitterOptions:
    """`+mitigation=phase_jitter`: the options and their defaults."""

    max_shift: int | None = None  # null: stride - 1
    mode: str = "pad"  # pad: T grows by max_shift, nothing dropped; crop: T kept, the last k tokens dropped
    keep_first: int = 1  # tokens kept in place before the filler (the BOS)
    filler_token: int = 1  # the filler's token id (1 = the first filler token of the retrieval vocab)


@dataclass
class StaggeredOffsetsOptions:
    """`+mitigation=staggered_offsets`: the options and their defaults."""

    offsets: list[int] | None = None  # null: layer l gets floor(l * S / L); or offsets in [0, S), cycled over layers


@dataclass
class GateDiversityOptions:
    """`+mitigation=gate_diversity` (conf/mitigation/gate_diversity.yaml): the options and their defaults."""

    mode: str = "per_head"  # per_head | soft | hard (GateDiversity's docstring; docs/mitigations.md)
    branch: str | None = None  # key | value | both; null: both for per_head, key for soft and hard
    # per_head and soft; the term lies in [0, 1] (retrieval loss at chance: log 64 = 4.2); a study searches 0.03..10.
    # coverage_w8s8: 0.1 closed the weak phases in 2 of 3 seeds, 1.0 kept the gates uniform and slowed learning.
    weight: float = 0.1
    start_step: int = 0  # the term is off before this training step (let the model leave the plateau first) ...
    ramp_steps: int = 0  # ... then its weight ramps linearly over this many steps (0: full weight at once)
    # hard mode only:
    # block: contiguous slots per head (anchors W/HKV apart); interleaved: slot i -> head i mod HKV
    layout: str = "block"
    strength: float | None = None  # null: mask the other slots (hard); a number: a fixed anchor of that many logits
    value_shift: int = 1  # the value gate's assignment is the key's shifted by this many slots
    freeze_bias: bool = False  # also zero and freeze the learned per-slot gate bias b_i


@dataclass
class CoordOptions:
    """`+mitigation=head_coord` and `+mitigation=layer_coord`: the options and their defaults."""

    branch: str = "both"  # key | value | both
    weight: float = 1.0  # the term lies in [0, 1] (retrieval loss at chance: log 64 = 4.2); search 0.1..10, log scale
    start_step: int = 0  # the term is off before this training step ...
    ramp_steps: int = 0  # ... then its weight ramps linearly over this many steps (0: full weight at once)


@dataclass
class SlotCoverageOptions:
    """`+mitigation=slot_coverage` (conf/mitigation/slot_coverage.yaml): the options and their defaults."""

    branch: str = "both"  # key | value | both
    # or: a phase is covered as often as some head reads it, 1 - prod_h (1 - q_h); mean: as the heads read it on average
    combine: str = "or"
    # the term lies in [0, 1] and is 0 once the heads read every phase often enough (a floor, not a target)
    weight: float = 1.0
    # what a phase needs, in units of one head's fair share 1/S: 1.5 is 80% of two uniform heads' 2/S - 1/S^2 (S = 8);
    # at 1 the near-uniform heads of trained coverage_w8s8_curric models are never charged
    floor: float = 1.5
    eps: float = 0.05  # the log barrier's offset: an unread phase costs log((1+eps)/eps), normalised to 1
    start_step: int = 0  # the term is off before this training step ...
    ramp_steps: int = 0  # ... then its weight ramps linearly over this many steps (0: full weight at once)


@dataclass
class EntryDropoutOptions:
    """`+mitigation=entry_dropout` (conf/mitigation/entry_dropout.yaml): the options and their defaults."""

    p: float = 0.5  # the share of training steps on which one compressed layer, drawn uniformly, loses its entries
    start_step: int = 0  # no layer loses its entries before this training step


MITIGATION_OPTIONS = {"gate_diversity": GateDiversityOptions, "head_coord": CoordOptions, "layer_coord": CoordOptions,
                      "slot_coverage": SlotCoverageOptions, "entry_dropout": EntryDropoutOptions,
                      "phase_jitter": PhaseJitterOptions, "staggered_offsets": StaggeredOffsetsOptions}


@dataclass
class FitConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: Any = MISSING  # RetrievalData or LMMixData: the data group's choice (conf/data) brings its schema
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    mitigation: dict[str, Any] | None = None
    # The config group choices this config was composed from (conf/regime, conf/recipe, conf/arm): written by
    # `phasefix.cli.compose` from Hydra's runtime choices, never typed; they name the run and tag it in MLflow.
    regime: str | None = None
    recipe: str | None = None
    arm: str | None = None
    seed: int = 0
    run_name: str | None = None
    output_dir: str | None = None
    resume: str | None = None
    fork: bool = False  # with resume: continue as a new run, leaving the named one as it was
    verbose: bool = False  # the libraries' own output (Lightning, MLflow, datasets) besides phasefix's bars


# ------------------------------------------------------------------------------------------------ tools
def option(default, help: str, **tool_defaults):
    """A tool option: its default, the line `--help` prints, and defaults that depend on the tool (`run=24, audit=4`
    where the schema's own default is None)."""
    factory = {"default_factory": lambda: type(default)(default)} if isinstance(default, (list, dict)) \
        else {"default": default}
    return field(**factory, metadata={"help": help, **tool_defaults})


@dataclass
class EvaluateConfig:
    """`python -m phasefix.evaluate` (conf/evaluate.yaml)."""

    model: str | None = option(None, "a Hugging Face checkpoint directory (config.json + tokenizer), or a phasefix "
                               "run: its MLflow run id (or a unique prefix), output directory or .ckpt (required)")
    task: str | None = option(None, "kv_lookup | needle: accuracy by residue of the target key's position; flip: "
                              "the flipping-completion probe (Hugging Face models) (required)")
    endpoint: str | None = option(None, "an OpenAI-compatible server's base URL (http://127.0.0.1:8000/v1): model= is "
                                  "then the served model's name")
    tokenizer: str | None = option(None, "endpoint: the served model's tokenizer, a local directory or a Hugging Face "
                                   "name (the model name)")
    phase_of: str = option("fact", "fact | end | both: group by the target's position, the prompt's end (length) or "
                           "both (a fact x end grid) mod period")
    score: str | None = option(None, "top1: the answer's first token is the full-vocabulary top-1 (local models); "
                               "exact: greedy generation of the whole answer matches its text (an endpoint's only "
                               "rule; local Hugging Face models too)")
    concurrency: int = option(8, "endpoint: requests in flight")
    timeout: float = option(120.0, "endpoint: seconds per request before it is retried")
    retries: int = option(5, "endpoint: tries per request after the first (429, 5xx, connection errors; backoff)")
    period: int | None = option(None, "residue = target position mod period (24; a phasefix run: its eval.period)")
    stride: int | None = option(None, "fold residues onto this compression stride (a phasefix run: model.stride; "
                                "else none: detected)")
    padding: list[str] = option(list(PADDINGS), "prefix, in_sequence, both, or a list (padding=prefix,in_sequence)")
    per_residue: int = option(48, "prompts per residue group")
    batch_size: int | None = option(None, "prompts per forward pass (8; a phasefix run: 256)")
    n_boot: int = option(2000, "cluster-bootstrap replicates")
    seed: int = option(0, "prompt seed")
    num_records: int | None = option(None, "task size (a phasefix run: what it trained on)")
    num_demos: int | None = option(None, "task size (a phasefix run: what it trained on)")
    max_pad: int | None = option(None, "total filler (a phasefix run: what it trained on)")
    target_span: int | None = option(None, "needle: the window the target key is drawn from (8 * period)")
    num_filler: int | None = option(None, "filler pieces (Hugging Face models)")
    max_length: int | None = option(None, "prompt length in tokens (Hugging Face; needle: fills it with records)")
    lengths: int | None = option(None, "flip: number of filler lengths (4 * period)")
    start: int = option(0, "flip: the shortest filler")
    text: bool | None = option(None, "held-out text before the records, as in training (a phasefix LM-mix run: "
                               "true; false: the plain protocol prompts)")
    device: str | None = option(None, "cuda if available, else cpu")
    dtype: str = option("float32", "float32 | bfloat16 | float16")
    which: str = option("last", "a phasefix run's checkpoint: last | best")
    tracking_uri: str | None = option(None, "MLflow tracking URI (MLFLOW_TRACKING_URI or the project's store)")
    experiment: str = option("phasefix", "MLflow experiment")
    run_name: str | None = option(None, "MLflow run name (eval-<task>-<model>)")
    tags: dict[str, str] = option({}, "more MLflow tags on the run (tags.comparison=NAME: a comparison's re-scoring)")
    out: str | None = option(None, "output directory (outputs/<date>/<time>-<run name>)")
    progress: bool = option(True, "progress bars")
    verbose: bool = option(False, "the libraries' own output too (-v)")


ANALYZE_TOOLS = ("knockout", "gates", "cycle", "period", "confusions", "audit")


@dataclass
class AnalyzeConfig:
    """`python -m phasefix.analyze TOOL ...` (conf/analyze.yaml). `analyze`: which keys each tool takes (metadata
    `tools`) and the defaults that depend on it; `run` is the mechanism tools on a trained run, `audit` the phase
    audit from the weights (`audit model=`, `gates model=`)."""

    tool: str | None = option(None, "knockout, gates, cycle, period, confusions (run=) or audit, gates (model=)",
                              tools="run,audit")
    run: str | None = option(None, "MLflow run id (or a unique prefix), run output directory or .ckpt (required)",
                             tools="run")
    model: str | None = option(None, "a Hugging Face DeepSeek-V4 directory, or a phasefix run (MLflow run id, output "
                               "dir, .ckpt) (required)", tools="audit")
    tracking_uri: str | None = option(None, "MLflow tracking URI (the run's, else MLFLOW_TRACKING_URI or the "
                                      "project's)", tools="run,audit")
    which: str = option("last", "checkpoint of a run: last or best", tools="run,audit")
    padding: str = option("prefix", "prefix, in_sequence or both", tools="run,audit")
    per_residue: int | None = option(None, "prompts per residue group (audit: calibration and evaluation)",
                                     tools="run,audit", run=24, audit=4)
    seed: int | None = option(None, "evaluation seed (run: the run's eval.seed)", tools="run,audit", audit=0)
    calib_seed: int | None = option(None, "knockout: seed of the calibration set (seed + 2, disjoint prompts)",
                                    tools="run")
    batch_size: int | None = option(None, "prompts per forward pass", tools="run,audit", run=128, audit=8)
    n_boot: int | None = option(None, "cluster-bootstrap replicates (cycle, period, audit)", tools="run,audit",
                                run=500, audit=200)
    shifts: str = option("-3..3", "cycle: gate shifts d, as 'a..b' or 'a,b,c'", tools="run")
    max_prompts: int | None = option(None, "gates: prompts the gate statistics average over", tools="run,audit",
                                     run=512, audit=96)
    period: int | None = option(None, "evaluation period P the phase mass is folded to (24; a phasefix run: its "
                                "own)", tools="audit")
    include: str = option("main", "compressors in the model's prediction: main (CSA, HCA; phasefix key+value) or "
                          "all", tools="audit")
    reading: str = option("answer", "phasefix runs: answer (the target-key phase a slot can answer: key slot i, "
                          "value slot i-1) or slot (the phase of the token it holds)", tools="audit")
    calibrate: bool = option(False, "also measure E[a] with hooked forward passes over the phase-controlled "
                             "prompts", tools="audit")
    task: str = option("kv_lookup", "audit: kv_lookup or needle", tools="audit")
    max_length: int | None = option(None, "Hugging Face: prompt length in tokens", tools="audit")
    device: str | None = option(None, "cuda if available, else cpu", tools="audit")
    dtype: str = option("float32", "float32, bfloat16 or float16 (forward passes)", tools="audit")
    experiment: str = option("phasefix", "MLflow experiment", tools="audit")
    run_name: str | None = option(None, "MLflow run name", tools="audit")
    log: bool = option(True, "log metrics and figures to MLflow (run: into the run itself)", tools="run,audit")
    out: str | None = option(None, "also save the figures under this directory (audit: outputs/<date>/<time>-"
                             "<tool>-<model>)", tools="run,audit")
    threads: int | None = option(None, "torch threads (torch's default)", tools="run,audit")
    progress: bool = option(False, "progress bars in the evaluation", tools="audit")
    verbose: bool = option(False, "the libraries' own output too (-v)", tools="run,audit")


@dataclass
class UiConfig:
    """`python -m phasefix.ui` (conf/ui.yaml): the MLflow UI on the project's store, opened on the phase curves."""

    tracking_uri: str | None = option(None, "MLflow store (MLFLOW_TRACKING_URI, else the project's mlruns/mlflow.db)")
    experiment: str = option("phasefix", "MLflow experiment")
    host: str = option("127.0.0.1", "address the server binds (the default: this machine only)")
    port: int = option(5000, "port the server listens on")
    workers: int = option(1, "server worker processes (MLflow's default 4 is slow to start on 2 cores)")
    verbose: bool = option(False, "the server's own log too (-v)")


def register_configs() -> None:
    # `${plus_one:${model.stride}}`: W = S + 1 that follows the stride (conf/arm/bridge*.yaml)
    if not OmegaConf.has_resolver("plus_one"):
        OmegaConf.register_new_resolver("plus_one", lambda x: int(x) + 1)
    # `${double:${model.stride}}`: W = 2S that follows the stride, DeepSeek-V4's CSA overlap (conf/arm/overlap.yaml)
    if not OmegaConf.has_resolver("double"):
        OmegaConf.register_new_resolver("double", lambda x: 2 * int(x))
    # `${half:${trainer.max_steps}}`: a curriculum switch that follows the budget (conf/recipe/inseqfirst.yaml)
    if not OmegaConf.has_resolver("half"):
        OmegaConf.register_new_resolver("half", lambda x: int(x) // 2)
    cs = ConfigStore.instance()
    cs.store(name="fit_schema", node=FitConfig)
    cs.store(group="data", name="retrieval_schema", node=RetrievalData)
    cs.store(group="data", name="lm_mix_schema", node=LMMixData)
    # conf/mitigation/<name>.yaml selects <name>_schema: the mitigation class's Options dataclass
    for name, options in MITIGATION_OPTIONS.items():
        cs.store(group="mitigation", name=f"{name}_schema", node=options, package=f"mitigation.{name}")
    cs.store(name="evaluate_schema", node=EvaluateConfig)
    cs.store(name="analyze_schema", node=AnalyzeConfig)
    cs.store(name="ui_schema", node=UiConfig)


register_configs()


def validate_trainer(t: TrainerConfig | DictConfig) -> None:
    check_choice("trainer.accelerator", t.accelerator, ACCELERATORS)
    check_choice("trainer.precision", t.precision, PRECISIONS)
    check(isinstance(t.compile, bool) or t.compile == "auto", "trainer.compile", t.compile,
          "must be true, false or auto")
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


def validate_fit(cfg: DictConfig) -> ModelConfig:
    """fit's checks that need neither torch nor data (the model, trainer, optimiser and evaluation keys): the CLI
    runs them before importing torch, Lightning and MLflow, so a bad value is refused in about a second."""
    model = model_config(cfg)
    validate_trainer(cfg.trainer)
    validate_optim(cfg.optim)
    validate_eval(cfg.eval)
    return model


def flatten(d, prefix: str = "") -> dict:
    """A nested mapping as {dotted key: value} (the keys a config is checked against, the params MLflow logs)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def model_config(cfg: DictConfig) -> ModelConfig:
    return ModelConfig.from_dict(OmegaConf.to_container(cfg.model, resolve=True))


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


__all__ = ["ANALYZE_TOOLS", "AnalyzeConfig", "ConfigError", "EvalConfig", "EvaluateConfig", "FitConfig",
           "LoggerConfig", "MITIGATION_OPTIONS", "OptimConfig", "TrainerConfig", "flatten", "model_config", "option",
           "UiConfig", "to_container", "validate_eval", "validate_fit", "validate_optim", "validate_trainer"]

"""`python -m phasefix.fit [key=value ...] [+mitigation=NAME]`: train, evaluate by phase, log to MLflow.

`fit(cfg) -> summary` is the one entry point shared by the CLI, the studies and the tests. torch, Lightning, MLflow
and datasets are imported inside the functions that use them: the command line checks a config before they load.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from phasefix import config as C
from phasefix.cli import compose  # noqa: F401  (phasefix.fit.compose: how the studies and the tests build configs)
from phasefix.errors import ConfigError, check
from phasefix.precision import resolve_compile, resolve_precision, use_compile_cache


# ------------------------------------------------------------------------------------------------ config
def plan_model(cfg: DictConfig):
    """(model config as the mitigations change it, the mitigations); ConfigError when a mitigation cannot apply to
    the model (e.g. head_coord with one KV head)."""
    from phasefix.mitigations import configured_model

    mitigation = cfg.get("mitigation")
    return configured_model(C.to_container(cfg.model),
                            OmegaConf.to_container(mitigation, resolve=True) if mitigation else None)


def plan(cfg: DictConfig, start_step: int = 0) -> dict:
    """Validate everything and build the objects of a run, before any training or MLflow run starts: the model
    config, mitigations, data config and `how` the step trains (precision and compile, resolved from `auto` for this
    CPU and the steps from `start_step` on, with the reasons: the run's tags)."""
    from phasefix.data.select import data_config, eval_task_kwargs

    model_cfg, mitigations = plan_model(cfg)
    C.validate_trainer(cfg.trainer)
    C.validate_optim(cfg.optim)
    C.validate_eval(cfg.eval)
    data_cfg = data_config(OmegaConf.to_container(cfg.data, resolve=True))
    data_cfg.vocab.check_fits(model_cfg.vocab_size)
    check(cfg.eval.period % model_cfg.phase_stride == 0, "eval.period", cfg.eval.period,
          f"must be a multiple of the phase stride ({model_cfg.phase_stride}: model.stride, or the lcm of "
          "model.layer_compression's strides) so residue groups fold onto phases")
    try:  # the evaluation prompts must fit the trained task: check on a one-prompt-per-residue set
        from phasefix.data import make_phase_eval

        make_phase_eval("kv_lookup", cfg.eval.paddings[0], period=cfg.eval.period, per_residue=1,
                        **eval_task_kwargs(data_cfg))
    except ConfigError as e:
        raise ConfigError(str(e).replace("max_pad=", "data.max_prefix_pad=").replace("period=", "eval.period=")
                          .replace("num_", "data.num_")) from None
    precision, precision_why = resolve_precision(cfg.trainer.precision, cfg.trainer.accelerator)  # auto: by the CPU
    compiled, compile_why = resolve_compile(cfg.trainer.compile, cfg.trainer.accelerator,  # auto: by the run's length
                                            cfg.trainer.max_steps - start_step)
    if compiled:
        use_compile_cache()
    how = {"precision": precision, "precision_reason": precision_why, "compile": str(compiled).lower(),
           "compile_reason": compile_why}
    return {"model": model_cfg, "data": data_cfg, "mitigations": mitigations, "how": how}


def lm_loss(model, dataset, first_text_token: int, batch_size: int = 64) -> float:
    """Mean next-token loss on held-out text positions (labels >= first_text_token)."""
    import torch
    from torch.utils.data import DataLoader

    total, count = 0.0, 0
    with torch.no_grad():
        for batch in DataLoader(dataset, batch_size=batch_size):
            logits = model(batch["input_ids"].long())
            labels = batch["labels"].long()
            mask = labels >= first_text_token
            total += torch.nn.functional.cross_entropy(logits[mask].float(), labels[mask], reduction="sum").item()
            count += int(mask.sum())
    return total / max(count, 1)


def run_name(cfg: DictConfig) -> str:
    """`run_name`, else `<regime>-<arm>-s<seed>` from the config group choices, else (the default regime and arm)
    `<model>-W<window>S<stride>[-<mitigations>]`."""
    if cfg.run_name:
        return cfg.run_name
    if cfg.get("regime", "default") not in (None, "default") or cfg.get("arm", "baseline") not in (None, "baseline"):
        return f"{cfg.regime}-{cfg.arm}-s{cfg.seed}"
    m = cfg.model
    name = m.name if m.attention == "full" else f"{m.name}-W{m.window}S{m.stride}"
    if cfg.get("mitigation"):
        name += "-" + "+".join(cfg.mitigation.keys())
    return name


# ------------------------------------------------------------------------------------------------ resume
# What may differ from the stored config when a run is resumed; every other key is the run's identity (model, data,
# mitigations, optimiser, seed, evaluation protocol, where it logs) and is refused.
RESUMABLE = ("trainer.max_steps", "trainer.num_threads", "trainer.progress_bar", "trainer.val_every_n_steps",
             "trainer.checkpoint_every_n_steps", "trainer.log_every_n_steps", "trainer.compile", "eval.batch_size",
             "verbose")
# What a fork (resume with fork=true: a new run from the checkpoint) may change besides: how the new run is named,
# where it lives, how it is tagged (e.g. the comparison it belongs to).
FORKABLE = ("run_name", "output_dir", "logger.tags")


def resume_config(cfg: DictConfig):
    """(the run `cfg.resume` names, its stored config with the overrides that may change on resume applied, its
    checkpoint's step, the seconds trained up to it or None).

    The overrides are the keys of `cfg` that differ from the defaults (`compose([])`); one that differs
    from the stored value and is not in RESUMABLE (with `fork`, nor in FORKABLE) raises ConfigError naming it.
    `trainer.max_steps` below the checkpoint's step is refused; above it, the run trains the extra steps. A fork
    lives in a new output directory (`output_dir` or the default), never the named run's."""
    from phasefix import tracking
    from phasefix.fit_run import Run

    run = Run.open(str(cfg.resume), cfg.logger.get("tracking_uri"), key="resume")
    check(run.dir is not None and run.run_id is not None and run.config is not None, "resume", cfg.resume,
          "must name a run of phasefix.fit (a directory with run.json and config.yaml), not a bare checkpoint")
    fork = bool(cfg.get("fork"))
    changeable = RESUMABLE + (FORKABLE if fork else ())
    stored = run.config
    if fork:
        stored.output_dir = None  # not the named run's directory, unless output_dir is given below
    flat_stored = tracking.flatten(C.to_container(stored))
    flat_default = tracking.flatten(C.to_container(compose([])))  # what the user did not set
    missing, refused = object(), []
    for key, value in tracking.flatten(C.to_container(cfg)).items():
        if key in ("resume", "fork") or value in (flat_default.get(key, missing), flat_stored.get(key, missing)):
            continue
        if not any(key == k or key.startswith(k + ".") for k in changeable):
            refused.append(f"{key}={value} (the run has {flat_stored.get(key)})")
            continue
        OmegaConf.update(stored, key, value, force_add=True)
    if refused:
        what = "a fork" if fork else "resume"
        raise ConfigError(f"cannot change on {what}: {', '.join(refused)}; {what} without it or start a new run "
                          f"(on {what} only {', '.join(changeable)} may change)")
    stored.resume = None
    stored.fork = False
    step, seconds = run.progress(key="resume")
    check(stored.trainer.max_steps >= step, "trainer.max_steps", stored.trainer.max_steps,
          f"must be >= {step} on resume: the run's last checkpoint is at step {step}")
    return run, stored, step, seconds


# ------------------------------------------------------------------------------------------------ fit
class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped a fit; the message says how to resume it (`python -m phasefix.fit` exits 130)."""


def fit(cfg: DictConfig, callbacks: Sequence = ()) -> dict:
    """Train, evaluate by phase (both paddings), log to MLflow; return the summary (also in summary.json).

    `callbacks`: extra Lightning callbacks (e.g. a study's pruner reading `val/<padding>/acc_*`).
    With `resume`: continue that run in the same MLflow run and output directory (see `resume_config`); metric
    points logged after its checkpoint and its final results are replaced, not duplicated; a run already trained to
    `trainer.max_steps` and evaluated returns its summary without training. With `resume` and `fork`: train on from
    that run's checkpoint as a new run (new output directory and MLflow run, tagged forked_from, the metric points
    before the checkpoint's step copied, train time counted from the checkpoint's), writing nothing to the named
    run. Ctrl-C saves `last.ckpt` at the interrupted step and raises RunInterrupted; the MLflow run ends KILLED."""
    from phasefix import console, tracking
    from phasefix.fit_run import open_fit_run

    console.quiet(bool(cfg.get("verbose")))
    piece = Piece.of(cfg)  # a new run, or the piece of a resumed or forked one
    if piece.done:
        print(f"phasefix fit: {piece.run.dir} is trained to step {piece.step} = trainer.max_steps and evaluated; "
              "nothing to do (raise trainer.max_steps to train further)", file=sys.stderr)
        return piece.previous
    cfg = piece.cfg
    p = plan(cfg, piece.step)  # raises ConfigError before anything is written
    t_start = time.time()
    data = training_data(cfg, p)  # data first: a broken data config must not leave a half-written run behind
    run, c = open_fit_run(cfg, piece, run_name(cfg), p["model"], tags=p["how"])
    trainer = None
    with tracking.running(c, run.run_id, resumed=piece.run is not None):  # ends FINISHED, KILLED or FAILED
        try:
            module, trainer = build_trainer(cfg, p, data, run, piece.before_seconds, callbacks)
            t_fit = time.time()
            trainer.fit(module, datamodule=data, ckpt_path=piece.checkpoint)
            if trainer.interrupted:
                raise KeyboardInterrupt
            train_seconds = piece.before_seconds + (time.time() - t_fit)
            results = final_scores(module.model.eval(), cfg, p)
            summary = summarize(cfg, p, run, c, module.model, results, train_seconds,
                                piece.before_total + time.time() - t_start)
            close_run(c, run, cfg, p, module, results, summary, data.val_sets)
            return summary
        except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C (Lightning turns it into exit(1)); SIGTERM
            raise_stopped(e, trainer, run.dir)


@dataclasses.dataclass
class Piece:
    """What one call of `fit` trains: `cfg` (for a resume the stored config with the changes allowed), `run` (the
    run it continues; None: a new one), `source` (the run a fork trains on from), `step` (where training starts),
    `before_seconds` (the train time up to it), `before_total` (the wall time of the pieces before it) and `previous`
    (the continued run's summary)."""

    cfg: DictConfig
    run: object = None
    source: object = None
    step: int = 0
    before_seconds: float = 0.0
    before_total: float = 0.0
    previous: dict | None = None
    out_dir: Path | None = None  # where the run lives (a new run's: checked, not created yet)

    @classmethod
    def of(cls, cfg: DictConfig) -> "Piece":
        from phasefix.fit_run import Run

        resuming, forking = bool(cfg.get("resume")), bool(cfg.get("fork"))
        check(resuming or not forking, "fork", "true", "needs resume=<the run to fork from>")
        if not resuming:
            return cls(cfg, out_dir=Run.new_dir(cfg.output_dir, run_name(cfg)))
        run, cfg, step, seconds = resume_config(cfg)
        previous = None if forking else run.summary
        if seconds is None:  # a checkpoint written before train time was recorded in checkpoints
            seconds = (run.summary or {}).get("train_seconds", 0.0)
        # the wall time of the pieces before this one: a finished piece's total, else the train time its checkpoint holds
        total = previous.get("total_seconds", seconds) if previous and previous.get("steps") == step else seconds
        if forking:  # a new run: its own directory (output_dir or the default), never the named run's
            piece = cls(cfg, None, run, step, seconds, total, None, Run.new_dir(cfg.output_dir, run_name(cfg)))
        else:
            piece = cls(cfg, run, None, step, seconds, total, previous, run.dir)
        if not piece.done:
            print(f"phasefix fit: {'forking' if forking else 'resuming'} {run.dir.name} (MLflow run {run.run_id}) "
                  f"from step {step}{' as a new run' if forking else ''} to step {cfg.trainer.max_steps}", flush=True)
        return piece

    @property
    def done(self) -> bool:
        """A continued run already trained to trainer.max_steps and evaluated."""
        p = self.previous
        return p is not None and p.get("steps", self.step) == self.step >= self.cfg.trainer.max_steps

    @property
    def checkpoint(self) -> str | None:
        """The checkpoint training resumes from (None: a new run)."""
        home = self.source or self.run
        return str(home.checkpoint()) if home is not None else None


def training_data(cfg: DictConfig, p: dict):
    """The data module: the training stages and the validation prompts of both paddings."""
    from phasefix.data.select import eval_set, train_stages
    from phasefix.module import RetrievalDataModule

    data_cfg = p["data"]
    train = [(from_step, ds.with_format("torch")) for from_step, ds in train_stages(data_cfg, cfg.seed)]
    val_sets = {pad: eval_set(data_cfg, pad, cfg.eval.period, cfg.eval.val_per_residue, cfg.eval.seed + 1)
                for pad in cfg.eval.paddings}
    return RetrievalDataModule(train, val_sets, batch_size=cfg.trainer.batch_size, eval_batch_size=cfg.eval.batch_size,
                               seed=cfg.seed, max_steps=cfg.trainer.max_steps)


def build_trainer(cfg: DictConfig, p: dict, data, run, before_seconds: float, callbacks: Sequence = ()):
    """(the module, the Lightning Trainer) of a run: threads, seed, precision and compile as planned, checkpoints
    under the run's directory, metrics to its MLflow run."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from phasefix import console, tracking
    from phasefix.data.lm_mix import LMMixConfig
    from phasefix.module import LastCheckpoint, PeriodicCheckpoint, PhaseFixModule, RunLogger, TrainClock
    from phasefix.fit_run import checkpoint_path

    t, how = cfg.trainer, p["how"]
    torch.set_num_threads(t.num_threads)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    module = PhaseFixModule(model=OmegaConf.to_container(cfg.model, resolve=True),
                            optim=OmegaConf.to_container(cfg.optim, resolve=True), max_steps=t.max_steps,
                            mitigation=OmegaConf.to_container(cfg.mitigation, resolve=True)
                            if cfg.get("mitigation") else None,
                            paddings=tuple(cfg.eval.paddings), period=cfg.eval.period, seed=cfg.seed,
                            built=(p["model"], p["mitigations"]),  # what plan built: not built again
                            **(p["data"].text_loss if isinstance(p["data"], LMMixConfig) else {}))
    module.compile_training = how["compile"] == "true"
    last_ckpt = checkpoint_path(run.dir)  # the layout Run.checkpoint reads; "last" is also what save_last writes
    verbose = bool(cfg.get("verbose"))
    callbacks = [
        PeriodicCheckpoint(dirpath=last_ckpt.parent, filename="step{step:06d}", auto_insert_metric_name=False,
                           every_n_train_steps=t.checkpoint_every_n_steps, save_last=True, save_top_k=0),
        ModelCheckpoint(dirpath=last_ckpt.parent, filename="best", mode="max", save_top_k=1,
                        auto_insert_metric_name=False,
                        monitor=tracking.phase_metric("val", cfg.eval.paddings[0], "acc_mean")),
        LastCheckpoint(dirpath=last_ckpt.parent, filename=last_ckpt.stem),
        TrainClock(before_seconds),
        *([console.TrainProgress(cfg.eval.paddings[0])] if t.progress_bar and not verbose else []),
        *callbacks,
    ]
    logger = RunLogger(experiment_name=cfg.logger.experiment_name, tracking_uri=run.tracking_uri, run_id=run.run_id)
    trainer = L.Trainer(
        accelerator=t.accelerator, devices=t.devices, strategy=t.strategy, precision=how["precision"],
        max_steps=t.max_steps, max_epochs=-1, gradient_clip_val=t.gradient_clip_val,
        val_check_interval=t.val_every_n_steps, check_val_every_n_epoch=None, log_every_n_steps=t.log_every_n_steps,
        deterministic=t.deterministic, enable_progress_bar=bool(t.progress_bar and verbose),
        enable_model_summary=False, num_sanity_val_steps=0, logger=logger, callbacks=callbacks,
        use_distributed_sampler=False, default_root_dir=str(run.dir))
    return module, trainer


def final_scores(model, cfg: DictConfig, p: dict) -> dict:
    """The final phase evaluation on fresh prompts, with intervals: {padding: result} (phasefix.evaluate's scoring)."""
    from phasefix.data.select import eval_set
    from phasefix.evaluate import Target, score_by_phase

    e, stride = cfg.eval, p["model"].phase_stride
    target = Target("phasefix", model, p["model"].name, "fit", period=e.period, stride=stride, data_cfg=p["data"])
    return {pad: score_by_phase(target, eval_set(p["data"], pad, e.period, e.per_residue, e.seed), period=e.period,
                                stride=stride, n_boot=e.n_boot, batch_size=e.batch_size,
                                progress=bool(cfg.trainer.progress_bar), desc=f"evaluate {pad}")[1]["fact"]
            for pad in e.paddings}


def raise_stopped(e: BaseException, trainer, out_dir: Path):
    """Ctrl-C or SIGTERM: RunInterrupted (SIGTERM: exit 143) with the line that says how to resume; any other exit
    raised as it was."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from phasefix.fit_run import checkpoint_path

    interrupted = isinstance(e, SIGTERMException) or (trainer is not None and trainer.interrupted)
    if isinstance(e, SystemExit) and not interrupted:
        raise e
    last_ckpt = checkpoint_path(out_dir)
    step = f" at step {trainer.global_step}" if trainer is not None else ""
    saved = f"; checkpoint {last_ckpt}" if last_ckpt.exists() else ""
    hint = (f"interrupted{step}{saved}; continue this run with: python -m phasefix.fit resume={out_dir}"
            if saved else f"interrupted{step} before any checkpoint was written")
    if isinstance(e, SIGTERMException):
        print(hint, file=sys.stderr)
        raise SystemExit(128 + 15) from e  # the shell's code for "terminated by SIGTERM"
    raise RunInterrupted(hint) from None


SUMMARY_KEYS = ("acc_mean", "acc_worst", "acc_best", "acc_gap", "per_residue", "period_detected", "worst_ci", "gap_ci",
                "periodicity_ratio")


def summarize(cfg: DictConfig, p: dict, run, c, model, results: dict, train_seconds: float,
              total_seconds: float) -> dict:
    """The run's summary.json: its model's shape and costs, times, the phase results, learned, how it trained."""
    from phasefix import tracking
    from phasefix.data.lm_mix import LMMixConfig
    from phasefix.evaluate import phase_summary

    m, how = p["model"], p["how"]
    summary = {"mlflow_run_id": run.run_id, "model": m.name, "attention": m.attention, **m.shape_tags(),
               # the costs a study constrains (compression at equal cache size): docs/mitigations.md
               "compressor_flops_per_token": m.compressor_flops_per_token(),
               "cache_entries_per_token": m.cache_entries_per_token(),
               "train_seconds": round(train_seconds, 1), "total_seconds": round(total_seconds, 1),
               "output_dir": str(run.dir),
               **{pad: phase_summary(res, SUMMARY_KEYS) for pad, res in results.items()},
               "steps": cfg.trainer.max_steps}  # the state it describes (resume compares it to last.ckpt's step)
    summary.update(learned_lookup(summary, cfg), tracking_uri=c.tracking_uri,
                   figure=tracking.artifact_path(c, run.run_id, "phase_curves.png"))
    summary["precision"] = {"used": how["precision"], "why": how["precision_reason"]}
    summary["compile"] = {"used": how["compile"] == "true", "why": how["compile_reason"]}
    if summary["compile"]["used"]:  # this piece's compile, in train_seconds (this process's: not ddp's workers')
        from phasefix.module import compile_seconds

        summary["compile"]["seconds"] = round(compile_seconds(), 1)
    if isinstance(p["data"], LMMixConfig):
        from phasefix.data.select import train_set

        val_text = train_set(p["data"], "val", cfg.seed).with_format("torch")
        summary["lm_loss"] = round(lm_loss(model, val_text, p["data"].vocab.byte_start), 4)
    return summary


def close_run(c, run, cfg, p, module, results, summary, val_sets) -> None:
    """The final results logged and summary.json written, whole (a Ctrl-C takes effect right after)."""
    from phasefix import tracking

    with tracking.interrupts_deferred():
        if "seconds" in summary["compile"]:
            tracking.log_metric_values(c, run.run_id, {"compile_seconds": summary["compile"]["seconds"]},
                                       step=cfg.trainer.max_steps)
        log_final(c, run.run_id, cfg, p["model"], module, results, summary, val_sets, cfg.trainer.max_steps)
        tracking.write_json(run.dir / "summary.json", summary)
        tracking.log_dict(c, run.run_id, summary, "summary.json")


def learned_lookup(summary: dict, cfg: DictConfig) -> dict:
    """{"chance", "learned"}: the project's rule (phasefix.verdict.learned: prefix mean >= 5 x chance) on this run;
    learned None when the prefix padding was not evaluated. A run that did not learn has no period to read."""
    from phasefix.verdict import chance, learned

    prefix = summary.get("prefix")
    return {"chance": round(chance(cfg.data.num_values), 4),
            "learned": None if prefix is None else bool(learned(prefix["acc_mean"], cfg.data.num_values))}


def log_final(c, run_id, cfg, model_cfg, module, results, summary, val_sets, step: int = 0) -> None:
    from phasefix import tracking

    tracking.rewind(c, run_id, final=True)  # a resumed run's earlier final results: replaced, not duplicated
    if summary.get("learned") is not None:  # the runs table can filter on it: tags.learned = 'false'
        tracking.set_tags(c, run_id, {"learned": str(summary["learned"]).lower()})
    for pad, res in results.items():
        tracking.log_phase_result(c, run_id, pad, res)
    if "lm_loss" in summary:  # logged after the rewind above, which would delete it
        tracking.log_metric_values(c, run_id, {"final/lm_loss": summary["lm_loss"]})
    from phasefix import plots

    fig = plots.phase_curves(results, model_cfg.phase_stride, title=f"{run_name(cfg)}  (run {run_id[:8]})")
    tracking.log_figure(c, run_id, fig, "phase_curves.png")
    tracking.log_phase_table(c, run_id, results)
    if model_cfg.compressed and model_cfg.gate != "uniform":
        from phasefix.mitigations.gates import effective_slots

        probe = next(iter(val_sets.values()))[:64]["input_ids"]
        static = module.static_gates(probe)
        # one value per layer, branch and head: a table beside the heatmap, not a dozen one-point chart groups
        rows = ["layer,branch,kv_head,eff_slots"] + [
            f"{layer},{branch},{h},{e:.4f}" for layer, branches in enumerate(static)
            for branch, prob in branches.items() for h, e in enumerate(effective_slots(prob).tolist())]
        c.log_text(run_id, "\n".join(rows) + "\n", "gate_eff_slots.csv")
        tracking.log_figure(c, run_id, plots.gate_heatmap(static), "gate_heatmap.png")


def print_summary(summary: dict) -> None:
    from phasefix import tracking

    per_layer = "/" in str(summary["window"])  # model.layer_compression: the pattern and the phase stride
    shape = ("full" if summary["attention"] == "full"
             else f"{summary['attention']}, layers {summary['window']}, phase mod {summary['stride']}" if per_layer
             else f"{summary['attention']}, W{summary['window']}/S{summary['stride']}")
    print(f"\nphasefix fit: {summary['model']} ({shape}), "
          f"trained in {summary['train_seconds']:.0f}s, MLflow run {summary['mlflow_run_id']}")
    print(f"{'padding':<12} {'mean':>6} {'worst':>6} {'best':>6} {'gap':>6} {'period':>6}  curve by residue")
    unlearned = summary.get("learned") is False
    for pad in ("prefix", "in_sequence"):
        if pad in summary:
            s = summary[pad]
            period = "-" if unlearned else str(s.get("period_detected"))  # noise has no period
            print(f"{pad:<12} {s['acc_mean']:>6.3f} {s['acc_worst']:>6.3f} {s['acc_best']:>6.3f} "
                  f"{s['acc_gap']:>6.3f} {period:>6}  {tracking.sparkline(s['per_residue'])}")
    if unlearned:
        from phasefix.verdict import LEARNED_FACTOR

        print(f"NOT LEARNED: prefix mean {summary['prefix']['acc_mean']:.3f} < {LEARNED_FACTOR:g} x chance "
              f"({LEARNED_FACTOR * summary['chance']:.3f}); the curve is noise, not a period: train longer "
              "(trainer.max_steps)")
    print(f"summary: {Path(summary['output_dir']) / 'summary.json'}")
    if summary.get("figure"):
        print(f"figure:  {summary['figure']}")
    if summary.get("tracking_uri"):
        print(f"look at it in MLflow: {ui_command(summary['tracking_uri'])}  (the phase curves of every run)")


def ui_command(tracking_uri: str) -> str:
    """The command that opens the MLflow UI on the phase curves of the runs in this store (`python -m phasefix.ui`)."""
    from phasefix.paths import default_tracking_uri

    return "python -m phasefix.ui" + ("" if tracking_uri == default_tracking_uri() else f" tracking_uri={tracking_uri}")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m phasefix.fit`: 0 done, 2 a bad config (one line, nothing written), 130 interrupted (Ctrl-C: the
    line saying how to resume)."""
    from phasefix import cli

    def work(cfg: DictConfig) -> int:
        print_summary(fit(cfg))  # fit validates everything (plan) before it writes anything
        return 0

    return cli.run("fit", argv, work, check=C.validate_fit)


if __name__ == "__main__":
    sys.exit(main())

"""`python -m phasefix.fit [key=value ...] [+mitigation=NAME]`: train, evaluate by phase, log to MLflow.

`fit(cfg) -> summary` is the one entry point shared by the CLI, the studies and the tests.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from phasefix import config as C
from phasefix import tracking
from phasefix.errors import ConfigError, check, check_choice
from phasefix.paths import CONF_DIR, OUTPUTS_DIR

RUN_FILE = "run.json"


# ------------------------------------------------------------------------------------------------ config
def compose(overrides: Sequence[str] = (), config_name: str = "fit") -> DictConfig:
    """The composed config for these overrides (Hydra compose API), with composition errors as ConfigError."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name=config_name, overrides=list(overrides))
    except Exception as e:  # Hydra/OmegaConf errors are long; users need one line naming the key
        raise ConfigError(_one_line_hydra_error(e, overrides)) from None


def _one_line_hydra_error(e: Exception, overrides: Sequence[str]) -> str:
    from hydra.errors import MissingConfigException

    if isinstance(e, MissingConfigException):
        for o in overrides:
            key, _, value = o.lstrip("+~").partition("=")
            group_dir = CONF_DIR / key
            if group_dir.is_dir():
                allowed = sorted(p.stem for p in group_dir.glob("*.yaml"))
                names = value.strip("[]").split(",")
                bad = [n for n in names if n not in allowed]
                if bad:
                    return f"{key}={bad[0]} is invalid: allowed values are {', '.join(allowed)}"
    cause = e.__cause__ or e
    msg = str(cause).splitlines()
    full_key = next((ln.split(":", 1)[1].strip() for ln in msg if ln.strip().startswith("full_key:")), None)
    first = msg[0] if msg else type(e).__name__
    if full_key:
        return f"{full_key}: {first}"
    return f"{first} (overrides: {' '.join(overrides)})"


def plan_model(cfg: DictConfig):
    """(model config as the mitigations change it, the mitigations); ConfigError when a mitigation cannot apply to
    the model (e.g. head_coord with one KV head)."""
    from phasefix.mitigations import build_mitigations

    model_cfg = C.model_config(cfg)
    mitigations = build_mitigations(cfg.get("mitigation"))
    for m in mitigations:
        model_cfg = m.configure_model(model_cfg)
    return model_cfg, mitigations


def plan(cfg: DictConfig) -> dict:
    """Validate everything and build the objects of a run, before any training or MLflow run starts."""
    model_cfg, mitigations = plan_model(cfg)
    C.validate_trainer(cfg.trainer)
    C.validate_optim(cfg.optim)
    C.validate_eval(cfg.eval)
    data_cfg = data_config(OmegaConf.to_container(cfg.data, resolve=True))
    data_cfg.vocab.check_fits(model_cfg.vocab_size)
    check(cfg.eval.period % model_cfg.stride == 0, "eval.period", cfg.eval.period,
          f"must be a multiple of model.stride ({model_cfg.stride}) so residue groups fold onto phases")
    try:  # the evaluation prompts must fit the trained task: check on a one-prompt-per-residue set
        from phasefix.data import make_phase_eval

        make_phase_eval("kv_lookup", cfg.eval.paddings[0], period=cfg.eval.period, per_residue=1,
                        **eval_task_kwargs(data_cfg))
    except ConfigError as e:
        raise ConfigError(str(e).replace("max_pad=", "data.max_prefix_pad=").replace("period=", "eval.period=")
                          .replace("num_", "data.num_")) from None
    return {"model": model_cfg, "data": data_cfg, "mitigations": mitigations}


DATA_KINDS = ("retrieval", "lm_mix")


def data_config(d: dict):
    """The data dataclass for `data.kind`: the retrieval task alone, or interleaved with text (`lm_mix`)."""
    import dataclasses

    from phasefix.data import RetrievalConfig
    from phasefix.data.lm_mix import LMMixConfig

    d = dict(d)
    kind = d.pop("kind", "retrieval")
    check_choice("data.kind", kind, DATA_KINDS)
    cls = LMMixConfig if kind == "lm_mix" else RetrievalConfig
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(f"data.{unknown[0]} is not a data key: allowed keys are {', '.join(sorted(known))}")
    return cls(**d)


def train_dataset(data_cfg, split: str, seed: int):
    from phasefix.data import make_train_dataset
    from phasefix.data.lm_mix import LMMixConfig, make_lm_mix_dataset

    if isinstance(data_cfg, LMMixConfig):
        return make_lm_mix_dataset(data_cfg, split=split, seed=seed)
    return make_train_dataset(data_cfg, split=split, seed=seed)


@torch.no_grad()
def lm_loss(model, dataset, first_text_token: int, batch_size: int = 64) -> float:
    """Mean next-token loss on held-out text positions (labels >= first_text_token)."""
    from torch.utils.data import DataLoader

    total, count = 0.0, 0
    for batch in DataLoader(dataset, batch_size=batch_size):
        logits = model(batch["input_ids"].long())
        labels = batch["labels"].long()
        mask = labels >= first_text_token
        total += torch.nn.functional.cross_entropy(logits[mask].float(), labels[mask], reduction="sum").item()
        count += int(mask.sum())
    return total / max(count, 1)


def eval_set(data_cfg, padding: str, period: int, per_residue: int, seed: int, *, task: str = "kv_lookup",
             task_kwargs: dict | None = None, text: bool = True):
    """The phase-controlled prompts (torch format) for the task the model was trained on (`task_kwargs`: default
    `eval_task_kwargs(data_cfg)`); for the LM mix with held-out text before the records, as in training
    (text=False: the plain protocol prompts)."""
    from phasefix.data import make_phase_eval
    from phasefix.data.lm_mix import LMMixConfig, add_text_context

    kw = eval_task_kwargs(data_cfg) if task_kwargs is None else task_kwargs
    ds = make_phase_eval(task, padding, period=period, per_residue=per_residue, seed=seed, **kw)
    if text and isinstance(data_cfg, LMMixConfig):
        ds = add_text_context(ds, data_cfg, period, seed)
    return ds.with_format("torch")


def eval_task_kwargs(data_cfg) -> dict:
    """`make_phase_eval` options that evaluate the task the model was trained on (sizes, vocabulary, filler)."""
    return dict(num_records=data_cfg.num_records, num_demos=min(data_cfg.num_demos, data_cfg.num_records - 1),
                num_keys=data_cfg.num_keys, num_values=data_cfg.num_values, num_filler=data_cfg.num_filler,
                max_pad=data_cfg.max_prefix_pad)


def run_name(cfg: DictConfig) -> str:
    if cfg.run_name:
        return cfg.run_name
    m = cfg.model
    name = m.name if m.attention == "full" else f"{m.name}-W{m.window}S{m.stride}"
    if cfg.get("mitigation"):
        name += "-" + "+".join(cfg.mitigation.keys())
    return name


# ------------------------------------------------------------------------------------------------ resume
def find_resume(resume: str) -> tuple[Path, Path]:
    """(run dir, checkpoint) for `resume=last`, a run output directory or a .ckpt path."""
    if resume == "last":
        runs = sorted(OUTPUTS_DIR.glob(f"*/*/{RUN_FILE}"), key=lambda p: p.stat().st_mtime)
        runs = [r.parent for r in runs if (r.parent / "checkpoints" / "last.ckpt").exists()]
        check(bool(runs), "resume", resume, f"no run with a last checkpoint under {OUTPUTS_DIR}")
        return runs[-1], runs[-1] / "checkpoints" / "last.ckpt"
    path = Path(resume).expanduser().resolve()
    if path.is_file() and path.suffix == ".ckpt":
        return path.parent.parent, path
    check(path.is_dir() and (path / "checkpoints" / "last.ckpt").exists(), "resume", resume,
          "must be 'last', a run output directory holding checkpoints/last.ckpt, or a .ckpt file")
    return path, path / "checkpoints" / "last.ckpt"


# ------------------------------------------------------------------------------------------------ fit
def fit(cfg: DictConfig, callbacks: Sequence = ()) -> dict:
    """Train, evaluate by phase (both paddings), log to MLflow; return the summary (also in summary.json).

    `callbacks`: extra Lightning callbacks (e.g. a study's pruner reading `val/<padding>/acc_*`)."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import MLFlowLogger
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from phasefix.data.lm_mix import LMMixConfig
    from phasefix.module import PhaseFixModule, RetrievalDataModule

    resume_ckpt = None
    if cfg.get("resume"):
        run_dir, resume_ckpt = find_resume(str(cfg.resume))
        stored = OmegaConf.load(run_dir / "config.yaml")
        stored.resume = None
        cfg = stored
        run_info = tracking.read_json(run_dir / RUN_FILE)
    p = plan(cfg)  # raises ConfigError before anything is written
    model_cfg, data_cfg = p["model"], p["data"]
    is_lm_mix = isinstance(data_cfg, LMMixConfig)
    resolved = C.to_container(cfg)

    torch.set_num_threads(cfg.trainer.num_threads)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    t_start = time.time()

    # data first: a broken data config must not leave a half-written run behind
    train_set = train_dataset(data_cfg, "train", cfg.seed).with_format("torch")
    val_sets = {pad: eval_set(data_cfg, pad, cfg.eval.period, cfg.eval.val_per_residue, cfg.eval.seed + 1)
                for pad in cfg.eval.paddings}

    c = tracking.client(cfg.logger.tracking_uri)
    if resume_ckpt is None:
        out_dir = Path(cfg.output_dir) if cfg.output_dir else (
            OUTPUTS_DIR / datetime.now().strftime("%Y-%m-%d") / f"{datetime.now():%H%M%S}-{run_name(cfg)}")
        out_dir.mkdir(parents=True, exist_ok=True)
        exp_id = tracking.get_or_create_experiment(c, cfg.logger.experiment_name)
        mitigation_names = ",".join(cfg.mitigation.keys()) if cfg.get("mitigation") else "none"
        run = c.create_run(exp_id, run_name=run_name(cfg), tags={
            "model": cfg.model.name, "attention": cfg.model.attention, "window": str(cfg.model.window),
            "stride": str(cfg.model.stride), "mitigations": mitigation_names, "seed": str(cfg.seed),
            "git_commit": tracking.git_commit(), "phasefix.kind": "fit", "output_dir": str(out_dir),
            **({"mlflow.parentRunId": cfg.logger.parent_run_id} if cfg.logger.parent_run_id else {}),
            **{str(k): str(v) for k, v in (cfg.logger.tags or {}).items()}})
        run_id = run.info.run_id
        tracking.log_params(c, run_id, resolved)
        c.log_text(run_id, OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
        (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        tracking.write_json(out_dir / RUN_FILE, {"mlflow_run_id": run_id, "tracking_uri": c.tracking_uri})
    else:
        out_dir, run_id = run_dir, run_info["mlflow_run_id"]
        c.update_run(run_id, status="RUNNING")
        c.set_tag(run_id, "resumed_from", str(resume_ckpt))

    status = "FAILED"
    try:
        module = PhaseFixModule(model=OmegaConf.to_container(cfg.model, resolve=True),
                                optim=OmegaConf.to_container(cfg.optim, resolve=True),
                                max_steps=cfg.trainer.max_steps,
                                mitigation=OmegaConf.to_container(cfg.mitigation, resolve=True)
                                if cfg.get("mitigation") else None,
                                paddings=tuple(cfg.eval.paddings), period=cfg.eval.period, seed=cfg.seed,
                                **(data_cfg.text_loss if is_lm_mix else {}))
        data = RetrievalDataModule(train_set, val_sets, batch_size=cfg.trainer.batch_size,
                                   eval_batch_size=cfg.eval.batch_size, seed=cfg.seed,
                                   max_steps=cfg.trainer.max_steps)
        logger = MLFlowLogger(experiment_name=cfg.logger.experiment_name, tracking_uri=c.tracking_uri,
                              run_id=run_id)
        ckpt_dir = out_dir / "checkpoints"
        callbacks = [
            ModelCheckpoint(dirpath=ckpt_dir, filename="step{step:06d}", auto_insert_metric_name=False,
                            every_n_train_steps=cfg.trainer.checkpoint_every_n_steps, save_last=True, save_top_k=0),
            ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor=f"val/{cfg.eval.paddings[0]}/acc_mean",
                            mode="max", save_top_k=1, auto_insert_metric_name=False),
            *callbacks,
        ]
        trainer = L.Trainer(
            accelerator=cfg.trainer.accelerator, devices=cfg.trainer.devices, strategy=cfg.trainer.strategy,
            precision=cfg.trainer.precision, max_steps=cfg.trainer.max_steps, max_epochs=-1,
            gradient_clip_val=cfg.trainer.gradient_clip_val, val_check_interval=cfg.trainer.val_every_n_steps,
            check_val_every_n_epoch=None, log_every_n_steps=cfg.trainer.log_every_n_steps,
            deterministic=cfg.trainer.deterministic, enable_progress_bar=cfg.trainer.progress_bar,
            enable_model_summary=False, num_sanity_val_steps=0, logger=logger, callbacks=callbacks,
            use_distributed_sampler=False, default_root_dir=str(out_dir))
        trainer.fit(module, datamodule=data, ckpt_path=str(resume_ckpt) if resume_ckpt else None)
        if trainer.interrupted:
            status = "KILLED"
            raise KeyboardInterrupt
        train_seconds = time.time() - t_start

        # the final phase evaluation, on fresh prompts with intervals
        from phasefix.evaluate import evaluate_phase

        model = module.model.eval()
        results = {}
        for pad in cfg.eval.paddings:
            ds = eval_set(data_cfg, pad, cfg.eval.period, cfg.eval.per_residue, cfg.eval.seed)
            results[pad] = evaluate_phase(model, ds, period=cfg.eval.period, stride=model_cfg.stride,
                                          n_boot=cfg.eval.n_boot, batch_size=cfg.eval.batch_size)
        summary = summarize(run_id, model_cfg, results, train_seconds, time.time() - t_start, out_dir)
        if is_lm_mix:
            val_text = train_dataset(data_cfg, "val", cfg.seed).with_format("torch")
            summary["lm_loss"] = round(lm_loss(model, val_text, data_cfg.vocab.byte_start), 4)
            c.log_metric(run_id, "final/lm_loss", summary["lm_loss"])
        log_final(c, run_id, cfg, model_cfg, module, results, summary, val_sets)
        tracking.write_json(out_dir / "summary.json", summary)
        c.log_artifact(run_id, str(out_dir / "summary.json"))
        status = "FINISHED"
        return summary
    except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C; SIGTERM: Lightning raises SIGTERMException (exit code 0)
        status = "KILLED"
        if isinstance(e, SIGTERMException):
            raise SystemExit(128 + 15) from e  # the shell's code for "terminated by SIGTERM"
        raise
    finally:
        c.set_terminated(run_id, status=status)


def summarize(run_id, model_cfg, results, train_seconds, total_seconds, out_dir) -> dict:
    summary = {"mlflow_run_id": run_id, "model": model_cfg.name, "attention": model_cfg.attention,
               "window": model_cfg.window, "stride": model_cfg.stride,
               "train_seconds": round(train_seconds, 1), "total_seconds": round(total_seconds, 1),
               "output_dir": str(out_dir)}
    for pad, res in results.items():
        summary[pad] = {k: _plain(res[k]) for k in ("acc_mean", "acc_worst", "acc_best", "acc_gap", "per_residue",
                                                    "period_detected", "worst_ci", "gap_ci", "periodicity_ratio")
                        if k in res}
    return summary


def _plain(v):
    if isinstance(v, torch.Tensor):
        v = v.tolist()
    if isinstance(v, float):
        return None if v != v else round(v, 4)  # NaN (an empty residue group) -> null in JSON
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def log_final(c, run_id, cfg, model_cfg, module, results, summary, val_sets) -> None:
    for pad, res in results.items():
        tracking.log_phase_result(c, run_id, pad, res)
    fig = tracking.phase_figure(results, model_cfg.stride,
                                title=f"{run_name(cfg)}  (run {run_id[:8]})")
    tracking.log_figure(c, run_id, fig, "phase_curves.png")
    c.log_text(run_id, tracking.residue_table(results), "phase_table.csv")
    if model_cfg.compressed and model_cfg.gate != "uniform":
        from phasefix.mitigations.gates import effective_slots, gate_heatmap

        probe = next(iter(val_sets.values()))[:64]["input_ids"]
        static = module.static_gates(probe)
        for layer, branches in enumerate(static):
            for branch, prob in branches.items():
                for h, e in enumerate(effective_slots(prob).tolist()):
                    c.log_metric(run_id, f"gates/L{layer}/{branch}/h{h}/eff_slots", e)
        tracking.log_figure(c, run_id, gate_heatmap(static), "gate_heatmap.png")


def resolve_checkpoint(run: str, tracking_uri: str | None = None, which: str = "last") -> Path:
    """A checkpoint path from a .ckpt path, a run output directory, or an MLflow run id."""
    path = Path(run).expanduser()
    if path.is_file():
        return path.resolve()
    if path.is_dir():
        ckpt = path / "checkpoints" / f"{which}.ckpt"
        check(ckpt.exists(), "run", run, f"the directory holds no checkpoints/{which}.ckpt")
        return ckpt.resolve()
    try:
        out = tracking.client(tracking_uri).get_run(run).data.tags.get("output_dir")
    except Exception:
        out = None
    check(out is not None, "run", run, "must be a .ckpt file, a run output directory or an MLflow run id of a fit")
    return resolve_checkpoint(out, which=which)


def load_checkpoint(run: str, tracking_uri: str | None = None, which: str = "last"):
    """(PhaseFixModule with the trained weights, its hyper-parameters) from `resolve_checkpoint(run)`;
    loaded with weights_only=True."""
    from phasefix.module import PhaseFixModule

    ckpt = torch.load(resolve_checkpoint(run, tracking_uri, which), map_location="cpu", weights_only=True)
    hp = dict(ckpt["hyper_parameters"])
    module = PhaseFixModule(**hp)
    module.load_state_dict(ckpt["state_dict"])
    return module.eval(), hp


def print_summary(summary: dict) -> None:
    print(f"\nphasefix fit: {summary['model']} ({summary['attention']}, W{summary['window']}/S{summary['stride']}), "
          f"trained in {summary['train_seconds']:.0f}s, MLflow run {summary['mlflow_run_id']}")
    print(f"{'padding':<12} {'mean':>6} {'worst':>6} {'best':>6} {'gap':>6} {'period':>6}  curve by residue")
    for pad in ("prefix", "in_sequence"):
        if pad in summary:
            s = summary[pad]
            print(f"{pad:<12} {s['acc_mean']:>6.3f} {s['acc_worst']:>6.3f} {s['acc_best']:>6.3f} "
                  f"{s['acc_gap']:>6.3f} {str(s.get('period_detected')):>6}  {tracking.sparkline(s['per_residue'])}")
    print(f"summary: {Path(summary['output_dir']) / 'summary.json'}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        print("Config groups:", ", ".join(sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())))
        return 0
    show_cfg = "--cfg" in argv
    argv = [a for a in argv if a != "--cfg"]
    try:
        cfg = compose(argv)
        if show_cfg:
            print(OmegaConf.to_yaml(cfg))
            return 0
        summary = fit(cfg)  # fit validates everything (plan) before it writes anything
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())

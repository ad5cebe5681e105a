"""`python -m phasefix.evaluate model=<HF model dir | phasefix run> task=kv_lookup|needle|flip [key=value ...]`
(or `endpoint=<base URL> model=<served name>`: an OpenAI-compatible server, scored through `phasefix.endpoint`)

Phase-grouped evaluation of any causal LM (science.md section 4), logged to MLflow like a fit run and written to
`<out>/summary.json`. A Hydra app: its keys and defaults are `phasefix.config.EvaluateConfig` (conf/evaluate.yaml;
`--help` lists them). Scoring is `phasefix.predict`; the prompts `phasefix.data` (text prompts for Hugging Face
models, the synthetic set of its training task for a phasefix run). torch is imported by the functions that use it,
so bad options are refused before it loads.
"""
from __future__ import annotations

import csv
import math
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from phasefix.data.layout import PADDINGS, PHASE_AXES
from phasefix.errors import ConfigError, check, check_all, check_choice

TASKS = ("kv_lookup", "needle", "flip")
SUMMARY_KEYS = ("acc_mean", "acc_worst", "acc_best", "acc_gap", "per_residue", "count", "period_detected",
                "worst_ci", "gap_ci", "periodicity_ratio", "fold_stride")
TASK_OPTIONS = ("num_records", "num_demos", "max_pad", "target_span", "num_filler", "max_length")


def flip_curve(model, probe, *, batch_size: int = 8, progress: bool = False) -> dict:
    """log p(completion 0) - log p(completion 1) per filler length, the folded curve and its detected period."""
    import torch

    from phasefix.metrics import detect_period
    from phasefix.predict import logits_at, progress_bar

    device = next(model.parameters()).device
    logp = np.zeros((2, probe.lengths))
    total = 2 * math.ceil(probe.lengths / batch_size)
    chunks = ((which, seqs[i:i + batch_size]) for which in (0, 1)
              for seqs in [list(probe.sequences(which))] for i in range(0, len(seqs), batch_size))
    done = [0, 0]
    with torch.no_grad():
        for which, chunk in progress_bar(chunks, total, "flip", progress):
            m = probe.completions[which].size
            width = max(s.size for _, s, _ in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)  # right padding: causal, positions untouched
            for b, (_, s, _) in enumerate(chunk):
                ids[b, :s.size] = torch.from_numpy(s)
            # logits at position p predict token p + 1: the completion's tokens are predicted from [start-1, start+m-1)
            need = sorted({start - 1 + k for _, _, start in chunk for k in range(m)})
            logits = logits_at(model, ids.to(device), torch.tensor(need, device=device)).float()
            lp = torch.log_softmax(logits, -1).cpu()
            col = {p: i for i, p in enumerate(need)}
            target = torch.from_numpy(probe.completions[which])
            for b, (_, _, start) in enumerate(chunk):
                rows = torch.tensor([col[start - 1 + k] for k in range(m)])
                logp[which, done[which] + b] = float(lp[b, rows, target].sum())
            done[which] += len(chunk)
    diff = logp[0] - logp[1]
    P = probe.period
    # Fold on the residue of the snippet's absolute position (the phase of everything after the filler).
    residue = (probe.head.size + probe.filler_lengths) % P
    folded = np.array([diff[residue == r].mean() for r in range(P)])
    return {"filler_lengths": probe.filler_lengths.tolist(), "logp_diff": diff.tolist(),
            "logp_a": logp[0].tolist(), "logp_b": logp[1].tolist(), "folded": folded.tolist(),
            "period_detected": int(detect_period(folded)), "period_fft": fft_period_safe(diff),
            "flip_rate": float(np.mean(np.sign(diff) != np.sign(np.median(diff)))) if diff.size else float("nan"),
            "range": float(np.ptp(diff))}


def fft_period_safe(curve) -> float | None:
    from phasefix.metrics import fft_period

    p = fft_period(np.asarray(curve))
    return None if math.isnan(p) else round(p, 3)


# ------------------------------------------------------------------------------------------------ options
def options(args: Sequence[str] | Mapping | DictConfig) -> dict:
    """key=value words, a mapping or a composed config -> validated options with defaults."""
    from phasefix.cli import options as app_options

    opts = OmegaConf.to_container(app_options(args, "evaluate"), resolve=True)
    if opts["endpoint"]:
        from phasefix.endpoint import check_options

        check_all(lambda: check_choice("task", opts["task"], TASKS), lambda: check_options(opts))
    else:
        check_all(lambda: check_model(opts["model"]), lambda: check_choice("task", opts["task"], TASKS))
        check(opts["tokenizer"] is None, "tokenizer", opts["tokenizer"], "applies with endpoint= only (a local "
              "model reads its own)")
    check_choice("phase_of", opts["phase_of"], PHASE_AXES)
    check(opts["score"] in (None, "top1", "exact"), "score", opts["score"], "allowed values are 'top1', 'exact'")
    check(opts["task"] != "flip" or (opts["phase_of"] == "fact" and opts["score"] is None), "task", opts["task"],
          "takes neither phase_of nor score (its curve is by filler length)")
    pads = list(PADDINGS) if opts["padding"] in (["both"], ["all"]) else opts["padding"]
    for p in pads:
        check_choice("padding", p, PADDINGS)
    opts["padding"] = list(dict.fromkeys(pads))
    for key in ("period", "stride", "batch_size", "lengths"):
        check(opts[key] is None or opts[key] >= 1, key, opts[key], "must be an integer >= 1 or null")
    for key in ("per_residue", "n_boot"):
        check(opts[key] >= 1, key, opts[key], "must be an integer >= 1")
    check_choice("dtype", opts["dtype"], ("float32", "bfloat16", "float16"))
    check_choice("which", opts["which"], ("last", "best"))
    return opts


MODEL_SPEC = "a Hugging Face model directory, or a phasefix run id, output directory or .ckpt"


def check_model(spec) -> None:
    """What can be checked of `model=` without loading anything: given, and a path that exists and is a Hugging Face
    model directory (config.json) or a phasefix run (output directory, .ckpt); anything else may be an MLflow run id."""
    from phasefix.fit_run import RUN_FILE, check_spec

    check(spec not in (None, ""), "model", spec, f"is required: {MODEL_SPEC}")
    path = Path(str(spec)).expanduser()
    if path.is_dir() and not (path / "config.json").exists() and not (path / RUN_FILE).exists() \
            and not (path / "checkpoints").is_dir():
        raise ConfigError(f"model={spec!r} is invalid: the directory is neither a Hugging Face model (no config.json) "
                          "nor a phasefix run output directory (no run.json, no checkpoints/)")
    if not (path / "config.json").exists():
        check_spec(str(spec), "model", MODEL_SPEC)


# ------------------------------------------------------------------------------------------------ models
class Target:
    """What is evaluated: kind 'hf' (model + tokenizer) or 'phasefix' (module.model + its training task)."""

    def __init__(self, kind: str, model, name: str, source: str, *, tokenizer=None, period: int = 24,
                 stride: int | None = None, tags: dict | None = None, data_cfg=None):
        self.kind, self.model, self.name, self.source, self.tokenizer = kind, model, name, source, tokenizer
        self.data_cfg = data_cfg  # phasefix: the training data config (its task sizes; the LM mix adds text)
        self.period, self.stride, self.tags = period, stride, tags or {}


def load_target(spec: str, *, tracking_uri: str | None = None, device: str | None = None,
                dtype: str = "float32", which: str = "last") -> Target:
    import torch

    path = Path(spec).expanduser()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if path.is_dir() and (path / "config.json").exists():
        return _load_hf(path, device, dtype)
    return _load_phasefix(spec, tracking_uri, device, which)


def _load_hf(path: Path, device: str, dtype: str) -> Target:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"model={str(path)!r} is invalid: not a loadable Hugging Face causal LM with a tokenizer "
                          f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    model = model.to(device).eval()
    name = path.resolve().name
    return Target("hf", model, name, str(path.resolve()), tokenizer=tokenizer,
                  tags={"model": name, "model_type": str(getattr(model.config, "model_type", "")),
                        "max_position_embeddings": str(getattr(model.config, "max_position_embeddings", ""))})


def _load_phasefix(spec: str, tracking_uri: str | None, device: str, which: str) -> Target:
    from phasefix.data import data_config
    from phasefix.fit_run import Run

    run = Run.open(spec, tracking_uri, key="model")
    ckpt = run.checkpoint(which, key="model")
    module, hp = run.load_module(which, key="model")
    cfg = run.config
    check(cfg is not None, "model", spec,
          f"the checkpoint has no config.yaml in {ckpt.parent.parent} (needed for the task it was trained on)")
    from omegaconf import OmegaConf

    data_cfg = data_config(OmegaConf.to_container(cfg.data, resolve=True))
    m = hp["model"]
    mitigations = ",".join(hp["mitigation"].keys()) if hp.get("mitigation") else "none"
    tags = {"model": str(m.get("name")), "attention": str(m.get("attention")), **{k: str(v) for k, v in module.model_config.shape_tags().items()},
            "mitigations": mitigations, "seed": str(hp.get("seed"))}
    if run.run_id:
        tags["phasefix.source_run"] = run.run_id
    stride = module.model_config.phase_stride if module.model_config.compressed else None
    return Target("phasefix", module.model.to(device).eval(), str(m.get("name")), str(ckpt),
                  period=int(hp.get("period", 24)), stride=stride, tags=tags, data_cfg=data_cfg)


# ------------------------------------------------------------------------------------------------ evaluation
def evaluate(args: Sequence[str] | Mapping | DictConfig = ()) -> dict:
    """Run one evaluation (key=value words, a mapping of options or the composed config); returns the summary (also
    written to <out>/summary.json)."""
    from phasefix import tracking
    from phasefix.paths import OUTPUTS_DIR

    opts = options(args)
    if opts["endpoint"]:
        target = load_endpoint(opts)
    else:
        target = load_target(str(opts["model"]), tracking_uri=opts["tracking_uri"], device=opts["device"],
                             dtype=opts["dtype"], which=opts["which"])
    score = opts["score"] or ("exact" if target.kind == "endpoint" else "top1")
    check(score == "top1" or target.kind != "phasefix", "score", score,
          "applies to Hugging Face models and endpoints (a phasefix checkpoint answers one synthetic token: top1)")
    period = opts["period"] or target.period
    stride = opts["stride"] or target.stride
    check(stride is None or period % stride == 0, "period", period,
          f"must be a multiple of the stride ({stride}) so residue groups fold onto phases")
    batch_size = opts["batch_size"] or (8 if target.kind == "hf" else 256)
    task_opts = {k: opts[k] for k in TASK_OPTIONS if opts[k] is not None}
    plan = _plan(opts, target, period, task_opts)  # every check before an MLflow run exists

    name = opts["run_name"] or f"eval-{opts['task']}-{target.name}"
    out = Path(opts["out"]) if opts["out"] else (
        OUTPUTS_DIR / datetime.now().strftime("%Y-%m-%d") / f"{datetime.now():%H%M%S}-{name}")
    out.mkdir(parents=True, exist_ok=True)
    scored = {}
    if target.kind == "endpoint":  # every request before the MLflow run: a failed one leaves no half-written run
        from phasefix.endpoint import score_set

        for pad, prompts in plan["sets"].items():
            scored[pad] = score_set(target.endpoint, prompts, target.tokenizer, pad, out, progress=opts["progress"])
    c = tracking.client(opts["tracking_uri"])
    tags = {**target.tags, "task": opts["task"], "period": str(period), "stride": str(stride or "none"),
            "source": target.source, "phasefix.kind": "evaluate", "output_dir": str(out.resolve()),
            **({} if opts["task"] == "flip" else {"phase_of": opts["phase_of"], "score": score}), **opts["tags"]}
    run_id = tracking.create_run(c, opts["experiment"], name, tags)  # tags git_commit too
    tracking.log_params(c, run_id, {k: (",".join(v) if isinstance(v, list) else v) for k, v in opts.items()
                                    if k not in ("verbose", "tags")}
                        | {"period": period, "stride": stride, "batch_size": batch_size})
    t0 = time.time()
    with tracking.running(c, run_id):
        summary = {"mlflow_run_id": run_id, "kind": "evaluate", "model": target.name, "source": target.source,
                   "task": opts["task"], "period": period, "stride": stride, "output_dir": str(out.resolve())}
        if opts["task"] == "flip":
            probe = plan["flip"]
            res = flip_curve(target.model, probe, batch_size=batch_size, progress=opts["progress"])
            summary["flip"] = {**probe.describe(), **res}
            _log_flip(c, run_id, out, summary["flip"], name)
        else:
            _score_lookup(c, run_id, target, plan, opts, summary, scored, name=name, out=out, score=score,
                          period=period, stride=stride, batch_size=batch_size)
        summary["seconds"] = round(time.time() - t0, 1)
        tracking.write_json(out / "summary.json", summary)
        tracking.log_dict(c, run_id, summary, "summary.json")
        return summary



def _score_lookup(c, run_id, target, plan, opts, summary, scored, *, name, out, score, period, stride,
                  batch_size) -> None:
    """Score a kv_lookup/needle plan by phase into `summary`, logging its curves, grid, answers and table."""
    from phasefix import plots, tracking

    results, grids, answers = {}, {}, []
    summary["phase_of"], summary["score"] = opts["phase_of"], score
    for pad, prompts in plan["sets"].items():
        scores, axes = score_by_phase(target, prompts, score=score, phase_of=opts["phase_of"], period=period,
                                      stride=stride, n_boot=opts["n_boot"], batch_size=batch_size,
                                      seed=opts["seed"], progress=opts["progress"],
                                      desc=f"{opts['task']}/{pad}", scores=scored.get(pad))
        if target.kind != "phasefix":
            summary.setdefault("prompts", {})[pad] = prompts.describe()
        else:
            summary.setdefault("prompts", {})[pad] = {"num_prompts": len(prompts),
                                                      "prompt_length": len(prompts[0]["input_ids"]),
                                                      **plan["synthetic_kwargs"]}
        for axis, res in axes.items():
            if axis == "grid":
                grids[pad] = res
                summary[f"{pad}_grid"] = {k: _plain(v) for k, v in res.items()}
                continue
            label = pad if axis == "fact" else f"{pad}_end"
            results[label] = res
            summary[label] = phase_summary(res)
            tracking.log_phase_result(c, run_id, label, res)
        answers += [[pad, i, r, e, k, int(ok), t] for i, (r, e, k, ok, t) in enumerate(
            zip(scores["residue"], scores["end_residue"], scores["cluster"], scores["correct"],
                scores.get("answers") or ()))]
    fig = plots.phase_curves(results, stride, title=f"{name} {opts['task']}  (run {run_id[:8]})")
    fig.savefig(out / "phase_curves.png", dpi=110)
    tracking.log_figure(c, run_id, fig, "phase_curves.png")
    if grids:
        fig = plots.phase_grid_heatmap(grids, title=f"{name} {opts['task']}  (run {run_id[:8]})")
        fig.savefig(out / "phase_grid.png", dpi=110)
        tracking.log_figure(c, run_id, fig, "phase_grid.png")
    if answers:  # the generated text of every prompt (score=exact)
        with open(out / "answers.csv", "w", newline="") as f:
            csv.writer(f).writerows([["padding", "index", "residue", "end_residue", "cluster", "correct",
                                      "text"], *answers])
        tracking.log_files(c, run_id, [out / "answers.csv"])
    (out / "phase_table.csv").write_text(tracking.residue_table(results))
    tracking.log_files(c, run_id, [out / "phase_table.csv"])

def load_endpoint(opts: dict) -> Target:
    """An OpenAI-compatible server's model, its tokenizer loaded here to place the phases (`phasefix.endpoint`)."""
    from phasefix.endpoint import Endpoint, load_tokenizer

    name = opts["tokenizer"] or opts["model"]
    short = str(opts["model"]).rstrip("/").rsplit("/", 1)[-1]  # Qwen/Qwen3-0.6B: Qwen3-0.6B names the run
    target = Target("endpoint", None, short, str(opts["endpoint"]), tokenizer=load_tokenizer(name),
                    tags={"model": str(opts["model"]), "endpoint": str(opts["endpoint"]), "tokenizer": str(name)})
    target.endpoint = Endpoint(opts["endpoint"], opts["model"], timeout=opts["timeout"], retries=opts["retries"],
                               concurrency=opts["concurrency"])
    return target


def score_by_phase(target: Target, prompts, *, period: int, stride: int | None, n_boot: int, batch_size: int,
                   score: str = "top1", phase_of: str = "fact", seed: int = 0, progress: bool = False,
                   desc: str = "evaluate", scores: dict | None = None) -> tuple[dict, dict]:
    """One prompt set scored and grouped by phase: (per-prompt scores, `metrics.phase_axes` of them). The one scoring
    of `phasefix.evaluate` (every padding, every kind of model) and of `phasefix.fit`'s final evaluation (its model,
    top-1, by the fact's phase). `scores`: the set's scores when they were taken already (an endpoint's answers)."""
    from phasefix.metrics import phase_axes

    scores = scores or _score(target, prompts, score, batch_size, progress, desc)
    return scores, phase_axes(scores["correct"], scores["residue"], scores["end_residue"], scores["cluster"],
                              phase_of=phase_of, period=period, fold_stride=stride, n_boot=n_boot, seed=seed)


def phase_summary(res: Mapping, keys: Sequence[str] = SUMMARY_KEYS) -> dict:
    """A phase result's `keys` as plain JSON values (summary.json)."""
    return {k: _plain(res[k]) for k in keys if k in res}


def _score(target: Target, prompts, score: str, batch_size: int, progress: bool, desc: str) -> dict:
    """A local model's per-prompt scores: correct, residue, end_residue, cluster (and answers for score=exact)."""
    from phasefix.predict import predict

    if score == "exact":
        from phasefix.endpoint import generate_set

        return generate_set(target.model, prompts, target.tokenizer, batch_size=batch_size, progress=progress,
                            desc=desc)
    o = predict(target.model, prompts, batch_size, progress=progress, desc=desc)
    return {"correct": o.correct, "residue": o.residue, "end_residue": o.end_residue, "cluster": o.cluster}


def _plan(opts: dict, target: Target, period: int, task_opts: dict) -> dict:
    """The prompt sets (lazy for Hugging Face models) or the flip probe, validated."""
    task = opts["task"]
    if task == "flip":
        check(target.kind == "hf", "task", task, "needs a Hugging Face model with a tokenizer (phasefix "
              "checkpoints read synthetic token ids)")
        check(not task_opts, "task", task, f"takes lengths and start, not {', '.join(task_opts)}")
        from phasefix.data.text_prompts import FlipProbe

        return {"flip": FlipProbe(target.tokenizer, period=period, lengths=opts["lengths"], start=opts["start"])}
    check(opts["lengths"] is None, "lengths", opts["lengths"], "applies to task='flip' only")
    from phasefix.data.lm_mix import LMMixConfig

    is_lm_mix = isinstance(target.data_cfg, LMMixConfig)
    check(opts["text"] is None or is_lm_mix, "text", opts["text"],
          "applies to phasefix checkpoints trained with data.kind=lm_mix only")
    if target.kind in ("hf", "endpoint"):
        from phasefix.data.text_prompts import TextPhaseSet

        sets = {pad: TextPhaseSet(target.tokenizer, task, pad, period=period, per_residue=opts["per_residue"],
                                  seed=opts["seed"], phase_of=opts["phase_of"], **task_opts) for pad in opts["padding"]}
        if target.kind == "endpoint":  # the server is asked once before any work: it answers, serves the model
            from phasefix.endpoint import prompt_text

            first = next(iter(sets.values()))
            target.endpoint.check(prompt_text(target.tokenizer, first.row(0)["input_ids"]))
            return {"sets": sets}
        limit = getattr(target.model.config, "max_position_embeddings", None)
        first = next(iter(sets.values()))
        if limit and first.width > limit:
            print(f"warning: prompts of {first.length} tokens exceed the model's max_position_embeddings={limit}",
                  file=sys.stderr)
        return {"sets": sets}
    from phasefix.data import eval_set, eval_task_kwargs
    from phasefix.data.phase_eval import TASK_DEFAULTS

    for key in ("max_length", "num_filler"):
        check(key not in task_opts, key, task_opts.get(key), "applies to Hugging Face models only (a phasefix "
              "checkpoint's filler vocabulary and length follow its training task)")
    kw = eval_task_kwargs(target.data_cfg)
    if task == "needle":  # the trained vocabulary, the needle's own sizes
        kw = {k: kw[k] for k in ("num_keys", "num_values", "num_filler")}
        kw["num_demos"] = TASK_DEFAULTS["needle"]["num_demos"]
    kw.update(task_opts)
    text = opts["text"] is not False
    sets = {pad: eval_set(target.data_cfg, pad, period, opts["per_residue"], opts["seed"], task=task, task_kwargs=kw,
                          text=text, phase_of=opts["phase_of"]) for pad in opts["padding"]}
    if is_lm_mix and text:
        kw = {**kw, "text_before": target.data_cfg.text_before}
    return {"sets": sets, "synthetic_kwargs": kw}


def _plain(v):
    if hasattr(v, "tolist"):  # a tensor or numpy value
        v = v.tolist()
    if isinstance(v, float):
        return None if v != v else round(v, 4)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _log_flip(c, run_id: str, out: Path, res: dict, name: str) -> None:
    from phasefix import plots, tracking

    tracking.log_metric_values(c, run_id, {f"flip/{k}": res[k] for k in ("period_detected", "period_fft", "flip_rate",
                                                                         "range")},
                               {"flip/logp_diff": dict(zip(res["filler_lengths"], res["logp_diff"]))})
    fig = plots.flip_curve(res, name)
    fig.savefig(out / "flip_curve.png", dpi=110)
    tracking.log_figure(c, run_id, fig, "flip_curve.png")
    rows = ["filler_length,logp_a,logp_b,logp_diff"] + [
        f"{f},{a:.6f},{b:.6f},{d:.6f}" for f, a, b, d in zip(res["filler_lengths"], res["logp_a"], res["logp_b"],
                                                            res["logp_diff"])]
    (out / "flip_table.csv").write_text("\n".join(rows) + "\n")
    tracking.log_files(c, run_id, [out / "flip_table.csv"])


def print_summary(summary: dict) -> None:
    from phasefix.tracking import sparkline

    print(f"\nphasefix evaluate: {summary['model']} task={summary['task']} period={summary['period']} "
          f"stride={summary['stride']}, {summary['seconds']:.0f}s, MLflow run {summary['mlflow_run_id']}")
    if "flip" in summary:
        f = summary["flip"]
        d = np.asarray(f["logp_diff"])
        span = (d - d.min()) / (np.ptp(d) or 1)
        print(f"flip {f['completions'][0]!r} vs {f['completions'][1]!r}: range {f['range']:.3f}, flip rate "
              f"{f['flip_rate']:.2f}, period detected {f['period_detected']} (FFT {f['period_fft']})")
        print(f"  {tracking_spark(span)}")
    labels = [label for pad in PADDINGS for label in (pad, f"{pad}_end") if label in summary]
    for label in labels:
        s = summary[label]
        if label == labels[0]:
            print(f"{'padding':<16} {'mean':>6} {'worst':>6} {'best':>6} {'gap':>6} {'period':>6}"
                  f"  curve by residue (score={summary.get('score')}; _end: by the prompt's end)")
        print(f"{label:<16} {s['acc_mean']:>6.3f} {s['acc_worst']:>6.3f} {s['acc_best']:>6.3f} "
              f"{s['acc_gap']:>6.3f} {str(s.get('period_detected')):>6}  {sparkline(s['per_residue'])}")
    print(f"summary: {Path(summary['output_dir']) / 'summary.json'}")


def tracking_spark(values) -> str:
    from phasefix.tracking import sparkline

    return sparkline([float(v) for v in values])


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m phasefix.evaluate`: 0 done, 2 a bad option (one line), 130 interrupted (Ctrl-C)."""
    from phasefix import cli

    def work(cfg: DictConfig) -> int:
        from phasefix.console import quiet  # Lightning: after the options are checked (check=options)

        quiet(cfg.verbose)  # -v: the libraries' own output too
        print_summary(evaluate(cfg))
        return 0

    return cli.run("evaluate", argv, work, shim=lambda words: cli.overrides(words, "evaluate"), check=options)


if __name__ == "__main__":
    sys.exit(main())

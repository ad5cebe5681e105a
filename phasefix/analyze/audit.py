"""Phase audit from the weights (issue 22; docs/deepseek_v4.md): which phases a compressed model will be weak at,
predicted per compressor from its slot biases alone, optionally calibrated on prompts, and checked against the
measured accuracy curve.

    python -m phasefix.analyze gates model=<HF DeepSeek-V4 dir | phasefix run> [period=24] [calibrate=true]
    python -m phasefix.analyze audit model=<...> [task=kv_lookup|needle] [...]   # prediction + evaluate + comparison

Vocabulary (science.md §2-§3). A compressor pools each window of W slots into one entry; slot i of a window holds a
token whose phase t mod S it fixes. The gate logit of slot i on channel c is content + bias, z_{i,c} = Z_i x + b_{i,c};
the weights-only prediction drops the content term:

    a0[i, c] = softmax_i b[i, c]                       the bias-only gate, per channel         [W, Ch]
    m(p)     = mean_c sum_{i: phase(i) = p} a0[i, c]   phase mass (sums to 1; uniform: 1/S)    [S]
    eff      = mean_c exp(H(a0[:, c]))                 effective slots (W: no preference, 1: one slot)
    trust    = rms_c std_i b[i, c] / rms_{i,c} sigma[i, c],  sigma[i, c] = ||g * Z_i[:, c]||_2
             the bias spread over slots against the typical size of the content term for an input x = g * u,
             u with unit-RMS i.i.d. coordinates and g the layer's input-norm weight (the compressor reads the normed
             hidden state). trust >> 1: the bias decides the gate and a0 is what the model does; trust << 1: the
             content decides and a0 is a weak prior (calibrate=true measures E[a] instead).

A token whose phase gets little mass is written weakly into every entry that holds it: the predicted weak phase is
argmin_p m(p). Folding to the evaluation period P (accuracy is measured by residue r = t mod P): with
g = gcd(S, P), residue r fixes t mod g and nothing finer, and over target positions spread over lcm(S, P) tokens each
of the S/g slots of class r mod g is equally likely, so m_P(r) = (g/P) * sum_{p = r (mod g)} m(p). For CSA (S = 4,
P = 24) that is m(r mod 4)/6; for HCA (S = 128, P = 24, g = 8) only the mass of each slot class mod 8 is visible:
an HCA layer can only make a mod-8 pattern in a mod-24 curve (DeepSeek-V4's published curves are by t mod 8).
The model's prediction is the mean of m_P over its main compressors (CSA and HCA; the indexer's compressor only
ranks entries, `include=all` adds it).
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from phasefix.analyze.audit_source import (READINGS, GateBias, Source, calibrate, hf_gate_biases,  # noqa: F401
                                          hf_gate_means, load_source, phasefix_gate_biases, read_compressor_tensors,
                                          state_tensors)
from phasefix.errors import ConfigError, check, check_choice

KINDS = ("csa", "indexer", "hca", "key", "value")  # DeepSeek-V4 compressors; phasefix branches
INCLUDE = ("main", "all")
TASKS = ("kv_lookup", "needle")

def validate(opts: dict) -> dict:
    """The audit's options (`analyze.tool_options(cfg, "audit")`), checked (keys: `phasefix.config.AnalyzeConfig`)."""
    check(opts["model"] not in (None, ""), "model", opts["model"],
          "is required: a Hugging Face DeepSeek-V4 directory or a phasefix run (run id, output directory, .ckpt)")
    check_choice("include", opts["include"], INCLUDE)
    check_choice("reading", opts["reading"], READINGS)
    check_choice("task", opts["task"], TASKS)
    check_choice("padding", opts["padding"], ("prefix", "in_sequence", "both"))
    check_choice("which", opts["which"], ("last", "best"))
    check_choice("dtype", opts["dtype"], ("float32", "bfloat16", "float16"))
    for key in ("per_residue", "max_prompts", "batch_size", "n_boot"):
        check(opts[key] >= 1, key, opts[key], "must be an integer >= 1")
    check(opts["period"] is None or opts["period"] >= 1, "period", opts["period"], "must be an integer >= 1")
    return opts


# ------------------------------------------------------------------------------------------------ prediction
def fold(mass: np.ndarray, period: int) -> np.ndarray:
    """Phase mass m [S] -> mass by residue r = t mod P [P]: m_P(r) = (g/P) sum_{p = r mod g} m(p), g = gcd(S, P)."""
    S = len(mass)
    g = math.gcd(S, period)
    by_class = np.array([mass[q::g].sum() for q in range(g)])  # [g]
    return by_class[np.arange(period) % g] * g / period


def phase_stats(a: torch.Tensor, phase: torch.Tensor, stride: int, period: int) -> dict:
    """Statistics of a slot distribution per channel, a [W, Ch] (columns sum to 1), slots at `phase` [W, Ch]."""
    a = a.double()
    Ch = a.shape[1]
    live = phase >= 0  # phase -1: a slot that answers nothing (phasefix's answer reading): its mass is dropped
    mass = torch.zeros(stride, dtype=torch.float64).index_add_(0, phase[live], a[live]) / Ch  # [S]
    ent = -torch.special.xlogy(a, a).sum(0)  # [Ch]
    pref = phase.gather(0, a.argmax(0, keepdim=True))[0]  # [Ch] the phase of each channel's preferred slot
    pref = pref[pref >= 0]
    m = mass.numpy()
    g = math.gcd(stride, period)
    return {"mass": m, "mass_period": fold(m, period), "eff_slots": float(ent.exp().mean()),
            "eff_static": float(torch.exp(-torch.special.xlogy(a.mean(1), a.mean(1)).sum())),
            "channels_by_phase": np.bincount(pref.numpy(), minlength=stride),
            "weak_phase": int(m.argmin()), "weak_class": int(fold(m, g).argmin()), "class_period": g,
            "depth": float(m.min() * stride)}  # 1: uniform, 0: the weak phase gets nothing


def predict(gb: GateBias, period: int) -> dict:
    """The weights-only prediction of one compressor: phase_stats of a0 = softmax over slots of the bias, and the
    trust figure (bias spread over slots against the content term's scale)."""
    a0 = torch.softmax(gb.bias.double(), dim=0)  # [W, Ch]
    out = phase_stats(a0, gb.phase, gb.stride, period)
    spread = float(gb.bias.double().std(dim=0, unbiased=False).pow(2).mean().sqrt())  # rms_c std_i b
    content = float("nan") if gb.content is None else float(gb.content.double().pow(2).mean().sqrt())
    out.update(bias_spread=spread, content_scale=content,
               trust=spread / content if content and content == content else float("nan"), a=a0.float())
    return out


def model_prediction(biases: Sequence[GateBias], stats: Sequence[dict], period: int, include: str = "main") -> dict:
    """The model's mass by residue (mean of m_P over the chosen compressors), its weak residue, and the same folded
    to the model's phase period s = gcd(P, every chosen stride) (4 for DeepSeek-V4 at P = 24)."""
    chosen = [s for gb, s in zip(biases, stats) if include == "all" or gb.main]
    if not chosen:
        raise ConfigError("model=... is invalid: it has no compressor with slot biases to audit")
    M = np.mean([s["mass_period"] for s in chosen], axis=0)  # [P]
    s_period = period
    for gb in biases:
        if include == "all" or gb.main:
            s_period = math.gcd(s_period, gb.stride)
    by_phase = np.array([M[q::s_period].sum() for q in range(s_period)])  # [s]
    return {"mass_period": M, "weak_residue": int(M.argmin()), "mass_phase": by_phase, "phase_period": s_period,
            "weak_phase": int(by_phase.argmin()), "depth": float(by_phase.min() * s_period),
            "compressors": len(chosen)}


def pearson(x, y) -> float:
    """Pearson correlation, nan when either side is constant or has fewer than 3 finite points."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


# ------------------------------------------------------------------------------------------------ reporting
def csv_rows(biases: Sequence[GateBias], stats: Sequence[dict], period: int, source: str = "weights") -> list[str]:
    head = ("compressor,layer,kind,source,stride,window,channels,main,eff_slots,eff_static,bias_spread,content_scale,"
            "trust,weak_phase,weak_class,class_period,depth,mass_by_phase,channels_by_phase,"
            + ",".join(f"m_r{r}" for r in range(period)))
    rows = [head]
    for gb, s in zip(biases, stats):
        rows.append(",".join(str(x) for x in [
            gb.name, gb.layer, gb.kind, source, gb.stride, gb.window, gb.bias.shape[1], int(gb.main),
            f"{s['eff_slots']:.4f}", f"{s['eff_static']:.4f}", f"{s.get('bias_spread', float('nan')):.4f}",
            f"{s.get('content_scale', float('nan')):.4f}", f"{s.get('trust', float('nan')):.4f}", s["weak_phase"],
            s["weak_class"], s["class_period"], f"{s['depth']:.4f}", ";".join(f"{x:.5f}" for x in s["mass"]),
            ";".join(str(int(x)) for x in s["channels_by_phase"])] + [f"{x:.6f}" for x in s["mass_period"]]))
    return rows


def _short(m: np.ndarray, k: int = 8) -> str:
    """The first k numbers of a mass curve x its length (1 = uniform)."""
    n = len(m)
    vals = " ".join(f"{x * n:.2f}" for x in m[:k])
    return vals + (f" ... ({n})" if n > k else "")


def table(biases: Sequence[GateBias], stats: Sequence[dict]) -> str:
    lines = [f"{'compressor':<14}{'S':>5}{'W':>5}{'eff':>8}{'trust':>8}{'weak':>6}{'class':>7}{'depth':>7}"
             "  mass by phase x S (1 = uniform)            channels by preferred phase"]
    for gb, s in zip(biases, stats):
        cls = f"{s['weak_class']}/{s['class_period']}"
        chans = s["channels_by_phase"]
        chan = " ".join(str(int(x)) for x in chans[:8]) + (" ..." if len(chans) > 8 else "")
        trust = s.get("trust", float("nan"))
        lines.append(f"{gb.name:<14}{gb.stride:>5}{gb.window:>5}{s['eff_slots']:>8.2f}{trust:>8.3f}"
                     f"{s['weak_phase']:>6}{cls:>7}{s['depth']:>7.2f}  {_short(s['mass']):<42} {chan}")
    return "\n".join(lines)


def output_dir(opts: dict, tool: str, name: str) -> Path:
    from phasefix.paths import OUTPUTS_DIR

    if opts["out"]:
        out = Path(opts["out"]).expanduser()
    else:
        now = datetime.now()
        out = OUTPUTS_DIR / now.strftime("%Y-%m-%d") / f"{now:%H%M%S}-{tool}-{re.sub(r'[^A-Za-z0-9._-]', '_', name)}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def _metrics(prefix: str, biases, stats) -> tuple[dict, dict]:
    scalars, curves = {}, {}
    for gb, s in zip(biases, stats):
        k = f"{prefix}/{gb.name}"
        for key in ("eff_slots", "eff_static", "trust", "bias_spread", "weak_phase", "weak_class", "depth"):
            if key in s:
                scalars[f"{k}/{key}"] = float(s[key])
        curves[f"{k}/mass"] = [float(x) for x in s["mass"]]
        curves[f"{k}/mass_period"] = [float(x) for x in s["mass_period"]]
        curves[f"{k}/channels_by_phase"] = [float(x) for x in s["channels_by_phase"]]
    return scalars, curves


def _model_metrics(prefix: str, m: dict) -> tuple[dict, dict]:
    return ({f"{prefix}/weak_residue": m["weak_residue"], f"{prefix}/weak_phase": m["weak_phase"],
             f"{prefix}/depth": m["depth"], f"{prefix}/phase_period": m["phase_period"]},
            {f"{prefix}/mass_period": list(m["mass_period"]), f"{prefix}/mass_phase": list(m["mass_phase"])})


def gates_audit(opts: dict, tool: str = "gates", source: Source | None = None) -> dict:
    """`analyze gates model=...`: the weights-only prediction (and with calibrate=true the measured E[a]) for every
    compressor, printed, written as CSV and heatmap to the output directory and logged as an MLflow run."""
    from phasefix import plots

    source = source or load_source(opts)
    P = source.period
    biases = source.biases
    stats = [predict(gb, P) for gb in biases]
    model = model_prediction(biases, stats, P, opts["include"])
    print(f"phasefix analyze {tool}: {source.name} ({source.kind}), {len(biases)} compressors, evaluation period {P}")
    print("\nweights only: bias-only gate a0 = softmax over slots of the slot biases")
    print(table(biases, stats))
    print(f"model ({model['compressors']} compressors, include={opts['include']}): predicted weak residue "
          f"{model['weak_residue']} (mod {P}), weak phase {model['weak_phase']} (mod {model['phase_period']}), "
          f"mass by phase x {model['phase_period']}: "
          + " ".join(f"{x * model['phase_period']:.3f}" for x in model["mass_phase"]))
    result = {"source": source, "biases": biases, "stats": stats, "model": model, "period": P}
    rows = csv_rows(biases, stats, P)
    fig_rows = [(gb.name, s["mass_period"]) for gb, s in zip(biases, stats)] + [("model", model["mass_period"])]
    if opts["calibrate"]:
        means = calibrate(source, opts)
        cal_b = [gb for gb in biases if gb.name in means]
        cal = []
        for gb in cal_b:
            a = means[gb.name]
            phase = gb.phase[:, : a.shape[1]] if a.shape[1] <= gb.phase.shape[1] else gb.phase
            cal.append(phase_stats(a, phase, gb.stride, P))
        cal_model = model_prediction(cal_b, cal, P, opts["include"]) if cal_b else None
        print("\ncalibrated: E[a] over the phase-controlled prompts")
        print(table(cal_b, cal))
        if cal_model:
            print(f"model (calibrated): weak residue {cal_model['weak_residue']}, weak phase {cal_model['weak_phase']}"
                  f" (mod {cal_model['phase_period']}); Pearson(a0 mass, E[a] mass) over residues "
                  f"{pearson(model['mass_period'], cal_model['mass_period']):.3f}")
        rows += csv_rows(cal_b, cal, P, "calibrated")[1:]
        if cal_model:
            fig_rows.append(("model (E[a])", cal_model["mass_period"]))
        result.update(calibrated=cal, calibrated_biases=cal_b, calibrated_model=cal_model)
    out = output_dir(opts, tool, source.name)
    (out / "gates_audit.csv").write_text("\n".join(rows) + "\n")
    fig = plots.audit_phase_heatmap(fig_rows, P, title=f"{source.name}: predicted phase mass by residue (weights "
                                                       "only; last row: model)")
    fig.savefig(out / "gates_audit.png", dpi=110, bbox_inches="tight", pad_inches=0.08)  # the colorbar label whole
    result.update(out=out, figure=fig, csv=out / "gates_audit.csv")
    print(f"\nwrote {out / 'gates_audit.csv'} and {out / 'gates_audit.png'}")
    return result


def _log(opts: dict, tool: str, result: dict, extra_scalars: Mapping = {}, extra_curves: Mapping = {},
         tags: Mapping = {}, figures: Mapping = {}) -> str | None:
    """One MLflow run (tag phasefix.kind=audit) holding the prediction's metrics, the CSV, the figures and a JSON."""
    if not opts["log"]:
        print("not logged (log=false)")
        return None
    from phasefix import tracking

    source = result["source"]
    c = tracking.client(opts["tracking_uri"])
    run_tags = {"phasefix.kind": "audit", "audit.tool": tool, "model": source.name, "source": source.spec,
                "period": str(result["period"]), "output_dir": str(result["out"].resolve()), **tags}
    if source.kind == "phasefix" and source.ctx.run_id:
        run_tags["phasefix.source_run"] = source.ctx.run_id
    run_id = tracking.create_run(c, opts["experiment"], opts["run_name"] or f"{tool}-{source.name}", run_tags)
    with tracking.running(c, run_id):
        tracking.log_params(c, run_id, {k: v for k, v in opts.items() if v is not None})
        scalars, curves = _metrics("audit", result["biases"], result["stats"])
        ms, mc = _model_metrics("audit/model", result["model"])
        scalars.update(ms)
        curves.update(mc)
        if result.get("calibrated_model"):
            s2, c2 = _metrics("audit/calibrated", result["calibrated_biases"], result["calibrated"])
            ms, mc = _model_metrics("audit/calibrated/model", result["calibrated_model"])
            scalars.update({**s2, **ms})
            curves.update({**c2, **mc})
        scalars.update(extra_scalars)
        curves.update(extra_curves)
        tracking.log_metric_values(c, run_id, scalars, curves)
        tracking.log_files(c, run_id, [result["csv"]])
        tracking.log_figure(c, run_id, result["figure"], "gates_audit.png")
        for path, fig in figures.items():
            tracking.log_figure(c, run_id, fig, path)
        summary = summary_json(result)
        tracking.write_json(result["out"] / "audit.json", summary)
        tracking.log_files(c, run_id, [result["out"] / "audit.json"])
    print(f"logged to MLflow run {run_id} ({c.tracking_uri})")
    return run_id


def summary_json(result: dict) -> dict:
    def plain(v):
        if isinstance(v, np.ndarray):
            return [plain(x) for x in v.tolist()]
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, float):
            return None if v != v else round(v, 6)
        if isinstance(v, (np.floating, np.integer)):
            return plain(v.item())
        return v

    keep = ("mass", "mass_period", "eff_slots", "eff_static", "trust", "bias_spread", "content_scale", "weak_phase",
            "weak_class", "class_period", "depth", "channels_by_phase")
    out = {"model_name": result["source"].name, "source": result["source"].spec, "period": result["period"],
           "model": {k: plain(v) for k, v in result["model"].items()},
           "compressors": {gb.name: {k: plain(s[k]) for k in keep if k in s}
                           for gb, s in zip(result["biases"], result["stats"])}}
    if result.get("calibrated_model"):
        out["calibrated_model"] = {k: plain(v) for k, v in result["calibrated_model"].items()}
    if "comparison" in result:
        out["comparison"] = {pad: {k: ({kk: plain(vv) for kk, vv in v.items()} if isinstance(v, dict) else plain(v))
                                   for k, v in c.items()} for pad, c in result["comparison"].items()}
    return out


# ------------------------------------------------------------------------------------------------ the audit
def compare(model: dict, measured: Sequence[float], stride: int) -> dict:
    """Predicted mass by residue against measured accuracy by residue: Pearson over the P residues, and over the
    phases after folding both onto `stride`; predicted vs measured weak phase (mod stride)."""
    acc = np.asarray(measured, dtype=np.float64)
    P = len(acc)
    M = np.asarray(model["mass_period"])
    acc_phase = np.array([np.nanmean(acc[q::stride]) for q in range(stride)])
    M_phase = np.array([M[q::stride].sum() for q in range(stride)])
    weak_pred, weak_meas = int(M_phase.argmin()), int(np.nanargmin(acc_phase)) if np.isfinite(acc_phase).any() else -1
    live = M > 0  # residues some slot can answer (phasefix's answer reading gives the boundary phase none)
    return {"pearson_r": pearson(M, acc), "pearson_r_phase": pearson(M_phase, acc_phase),
            "pearson_r_live": pearson(M[live], acc[live]),
            "predicted_weak_phase": weak_pred, "measured_weak_phase": weak_meas,
            "weak_phase_agrees": float(weak_pred == weak_meas), "acc_phase": acc_phase, "mass_phase": M_phase,
            "acc_residue": acc, "stride": stride, "period": P}


def audit(opts: dict) -> dict:
    """`analyze audit model=...`: predict from the weights, evaluate with `phasefix.evaluate`, compare."""
    from phasefix import plots
    from phasefix.evaluate import evaluate

    source = load_source(opts)
    result = gates_audit(opts, "audit", source)
    P = result["period"]
    stride = result["model"]["phase_period"]
    pads = ["prefix", "in_sequence"] if opts["padding"] == "both" else [opts["padding"]]
    ev = {"model": source.spec if source.kind == "hf" else str(opts["model"]), "task": opts["task"], "period": P,
          "stride": stride, "padding": pads, "per_residue": opts["per_residue"], "n_boot": opts["n_boot"],
          "seed": opts["seed"], "batch_size": opts["batch_size"], "dtype": opts["dtype"], "progress": opts["progress"],
          "experiment": opts["experiment"], "out": str(result["out"] / "evaluate")}
    for key in ("device", "tracking_uri", "max_length"):
        if opts[key] is not None:
            ev[key] = opts[key]
    if not opts["log"] and opts["tracking_uri"] is None:  # evaluate always logs: keep it out of the project's store
        ev["tracking_uri"] = f"sqlite:///{(result['out'] / 'evaluate' / 'mlflow.db').resolve()}"
    if source.kind == "phasefix":
        ev["which"] = opts["which"]
        ev.pop("max_length", None)
    summary = evaluate(ev)
    comparison, scalars, curves, figures = {}, {}, {}, {}
    print(f"\nprediction vs measurement ({opts['task']}, period {P}, phases mod {stride}; evaluate run "
          f"{summary.get('mlflow_run_id')})")
    print(f"{'padding':<12}{'mean':>7}{'worst':>7}{'pearson r':>11}{'r (phase)':>11}{'r (live)':>10}{'weak pred':>11}"
          f"{'weak meas':>11}  accuracy by phase")
    for pad in pads:
        acc = summary[pad]["per_residue"]
        acc = [float("nan") if a is None else a for a in acc]
        cmp = compare(result["model"], acc, stride)
        comparison[pad] = cmp
        print(f"{pad:<12}{summary[pad]['acc_mean']:>7.3f}{summary[pad]['acc_worst']:>7.3f}{cmp['pearson_r']:>11.3f}"
              f"{cmp['pearson_r_phase']:>11.3f}{cmp['pearson_r_live']:>10.3f}{cmp['predicted_weak_phase']:>11}"
              f"{cmp['measured_weak_phase']:>11}  "
              + " ".join(f"{x:.2f}" for x in cmp["acc_phase"]))
        for k in ("pearson_r", "pearson_r_phase", "pearson_r_live", "predicted_weak_phase", "measured_weak_phase",
                  "weak_phase_agrees"):
            scalars[f"audit/{pad}/{k}"] = cmp[k]
        if result.get("calibrated_model"):  # the same comparison for the measured E[a]
            cal = compare(result["calibrated_model"], acc, stride)
            cmp["calibrated"] = {k: cal[k] for k in ("pearson_r", "pearson_r_phase", "pearson_r_live",
                                                     "predicted_weak_phase", "weak_phase_agrees")}
            print(f"{'  E[a]':<26}{cal['pearson_r']:>11.3f}{cal['pearson_r_phase']:>11.3f}"
                  f"{cal['pearson_r_live']:>10.3f}{cal['predicted_weak_phase']:>11}")
            for k, v in cmp["calibrated"].items():
                scalars[f"audit/{pad}/calibrated/{k}"] = v
        curves[f"audit/{pad}/acc_residue"] = list(cmp["acc_residue"])
        curves[f"audit/{pad}/acc_phase"] = list(cmp["acc_phase"])
        rows = [(gb.name, s["mass_period"]) for gb, s in zip(result["biases"], result["stats"])]
        rows.append(("model", result["model"]["mass_period"]))
        fig = plots.audit_phase_heatmap(rows, P, measured=np.asarray(acc),
                                        title=f"{source.name} {opts['task']} ({pad}): predicted mass vs measured "
                                              f"accuracy, Pearson r = {cmp['pearson_r']:.2f}")
        fig.savefig(result["out"] / f"audit-{pad}.png", dpi=110, bbox_inches="tight", pad_inches=0.08)
        figures[f"audit-{pad}.png"] = fig
    result.update(comparison=comparison, evaluation=summary)
    _log(opts, "audit", result, scalars, curves, tags={"task": opts["task"],
                                                       "evaluate_run": str(summary.get("mlflow_run_id"))},
         figures=figures)
    if not opts["log"]:
        write_summary(result)
    return result


def write_summary(result: dict) -> None:
    from phasefix import tracking

    tracking.write_json(result["out"] / "audit.json", summary_json(result))


def main(tool: str, opts: dict) -> dict:
    """Entry point of `analyze gates model=...` and `analyze audit model=...` (`opts`: `analyze.tool_options`)."""
    opts = validate(opts)
    if opts["threads"] is not None:
        torch.set_num_threads(opts["threads"])
    if tool == "audit":
        return audit(opts)
    result = gates_audit(opts, "gates")
    _log(opts, "gates", result)
    if not opts["log"]:
        write_summary(result)
    return result


def wants_audit(cfg) -> bool:
    """`gates model=...` (not `run=`) and every `audit` go to this module."""
    return cfg.tool == "audit" or (cfg.tool == "gates" and cfg.model is not None)


__all__ = ["GateBias", "audit", "calibrate", "compare", "fold", "gates_audit", "hf_gate_biases",
           "hf_gate_means", "load_source", "main", "model_prediction", "pearson", "phase_stats",
           "phasefix_gate_biases", "predict", "read_compressor_tensors", "state_tensors", "validate", "wants_audit"]

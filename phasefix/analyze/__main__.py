"""`python -m phasefix.analyze TOOL run=<MLflow run id or unique prefix | run output dir | .ckpt> [key=value ...]`

Tools (science.md §5, docs/mechanism.md): knockout, gates, cycle, period, confusions; `gates model=<HF DeepSeek-V4 dir
| phasefix run>` and `audit model=...`: the phase audit from the weights (docs/deepseek_v4.md). A Hydra app
(conf/analyze.yaml over `phasefix.config.AnalyzeConfig`); `--help` lists every key.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping, Sequence

from omegaconf import DictConfig

from phasefix.analyze import load_run, parse_options, tool_options
from phasefix.config import ANALYZE_TOOLS
from phasefix.errors import check_choice


def analyze(args: Sequence[str] | Mapping | DictConfig) -> dict:
    """Run one tool (key=value words, the first may be the tool; a mapping; or the composed config); returns its
    results per padding. Raises ConfigError on bad input."""
    from phasefix.analyze import audit
    from phasefix.cli import options

    cfg = options(args, "analyze", "tool")
    check_choice("tool", cfg.tool, ANALYZE_TOOLS)
    if audit.wants_audit(cfg):  # the weights-only phase audit (its own keys)
        return audit.main(cfg.tool, tool_options(cfg, "audit"))
    opts = parse_options(cfg)
    if opts["threads"] is not None:
        import torch

        torch.set_num_threads(opts["threads"])
    module = importlib.import_module(f"phasefix.analyze.{cfg.tool}")
    ctx = load_run(opts["run"], opts["tracking_uri"], opts["which"])
    c = ctx.config
    print(f"phasefix analyze {cfg.tool}: {c.name} ({c.attention}, W{c.window}/S{c.stride}, {c.num_layers} layers, "
          f"{c.num_kv_heads} KV heads), eval period {ctx.period}, run {ctx.run_id or '(no MLflow run)'}")
    return module.run(ctx, opts)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m phasefix.analyze`: 0 done, 2 a bad option (one line), 130 interrupted (Ctrl-C)."""
    from phasefix import cli
    from phasefix.console import quiet

    def work(cfg: DictConfig) -> int:
        quiet(cfg.verbose)  # -v: the libraries' own output too
        analyze(cfg)  # each tool prints its results
        return 0

    return cli.run("analyze", argv, work, shim=lambda words: cli.overrides(words, "analyze", positional="tool"))


if __name__ == "__main__":
    sys.exit(main())

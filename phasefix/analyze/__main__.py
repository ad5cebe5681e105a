"""`python -m phasefix.analyze TOOL run=<MLflow run id or unique prefix | run output dir | .ckpt> [key=value ...]`

Tools (science.md §5, docs/mechanism.md): knockout, gates, cycle, period, confusions. Options (key=value):
(`gates model=<HF DeepSeek-V4 dir | phasefix run>` and `audit model=...`: the phase audit from the weights,
docs/deepseek_v4.md; `python -m phasefix.analyze audit --help` lists its options)
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from phasefix.analyze import OPTIONS, TOOLS, load_run, parse_options
from phasefix.errors import ConfigError


def usage() -> str:
    opts = "\n".join(f"  {k:<13} {h}" + ("" if d is None else f" (default: {d})") for k, (d, _, h) in OPTIONS.items())
    return (__doc__ or "") + opts + "\n"


def analyze(tool: str, args: Sequence[str]) -> dict:
    """Run one tool; returns its results per padding. Raises ConfigError on bad input."""
    from phasefix.analyze import audit

    if audit.wants_audit(tool, args):  # the weights-only phase audit (its own options)
        return audit.main(tool, list(args))
    if tool not in TOOLS:
        raise ConfigError(f"tool={tool!r} is invalid: allowed values are {', '.join(TOOLS)}")
    opts = parse_options(args)
    if opts["threads"] is not None:
        import torch

        torch.set_num_threads(opts["threads"])
    module = importlib.import_module(f"phasefix.analyze.{tool}")
    ctx = load_run(opts["run"], opts["tracking_uri"], opts["which"])
    c = ctx.config
    print(f"phasefix analyze {tool}: {c.name} ({c.attention}, W{c.window}/S{c.stride}, {c.num_layers} layers, "
          f"{c.num_kv_heads} KV heads), eval period {ctx.period}, run {ctx.run_id or '(no MLflow run)'}")
    return module.run(ctx, opts)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from phasefix.console import quiet, verbose_flag

    argv, verbose = verbose_flag(argv)  # -v: the libraries' own output too
    quiet(verbose)
    if len(argv) >= 2 and argv[0] == "audit" and argv[1] in ("-h", "--help"):
        from phasefix.analyze.audit import usage as audit_usage

        print(audit_usage())
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    try:
        analyze(argv[0], argv[1:])
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

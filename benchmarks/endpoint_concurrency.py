"""Prompts per second of `phasefix.evaluate endpoint=` at concurrency 8 vs 1 against a real `transformers serve`.

One run, one machine: a tiny random Qwen3 (tests/helpers.py `tiny_qwen3`) served on 127.0.0.1 by `transformers serve`
(its default generation, and with --continuous-batching), the kv_lookup prompts of `phasefix.data.text_prompts`
answered through `phasefix.endpoint.score_set` (the client `evaluate endpoint=` uses: greedy, the answer's token
count), alternating concurrency 1 and 8, `--repeats` times each after a warm-up. The ratio is of the medians.

    python benchmarks/endpoint_concurrency.py --prompts 48 --repeats 3 --markdown
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import tiny_qwen3, transformers_serve  # noqa: E402
from train_step_cpu import run_info  # noqa: E402

SERVERS = {"default": (), "continuous_batching": ("--continuous-batching",)}


def rate(url: str, model: str, prompts, tok, concurrency: int, workdir: Path) -> float:
    from phasefix.endpoint import Endpoint, score_set

    out = Path(tempfile.mkdtemp(dir=workdir))  # a fresh responses.jsonl: nothing resumed
    endpoint = Endpoint(url, model, concurrency=concurrency)
    t0 = time.perf_counter()
    score_set(endpoint, prompts, tok, "prefix", out, progress=False)
    return len(prompts) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=48, help="kv_lookup prompts per timing (a multiple of --period)")
    ap.add_argument("--period", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--servers", nargs="+", default=list(SERVERS), choices=list(SERVERS))
    ap.add_argument("--startup", type=float, default=900, help="seconds a server may take to start")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args()
    from transformers import AutoTokenizer

    from phasefix.data.text_prompts import TextPhaseSet

    work = Path(tempfile.mkdtemp(prefix="endpoint-bench-"))
    model_dir = tiny_qwen3(work / "tiny-qwen3", varied=True)
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = TextPhaseSet(tok, "kv_lookup", "prefix", period=a.period, per_residue=a.prompts // a.period)
    rows = []
    for server in a.servers:
        with transformers_serve(model_dir, *SERVERS[server], startup_s=a.startup) as (url, _):
            rate(url, str(model_dir), prompts, tok, 8, work)  # warm-up: the first requests load and trace
            times = {1: [], 8: []}
            for _ in range(a.repeats):
                for c in (1, 8):
                    times[c].append(rate(url, str(model_dir), prompts, tok, c, work))
        one, eight = statistics.median(times[1]), statistics.median(times[8])
        rows.append({"server": server, "prompts": len(prompts), "prompt_tokens": prompts.length,
                     "c1_prompts_per_s": round(one, 2), "c8_prompts_per_s": round(eight, 2),
                     "ratio": round(eight / one, 2), "c1_all": [round(x, 2) for x in times[1]],
                     "c8_all": [round(x, 2) for x in times[8]]})
        print(json.dumps(rows[-1]), flush=True)
    import transformers

    info = run_info(command="python " + " ".join(["benchmarks/endpoint_concurrency.py", *sys.argv[1:]]),
                    transformers=transformers.__version__)
    if a.markdown:
        print(f"\n`{info['command']}` (commit {info['commit']}, {info['time']}, machine {info['machine']}, "
              f"{info.get('cpu', '')}, transformers {info['transformers']})\n")
        print("| server | prompts x tokens | concurrency 1 (prompts/s) | concurrency 8 (prompts/s) | ratio 8/1 |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| transformers serve {r['server']} | {r['prompts']} x {r['prompt_tokens']} | "
                  f"{r['c1_prompts_per_s']} | {r['c8_prompts_per_s']} | {r['ratio']} |")
    if a.out:
        Path(a.out).write_text(json.dumps({"info": info, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""The harness side of `phasefix.lm_eval_tasks`: the prompts as documents, a request per document that generates as
many tokens as its answer has, and the per-residue metrics (-1 marks a document of another residue; the aggregation
leaves those out, as lm-eval's RULER tasks do per length)."""
from __future__ import annotations

from copy import deepcopy

from lm_eval.api.task import ConfigurableTask

MAX_PERIOD = 24
DEFAULTS = {"period": 24, "per_residue": 8, "padding": "prefix", "phase_of": "fact", "seed": 0}
TOKENIZER_KEYS = ("tokenizer", "pretrained", "model")


def _docs(task: str, **kwargs):
    import datasets
    from transformers import AutoTokenizer

    from phasefix.data.text_prompts import TEXT_DEFAULTS, TextPhaseSet
    from phasefix.endpoint import prompt_text
    from phasefix.errors import check

    name = next((kwargs[k] for k in TOKENIZER_KEYS if isinstance(kwargs.get(k), str) and kwargs[k]), None)
    check(name is not None, "tokenizer", name, "is required: --model_args pretrained=<model> or --metadata "
          "'{\"tokenizer\": ...}'")
    opts = {k: kwargs.get(k, v) for k, v in DEFAULTS.items()}
    check(opts["period"] <= MAX_PERIOD, "period", opts["period"], f"must be <= {MAX_PERIOD} (the metrics r00..r23)")
    check(opts["phase_of"] in ("fact", "end"), "phase_of", opts["phase_of"], "must be 'fact' or 'end' here")
    task_opts = {k: kwargs[k] for k in TEXT_DEFAULTS[task] if k in kwargs}
    tok = AutoTokenizer.from_pretrained(name)
    prompts = TextPhaseSet(tok, task, opts["padding"], period=opts["period"], per_residue=opts["per_residue"],
                           seed=opts["seed"], phase_of=opts["phase_of"], **task_opts)
    docs = []
    for i in range(len(prompts)):
        row = prompts.row(i)
        residue = row["end_residue"] if opts["phase_of"] == "end" else row["residue"]
        docs.append({"prompt": prompt_text(tok, row["input_ids"]), "answer": tok.decode(row["answer_ids"]),
                     "answer_tokens": int(row["answer_ids"].size), "residue": int(residue),
                     "cluster": int(row["cluster"]), "index": i})
    return {"test": datasets.Dataset.from_list(docs)}


def kv_lookup(**kwargs):
    return _docs("kv_lookup", **kwargs)


def needle(**kwargs):
    return _docs("needle", **kwargs)


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    from phasefix.endpoint import is_exact

    ok = float(is_exact(results[0], doc["answer"]))
    return {"exact_match": ok, **{f"r{r:02d}": ok if r == doc["residue"] else -1.0 for r in range(MAX_PERIOD)}}


def residue_mean(values: list[float]) -> float:
    kept = [v for v in values if v != -1.0]
    return sum(kept) / len(kept) if kept else -1.0


class PhaseTask(ConfigurableTask):
    """A generate_until task whose requests stop after the answer's token count (greedy: the harness's first
    `max_gen_toks` tokens are the ones phasefix.evaluate generates)."""

    def __init__(self, config: dict | None = None, **kwargs):
        super().__init__(config={k: v for k, v in (config or {}).items() if k != "class"}, **kwargs)

    def construct_requests(self, doc, ctx, **kwargs):
        requests = super().construct_requests(doc, ctx, **kwargs)
        for req in requests if isinstance(requests, list) else [requests]:
            context, gen = req.arguments[0], deepcopy(req.arguments[1])
            gen["max_gen_toks"] = doc["answer_tokens"]
            req.arguments = (context, gen, *req.arguments[2:])
        return requests

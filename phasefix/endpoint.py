"""Scoring the phase-controlled prompts by their greedy answers: through any OpenAI-compatible completions endpoint
(vLLM, SGLang, `transformers serve`, a hosted provider), or in process under the same rule.

The rule (``score=exact``) is what every server supports: greedy generation (temperature 0) of as many tokens as the
answer has, scored correct when the generated text equals the answer's text. The prompt goes to the server as text,
and its phases are placed on the served model's own tokenizer: before any request, every prompt's text must
tokenise back to exactly the ids it was built from (`prompt_text`), and the server's own count of prompt tokens
(``usage.prompt_tokens``) must equal that length, so a different tokenizer on the server is an error, not a shifted
phase.

Requests go through the `openai` client (its retries with backoff on 429 and 5xx, a timeout; our own retries for a
server that drops the connection), `concurrency` at a time. Every answer is appended to ``<out>/responses.jsonl`` as
it arrives, so a failed run keeps what was scored and the same command with the same ``out=`` resumes from it; a
request that fails for good stops the run with one line (exit 2) and is never scored as wrong. All of it happens
before the MLflow run exists: a failed audit leaves no half-written run.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import numpy as np

from phasefix.errors import ConfigError, check

RESPONSES = "responses.jsonl"
SCORES = ("top1", "exact")
CONNECTION_RETRIES = 2  # our own, after the client's: a server that restarts or drops connections under load


class EndpointError(ConfigError):
    """A request that failed for good, or a server that does not serve what was asked: one line, exit 2."""


def prompt_text(tokenizer, ids) -> str:
    """The text whose tokenisation, as a server does it (special tokens added), is exactly `ids`; ConfigError when
    there is none (the tokenizer merges pieces the prompt keeps apart)."""
    ids = [int(i) for i in ids]
    auto = list(tokenizer("")["input_ids"])  # what the tokenizer adds by itself (a BOS)
    body = ids[len(auto):] if auto and ids[:len(auto)] == auto else ids
    text = tokenizer.decode(body)
    back = list(tokenizer(text)["input_ids"])
    if back != ids:
        at = next((i for i, (a, b) in enumerate(zip(ids, back)) if a != b), min(len(ids), len(back)))
        raise ConfigError(f"tokenizer={getattr(tokenizer, 'name_or_path', '')!r} is invalid for an endpoint: a prompt's "
                          f"text does not tokenise back to its {len(ids)} tokens (they differ from token {at}, "
                          f"{tokenizer.decode(ids[at:at + 3])!r}), so its phases cannot be placed through a text prompt")
    return text


def is_exact(generated: str, answer: str) -> bool:
    """The exact-match rule: the generated text is the answer's text."""
    return generated == answer


class Endpoint:
    """One served model behind an OpenAI-compatible base URL (`openai.OpenAI`)."""

    def __init__(self, url: str, model: str, *, timeout: float = 120.0, retries: int = 5, concurrency: int = 8):
        from openai import OpenAI

        self.url, self.model, self.concurrency = url, model, concurrency
        self.client = OpenAI(base_url=url, api_key=os.environ.get("OPENAI_API_KEY") or "EMPTY", timeout=timeout,
                             max_retries=retries)

    def check(self, probe: str) -> None:
        """Before any work: the URL answers, serves `model`, and completes `probe` (ConfigError, one line,
        otherwise)."""
        import openai

        try:
            served = [m.id for m in self.client.models.list()]
        except openai.APIConnectionError as e:
            raise ConfigError(f"endpoint={self.url!r} is invalid: it does not answer ({_reason(e)})") from None
        except (openai.NotFoundError, openai.APIStatusError):
            served = None  # a server without /models: the first completion tells
        if served is not None and self.model not in served:
            raise ConfigError(f"model={self.model!r} is invalid: endpoint {self.url} serves "
                              f"{', '.join(map(repr, served)) or 'no model'}")
        self.complete(probe, 1)  # /completions itself, with this model

    def complete(self, prompt: str, max_tokens: int) -> tuple[str, int | None]:
        """The greedy completion's text and the server's count of prompt tokens (None if it does not say)."""
        import openai

        for attempt in range(CONNECTION_RETRIES + 1):
            try:
                r = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=max_tokens,
                                                   temperature=0)
                usage = getattr(r, "usage", None)
                return r.choices[0].text, getattr(usage, "prompt_tokens", None)
            except (openai.APIConnectionError, openai.APITimeoutError) as e:
                if attempt == CONNECTION_RETRIES:
                    raise EndpointError(f"endpoint={self.url!r}: a request failed after its retries "
                                        f"({_reason(e)})") from None
                time.sleep(2.0 * 2 ** attempt)
            except openai.APIStatusError as e:  # 4xx (the client retried 429 and 5xx already)
                raise EndpointError(f"endpoint={self.url!r}: model={self.model!r} answered {e.status_code} "
                                    f"({_reason(e)})") from None
        raise AssertionError("unreachable")


def _reason(e) -> str:
    body = getattr(e, "body", None)
    detail = body.get("detail") or body.get("message") if isinstance(body, dict) else None
    cause = e.__cause__ or e.__context__
    text = str(detail or (cause if cause is not None and not str(e).strip() else e) or type(e).__name__)
    return text.splitlines()[0][:200]


def _key(label: str, index: int, prompt: str) -> str:
    return f"{label}:{index}:{hashlib.sha1(prompt.encode()).hexdigest()[:16]}"


def score_set(endpoint: Endpoint, prompts, tokenizer, label: str, out: Path, *, progress: bool = True) -> dict:
    """Every prompt of a `TextPhaseSet` answered by the endpoint under the exact rule: {correct, residue, end_residue,
    cluster} arrays in set order and "answers" (the generated texts). Appends to <out>/responses.jsonl and reuses
    what it already holds (a resumed run)."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    from phasefix.predict import progress_bar

    path = Path(out) / RESPONSES
    rows = [prompts.row(i) for i in range(len(prompts))]
    texts = [prompt_text(tokenizer, row["input_ids"]) for row in rows]  # every prompt checked before a request
    answer = tokenizer.decode(rows[0]["answer_ids"]) if rows else ""
    max_tokens = int(rows[0]["answer_ids"].size) if rows else 1
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a crash
                continue
            done[rec["key"]] = rec
    keys = [_key(label, i, t) for i, t in enumerate(texts)]
    todo = [i for i, k in enumerate(keys) if k not in done]
    lock = threading.Lock()
    with open(path, "a") as f, ThreadPoolExecutor(endpoint.concurrency) as pool:
        if f.tell() and not path.read_bytes().endswith(b"\n"):
            f.write("\n")  # after a line cut short: ours start on a line of their own
        bar = progress_bar(None, len(rows), f"{prompts.task}/{label}", progress) if progress else None
        if bar is not None:
            bar.update(len(rows) - len(todo))
        pending = {pool.submit(endpoint.complete, texts[i], max_tokens): i for i in todo}
        try:
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    i = pending.pop(fut)
                    text, n_prompt = fut.result()
                    expected = rows[i]["input_ids"].size
                    if n_prompt is not None and n_prompt != expected:
                        raise EndpointError(f"tokenizer={getattr(tokenizer, 'name_or_path', '')!r} is not the served "
                                            f"model's: the server read a prompt of {expected} tokens as {n_prompt} "
                                            "(phases would be misplaced)")
                    rec = {"key": keys[i], "label": label, "index": i, "text": text, "prompt_tokens": n_prompt}
                    with lock:
                        f.write(json.dumps(rec) + "\n")
                        f.flush()
                    done[keys[i]] = rec
                    if bar is not None:
                        bar.update(1)
        except BaseException as e:
            for fut in pending:
                fut.cancel()
            pool.shutdown(wait=False, cancel_futures=True)
            kept = sum(k in done for k in keys)
            if isinstance(e, ConfigError):
                raise type(e)(f"{e}; {kept} of {len(rows)} {label} prompts were scored and are kept in {path}: the "
                              f"same command with out={Path(out)} resumes from them") from None
            raise
        finally:
            if bar is not None:
                bar.close()
    answers = [done[k]["text"] for k in keys]
    return {"correct": np.array([is_exact(a, answer) for a in answers]), "answers": answers,
            **{k: np.array([row[k] for row in rows], dtype=np.int64) for k in ("residue", "end_residue", "cluster")}}


def generate_set(model, prompts, tokenizer, *, batch_size: int = 8, progress: bool = False, desc: str = "") -> dict:
    """`score_set`'s rule in process: greedy generation (`generate`, do_sample=False) of the answer's token count at
    every prompt of a `TextPhaseSet`, decoded as a server decodes (special tokens skipped), matched exactly."""
    import torch

    from phasefix.predict import progress_bar

    device = next(model.parameters()).device
    correct, answers, cols = [], [], {k: [] for k in ("residue", "end_residue", "cluster")}
    total = -(-len(prompts) // batch_size)
    for batch in progress_bar(prompts.batches(batch_size), total, desc, progress):
        m = batch["answer_ids"].shape[1]
        answer = tokenizer.decode(batch["answer_ids"][0])
        texts = [None] * len(batch["query_pos"])
        for q in np.unique(batch["query_pos"]):  # prompts of one length together: no padding inside a prompt
            rows = np.flatnonzero(batch["query_pos"] == q)
            ids = torch.from_numpy(batch["input_ids"][rows, :q + 1]).to(device)
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=m,
                                     min_new_tokens=0, do_sample=False, pad_token_id=tokenizer.pad_token_id)
            for b, seq in zip(rows, out[:, q + 1:].cpu().tolist()):
                texts[b] = tokenizer.decode(seq, skip_special_tokens=True)
        answers += texts
        correct += [is_exact(t, answer) for t in texts]
        for k in cols:
            cols[k].append(batch[k])
    return {"correct": np.array(correct), "answers": answers,
            **{k: np.concatenate(v).astype(np.int64) for k, v in cols.items()}}


def check_options(opts: dict) -> None:
    """The endpoint keys, before anything is loaded."""
    import importlib.util

    url = opts.get("endpoint")
    check(importlib.util.find_spec("openai") is not None, "endpoint", url,
          "needs the openai package: pip install 'phasefix[audit]'")
    check(str(url).startswith(("http://", "https://")), "endpoint", url,
          "must be a base URL, http://HOST:PORT/v1 (an OpenAI-compatible server)")
    check(opts.get("model") not in (None, ""), "model", opts.get("model"),
          "is required with endpoint=: the served model's name (GET <endpoint>/models lists them)")
    check(opts["concurrency"] >= 1, "concurrency", opts["concurrency"], "must be an integer >= 1")
    check(opts["timeout"] > 0, "timeout", opts["timeout"], "must be > 0 seconds")
    check(opts["retries"] >= 0, "retries", opts["retries"], "must be an integer >= 0")
    check(opts["score"] in (None, "exact"), "score", opts["score"],
          "must be 'exact' with endpoint= (a completions endpoint returns text, not the model's top-1 over the "
          "vocabulary)")
    check(opts["task"] != "flip", "task", opts["task"], "needs log-probabilities of given completions, which "
          "completions endpoints do not return in general: use kv_lookup or needle with endpoint=")


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"tokenizer={name!r} is invalid: not a loadable tokenizer, a local directory or a Hugging "
                          f"Face name ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


__all__ = ["CONNECTION_RETRIES", "Endpoint", "EndpointError", "RESPONSES", "SCORES", "check_options",
           "generate_set", "is_exact", "load_tokenizer", "prompt_text", "score_set"]

"""What several test files share: the seconds-long fit overrides, the one-thread pin, the cache-dir swap, the
tiny byte-level tokenizer, synthetic phase results and committed report folders (the fixtures `one_thread` and
`cache_dir` are in conftest.py)."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

# Seconds-long fits: conf/trainer/fast.yaml (24 steps of 16 sequences, small sets).
FAST = ["trainer=fast"]
# The smallest fit that leaves a checkpoint, config.yaml and an MLflow run (W4/S4, 2 layers, 2 KV heads, a narrow
# model): what the analysis and audit tests read back.
TINY_FIT = ["trainer=fast", "trainer.max_steps=4", "trainer.val_every_n_steps=4", "trainer.checkpoint_every_n_steps=4",
            "trainer.num_threads=1", "data.num_train=64", "eval.paddings=[prefix]", "eval.per_residue=1",
            "eval.n_boot=10", "optim.warmup_steps=1", "trainer.log_every_n_steps=1", "model.hidden_size=64",
            "model.intermediate_size=128", "model.head_dim=16"]


@contextmanager
def threads(n: int = 1):
    """torch's intra-op threads set to n, restored after: tiny ops are as fast on one thread and do not stall when
    the machine's cores are busy."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def cache_dir(path: Path):
    """PHASEFIX_CACHE pointed at `path` (datasets built by a test stay in its temporary directory), restored after."""
    old = os.environ.get("PHASEFIX_CACHE")
    os.environ["PHASEFIX_CACHE"] = str(path)
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop("PHASEFIX_CACHE", None)
        else:
            os.environ["PHASEFIX_CACHE"] = old


def tiny_tokenizer(corpus: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on `corpus` (the prompt templates' words), as a transformers fast tokenizer
    with <|endoftext|> as end and padding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def tiny_qwen3(path: Path, *, vocab_size: int = 1000, varied: bool = False) -> Path:
    """A random 2-layer Qwen3 and a byte-level BPE tokenizer trained on the text prompts' words
    (`phasefix.data.text_prompts`), saved together at `path` (a Hugging Face model directory). `varied`: wider
    weights, untied, sharper attention (q/k norms x4) that writes more (v/o x3), so that its greedy answers differ from
    prompt to prompt (about 38 distinct among 64 kv_lookup prompts) rather than echo the last token."""
    import random

    from transformers import Qwen3Config, Qwen3ForCausalLM

    from phasefix.data.text_prompts import ANIMALS, COLOURS, FILLER, FLIP_PROMPT, HEADERS, NAMES

    rng = random.Random(0)
    corpus = list(HEADERS.values()) + [FLIP_PROMPT[0] + FLIP_PROMPT[1] + c for c in FLIP_PROMPT[2]] + [" ".join(FILLER)]
    for _ in range(3):
        for a in ANIMALS:
            corpus.append(f"{a}: {rng.choice(NAMES)}\n{rng.choice(COLOURS)} {a}: {rng.choice(NAMES)} "
                          f"{rng.choice(NAMES)}\n")
    fast = tiny_tokenizer(corpus, vocab_size=vocab_size)
    fast.save_pretrained(path)
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=4096,
                      tie_word_embeddings=not varied, initializer_range=0.3 if varied else 0.02)
    model = Qwen3ForCausalLM(cfg)
    if varied:
        with torch.no_grad():
            for layer in model.model.layers:
                a = layer.self_attn
                a.q_norm.weight.mul_(4)
                a.k_norm.weight.mul_(4)
                a.v_proj.weight.mul_(3)
                a.o_proj.weight.mul_(3)
    model.save_pretrained(path)
    return path


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def transformers_serve(model_dir: Path, *args: str, port: int | None = None, startup_s: float = 300.0):
    """A real `transformers serve` process (its OpenAI-compatible API, CPU) pinned to `model_dir`, on 127.0.0.1 and a
    free port; yields (base URL, the process), stops it after. Its log: <model_dir>.serve-<port>.log."""
    import subprocess
    import sys
    import time
    import urllib.request

    port = port or free_port()
    log = Path(f"{model_dir}.serve-{port}.log")
    exe = Path(sys.executable).parent / "transformers"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(exe), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
                                 "--device", "cpu", "--dtype", "float32", "--log-level", "warning", *args],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + startup_s
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"transformers serve did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1", proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


PERIOD = 24


def phase_result(seed: int, base: float, dip: float) -> dict:
    """PhaseAccuracy.compute() on synthetic outcomes: accuracy `base`, `dip` lower at residues 3 mod 4."""
    from phasefix.metrics import PhaseAccuracy

    rng = np.random.default_rng(seed)
    residue = np.repeat(np.arange(PERIOD), 40)
    p = np.where(residue % 4 == 3, base - dip, base)
    metric = PhaseAccuracy(PERIOD, fold_stride=4, n_boot=50)
    metric.update(torch.from_numpy(rng.random(residue.size) < p), torch.from_numpy(residue),
                  torch.from_numpy(np.tile(np.arange(40), PERIOD)))
    return metric.compute()


def committed_table(folder: Path, rows) -> Path:
    """A committed report folder holding only a decisive.csv (a table written before decisive_runs.csv): one row per
    (regime, arm, seeds learned, goal met, mean, worst) and padding."""
    import math

    from phasefix import decisive
    from phasefix.tables import write_csv

    folder.mkdir()
    full = [{"acc_mean_sd": math.nan, "acc_worst_sd": math.nan, "worst_excl_boundary": r[5], "acc_gap": r[4] - r[5],
             "period": 4.0, "train_seconds": 10.0, "compressor_flops_per_token": 33792.0,
             "cache_entries_per_token": 1.0, "lm_loss": math.nan, "lm_loss_change": math.nan,
             "regime": r[0], "arm": r[1], "padding": p, "seeds": 3, "learned": r[2], "acc_mean": r[4],
             "acc_worst": r[5], "goal_met": r[3], "run_ids": f"{r[1][:4]}0000"}
            for r in rows for p in ("in_sequence", "prefix")]
    write_csv(folder / "decisive.csv", full, decisive.COLUMNS)
    return folder


def save_fit_run(run_dir: Path, cfg) -> None:
    """A fit's output directory as `phasefix.fit` leaves one (config.yaml, checkpoints/last.ckpt) for the model `cfg`
    composes, untrained: what evaluate and re-scoring read back without a minute of training."""
    from omegaconf import OmegaConf

    from phasefix.module import PhaseFixModule

    module = PhaseFixModule(model=OmegaConf.to_container(cfg.model, resolve=True),
                            optim=OmegaConf.to_container(cfg.optim, resolve=True), max_steps=1,
                            paddings=("prefix",), period=24)
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    torch.save({"hyper_parameters": dict(module.hparams), "state_dict": module.state_dict()},
               run_dir / "checkpoints" / "last.ckpt")

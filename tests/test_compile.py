"""torch.compile on the CPU training path: the model traces as one graph (a graph break splits the step into pieces
that inductor compiles and guards one by one: that, not the model, is what made the compiled records64 step slower
than eager in issue 53), and a compiled step trains as the eager one does."""
from __future__ import annotations

import pytest
import torch

from phasefix.model.config import ModelConfig
from phasefix.model.qwen3 import CompressedQwen3

TINY = dict(vocab_size=32, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=64)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_model_traces_without_graph_breaks(autocast):
    """Two query blocks (T = 40, query_block 16: the block loop unrolls), per-head offsets, the sink, the tail."""
    torch.manual_seed(0)
    model = CompressedQwen3(ModelConfig(**TINY, window=8, stride=4, local_memory="tail", attention_sink=True,
                                        head_offsets="spread", query_block=16, attn_impl="blocked"))
    ids = torch.randint(0, 32, (2, 40))
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        ex = torch._dynamo.explain(model)(ids)
    assert ex.graph_break_count == 0, [b.reason.splitlines()[0] for b in ex.break_reasons]
    assert ex.graph_count == 1


@pytest.mark.slow
def test_fit_with_compile_records_it_and_keeps_the_checkpoint_layout(tmp_path):
    """trainer.compile=true: the run says it compiled and how long it took (summary, MLflow tag and metric), and its
    checkpoint holds the model's own weights (no wrapper's keys), loadable into an eager model."""
    from mlflow import MlflowClient

    from helpers import TINY_FIT
    from phasefix.cli import compose
    from phasefix.fit import fit
    from phasefix.fit_run import Run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    summary = fit(compose(TINY_FIT + ["trainer.compile=true", f"logger.tracking_uri={uri}",
                                      f"output_dir={tmp_path / 'run'}"]))
    assert summary["compile"]["used"] is True and summary["compile"]["seconds"] > 0
    c = MlflowClient(tracking_uri=uri)
    run = c.get_run(summary["mlflow_run_id"])
    assert run.data.tags["compile"] == "true" and run.data.params["trainer.compile"] == "True"
    assert run.data.metrics["compile_seconds"] == summary["compile"]["seconds"]
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert not [k for k in state if "_orig_mod" in k or "compiled" in k]
    module, _ = Run.open(str(tmp_path / "run")).load_module()  # strict load into an eager module
    assert {f"model.{k}" for k in module.model.state_dict()} <= set(state)


def test_compile_auto_compiles_a_cpu_run_only_when_it_is_long_enough():
    """trainer.compile=auto: eager under COMPILE_MIN_STEPS steps to train (the README's main job, a test), compiled
    from there on the CPU, eager on a GPU; true and false are taken as given. Hand-checked cases."""
    from phasefix.precision import COMPILE_MIN_STEPS, resolve_compile

    assert COMPILE_MIN_STEPS > 800  # the README's main job (800 steps) stays eager: a cold compile would not pay
    assert resolve_compile("auto", "cpu", 800)[0] is False
    assert resolve_compile("auto", "cpu", COMPILE_MIN_STEPS - 1)[0] is False
    assert resolve_compile("auto", "cpu", COMPILE_MIN_STEPS)[0] is True
    assert resolve_compile("auto", "cpu", 3000) == (True, f"auto: 3000 steps to train, at least the "
                                                          f"{COMPILE_MIN_STEPS} that pay for a compile")
    assert resolve_compile("auto", "gpu", 3000)[0] is False
    assert resolve_compile(True, "cpu", 4) == (True, "trainer.compile")
    assert resolve_compile(False, "cpu", 3000) == (False, "trainer.compile")


def test_the_compile_cache_lives_under_the_project_cache_unless_torch_is_told_otherwise(tmp_path, monkeypatch):
    """Unset, or torch's default (importing Lightning writes it into the environment): <PHASEFIX_CACHE>/inductor, where
    inductor then writes a compiled graph; a directory the user names: that one."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    from phasefix.precision import use_compile_cache

    monkeypatch.setenv("PHASEFIX_CACHE", str(tmp_path / "cache"))
    for torch_default in (None, default_cache_dir()):
        if torch_default is None:
            monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        else:
            monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", torch_default)
        assert use_compile_cache() == str(tmp_path / "cache" / "inductor")
        assert cache_dir() == str(tmp_path / "cache" / "inductor")
    torch._dynamo.reset()
    torch.compile(lambda x: (x * 2).sin(), dynamic=False)(torch.ones(3))
    assert list((tmp_path / "cache" / "inductor").rglob("*.py"))  # the graph's code landed in the project's cache
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert use_compile_cache() == str(tmp_path / "mine")


@pytest.mark.parametrize("value", ["sometimes", 2])
def test_a_bad_compile_value_names_the_key_and_the_allowed_values(value):
    from phasefix.cli import compose
    from phasefix.config import validate_trainer
    from phasefix.errors import ConfigError

    with pytest.raises(ConfigError, match=r"trainer\.compile.*true, false or auto"):
        validate_trainer(compose([f"trainer.compile={value}"]).trainer)

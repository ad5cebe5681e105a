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
    from phasefix.run import Run

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

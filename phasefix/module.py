"""Lightning wiring: the module that owns the model and its losses, and the data module for the retrieval task."""
from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Sampler

from phasefix.metrics import PhaseAccuracy
from phasefix.mitigations import configured_model
from phasefix.mitigations.base import loss_ramp
from phasefix.mitigations.gates import effective_slots, static_gate_distribution
from phasefix.model import CompressedQwen3
from phasefix.predict import query_predictions
from phasefix import tracking


class PhaseFixModule(L.LightningModule):
    """Trains a `CompressedQwen3` on next-token loss at the query positions, plus any mitigation terms.

    With a language-modelling mix (`text_label_start`: the first text token id) the retrieval queries and the text
    are averaged separately, `loss = retrieval + w(step) * text`, so the ~10x more text labels do not drown the
    15 queries of a sequence; w is 0 before `lm_start_step`, then rises linearly to `lm_weight` over
    `lm_ramp_steps` (measured: with the text loss on from step 0 the tiny model never leaves the retrieval plateau).

    Validation: one dataloader per padding mode of the phase-controlled protocol; accuracy of the prediction at
    `query_pos` grouped by residue (`val/<padding>/acc_mean`, `acc_worst`, `acc_gap`).
    """

    def __init__(self, model: Mapping, optim: Mapping, max_steps: int, mitigation: Mapping | None = None,
                 paddings: tuple[str, ...] = ("prefix",), period: int = 24, seed: int = 0,
                 text_label_start: int | None = None, lm_weight: float = 1.0, lm_start_step: int = 0,
                 lm_ramp_steps: int = 0, built: tuple | None = None):
        """`model`, `mitigation`: the run's config nodes, kept as hyper-parameters (a checkpoint rebuilds the module
        from them); `built`: (model config, mitigations) as `phasefix.fit.plan` built them from those nodes, used
        as they are (else built here by the same rule, `configured_model`)."""
        super().__init__()
        self.save_hyperparameters(logger=False, ignore=["built"])
        model_cfg, self.mitigations = built if built is not None else configured_model(model, mitigation)
        self.model_config = model_cfg
        self.model = CompressedQwen3(model_cfg)
        for m in self.mitigations:
            m.setup(self.model)
        self.needs_gates = any(m.needs_gates for m in self.mitigations)
        self.paddings = tuple(paddings)
        # n_boot=1: the bootstrap intervals are computed only at the end
        self.val_acc = torch.nn.ModuleList(PhaseAccuracy(period, fold_stride=model_cfg.phase_stride, n_boot=1)
                                           for _ in self.paddings)
        self.compile_training = False  # trainer.compile: see train_forward
        self._compiled = None

    def train_forward(self):
        """The model's forward as training steps call it: with `compile_training` (trainer.compile) through
        `torch.compile` (inductor, static shapes: each sequence length one graph, compiled on its first step), else
        eager.
        Validation and the final evaluation call the model eagerly, so their shapes cost no compile. A compiled
        bound method, made in the process that trains, not a wrapper module: the state_dict and checkpoints stay the
        model's own. Measured: docs/performance.md."""
        if not self.compile_training:
            return self.model
        if self._compiled is None:
            self._compiled = torch.compile(self.model.forward, dynamic=False)
        return self._compiled

    # ---- training ----
    def forward(self, input_ids, collect_gates: bool = False):
        return self.model(input_ids, collect_gates=collect_gates)

    def training_step(self, batch, batch_idx):
        input_ids, labels = batch["input_ids"], batch["labels"]
        if self.mitigations:
            gen = torch.Generator().manual_seed(int(self.hparams.seed) * 1_000_003 + int(self.global_step))
            for m in self.mitigations:
                input_ids, labels = m.transform_batch(input_ids, labels, gen)
            for m in self.mitigations:
                m.before_forward(int(self.global_step), gen)
        logits = self.train_forward()(input_ids, collect_gates=self.needs_gates)
        loss, parts = next_token_loss(logits, labels, self.hparams.text_label_start, self.text_weight())
        terms = {}
        if self.needs_gates:
            gates = self.model.gates()
            for m in self.mitigations:
                terms.update(m.loss(self.model, gates, step=int(self.global_step)))
        total = loss + sum(terms.values()) if terms else loss
        if not torch.isfinite(total):
            raise FloatingPointError(f"train/loss is {total.item()} at step {self.global_step}: stopping; the last "
                                     "good checkpoint is kept (lower optim.lr or trainer.gradient_clip_val)")
        mask = labels != -100
        if self.hparams.text_label_start is not None:  # accuracy of the retrieval queries only, not the text
            mask &= labels < self.hparams.text_label_start
        acc = (logits.argmax(-1)[mask] == labels[mask]).float().mean()
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/query_acc", acc, prog_bar=True)
        for name, value in parts.items():
            self.log(f"train/{name}", value)
        for name, value in terms.items():
            self.log(f"train/mitigation/{name}", value)
        return total

    def text_weight(self) -> float:
        hp = self.hparams
        return text_loss_weight(self.global_step, hp.lm_weight, hp.lm_start_step, hp.lm_ramp_steps)

    def configure_optimizers(self):
        o = self.hparams.optim
        decay = [p for n, p in self.named_parameters() if p.ndim >= 2 and p.requires_grad]
        no_decay = [p for n, p in self.named_parameters() if p.ndim < 2 and p.requires_grad]
        # fused: one kernel over every parameter instead of a loop of small ops per tensor (1 ms against 5-6 ms a step
        # on the CPU models here: benchmarks/fit_speed.py); the same update to float rounding (tests/test_golden_loss.py).
        # Not under a mixed precision: Lightning's mixed-precision plugin refuses to clip the gradients of an optimizer
        # that unscales them itself (a fused one), so bf16-mixed (`auto` on a bf16 CPU, the GPU) takes foreach.
        mixed = self._trainer is not None and "mixed" in str(self._trainer.precision)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=o["lr"], betas=tuple(o["betas"]),
                                **({"foreach": True} if mixed else {"fused": True}))
        warmup, total, floor = o["warmup_steps"], self.hparams.max_steps, o["min_lr_ratio"]

        def schedule(step):
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ---- validation: phase accuracy per padding ----
    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        if batch_idx == 0 and dataloader_idx == 0:
            self._gate_probe = batch["input_ids"][:64]
        correct = query_predictions(self.model, batch["input_ids"], batch["query_pos"]) == batch["answer"]
        self.val_acc[dataloader_idx].update(correct, batch["residue"], batch["cluster"])

    def on_validation_epoch_end(self):
        for padding, metric in zip(self.paddings, self.val_acc):
            res = metric.compute()
            for key in ("acc_mean", "acc_worst", "acc_gap"):
                self.log(tracking.phase_metric("val", padding, key), float(res[key]), sync_dist=False)
            metric.reset()
        if self.needs_gates and self.trainer.is_global_zero:
            self.log_gate_stats()

    @torch.no_grad()
    def log_gate_stats(self):
        """Static gate distribution per layer and KV head: effective number of slots exp(H)."""
        static = self.static_gates()
        for layer, branches in enumerate(static):
            for branch, p in branches.items():
                eff = effective_slots(p)
                for h in range(p.shape[0]):
                    # one chart group in the MLflow UI (it groups by the name up to the last /), not one per head
                    self.log(f"gates/eff_slots/L{layer}.{branch}.h{h}", float(eff[h]), rank_zero_only=True)

    @torch.no_grad()
    def static_gates(self, input_ids: torch.Tensor | None = None):
        if input_ids is None:
            input_ids = self._gate_probe
        self.model(input_ids.to(self.device), collect_gates=True)
        return static_gate_distribution(self.model.gates(), self.model_config)


def compile_seconds() -> float:
    """Wall seconds this process has spent in torch.compile: tracing and inductor for every graph, forward and the
    backward (compiled on the first backward)."""
    from torch._dynamo.utils import compilation_time_metrics as metrics

    return sum(metrics.get("_compile.compile_inner", [])) + sum(metrics.get("backward._backward_impl", []))


def text_loss_weight(step: int, lm_weight: float, start_step: int = 0, ramp_steps: int = 0) -> float:
    """0 before start_step, then lm_weight * (step - start_step + 1) / ramp_steps, capped at lm_weight."""
    return lm_weight * loss_ramp(step, start_step, ramp_steps)


def next_token_loss(logits, labels, text_label_start: int | None = None, lm_weight: float = 1.0):
    """(loss, its parts): the mean cross-entropy over labelled positions (-100: none); with text labels (ids >=
    text_label_start) the retrieval mean plus lm_weight times the text mean."""
    logits, labels = logits.flatten(0, 1).float(), labels.flatten()
    if text_label_start is None:
        return F.cross_entropy(logits, labels, ignore_index=-100), {}
    nll = F.cross_entropy(logits, labels, ignore_index=-100, reduction="none")  # one softmax over [B*T, V]
    is_text = labels >= text_label_start
    retrieval, text = nll[(labels != -100) & ~is_text].mean(), nll[is_text].mean()
    return retrieval + lm_weight * text, {"retrieval_loss": retrieval, "text_loss": text}


class StepBatchSampler(Sampler):
    """Batch indices as a pure function of (seed, step, rank): a resumed run sees exactly the batches an
    uninterrupted run would have seen from its step on. `stages` [(from_step, size), ...] splits the indices into
    consecutive sets (a ConcatDataset's; one set of n: [(0, n)]): each step draws from the last set whose from_step
    it has reached."""

    def __init__(self, stages: Sequence[tuple[int, int]], batch_size: int, seed: int, start_step, max_steps: int,
                 rank: int = 0):
        self.stages, self.batch_size, self.seed = list(stages), batch_size, seed
        self.start_step, self.max_steps, self.rank = start_step, max_steps, rank

    def _start(self) -> int:
        # read when iteration begins: Lightning restores the step counter after building the dataloader
        return self.start_step() if callable(self.start_step) else self.start_step

    def __len__(self):
        return max(0, self.max_steps - self._start())

    def _stage(self, step: int) -> tuple[int, int]:
        """(first index, size) of the set this step draws from."""
        offset, current = 0, (0, 0)
        for from_step, size in self.stages:
            if from_step > step:
                break
            current, offset = (offset, size), offset + size
        return current

    def __iter__(self):
        for step in range(self._start(), self.max_steps):
            first, size = self._stage(step)
            rng = np.random.default_rng([self.seed, step, self.rank])
            yield (first + rng.choice(size, size=min(self.batch_size, size), replace=False)).tolist()


class RetrievalDataModule(L.LightningDataModule):
    """Training stream of the controlled retrieval task and the phase-controlled validation prompts. `train_stages`
    [(from_step, dataset), ...]: the sets training draws from, each from its step on (data.in_sequence_from_step)."""

    def __init__(self, train_stages: Sequence[tuple[int, Dataset]], val_sets: Mapping, batch_size: int,
                 eval_batch_size: int, seed: int, max_steps: int):
        super().__init__()
        self.train_stages, self.val_sets = list(train_stages), dict(val_sets)
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.seed, self.max_steps = seed, max_steps

    def train_dataloader(self):
        trainer = self.trainer
        start = (lambda: trainer.global_step) if trainer is not None else 0
        rank = trainer.global_rank if trainer is not None else 0
        sampler = StepBatchSampler([(from_step, len(ds)) for from_step, ds in self.train_stages], self.batch_size,
                                   self.seed, start, self.max_steps, rank)
        sets = [ds for _, ds in self.train_stages]
        # one set is passed as is: a datasets.Dataset fetches a whole batch at once, a ConcatDataset row by row
        return DataLoader(sets[0] if len(sets) == 1 else ConcatDataset(sets), batch_sampler=sampler, num_workers=0)

    def val_dataloader(self):
        return [DataLoader(ds, batch_size=self.eval_batch_size, shuffle=False) for ds in self.val_sets.values()]


class TrainClock(Callback):
    """Seconds spent training, saved in every checkpoint (`before` + this piece), so that the train time of a run
    resumed in pieces adds up."""

    def __init__(self, before: float = 0.0):
        self.before, self.t0 = float(before), None

    def on_train_start(self, trainer, pl_module):
        self.t0 = time.time()

    @property
    def seconds(self) -> float:
        return self.before + (time.time() - self.t0 if self.t0 is not None else 0.0)

    def state_dict(self):
        return {"seconds": self.seconds}

    def load_state_dict(self, state_dict):
        pass  # `before` comes from the checkpoint already (fit reads it before training)


class RunLogger(MLFlowLogger):
    """Lightning's MLflow logger without the `epoch` value Lightning adds to every logging call (one epoch per run
    here; logged at each step where training and validation both log, it only duplicates points), and without a
    second write of a metric at a step it already has (`PeriodicCheckpoint` writes a step's points early)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._written: tuple[int | None, set] = (None, set())

    def log_metrics(self, metrics, step=None):
        metrics = {k: v for k, v in metrics.items() if k != "epoch"}
        if step is not None:
            if step != self._written[0]:
                self._written = (step, set())
            metrics = {k: v for k, v in metrics.items() if k not in self._written[1]}
            self._written[1].update(metrics)
        if metrics:
            with tracking.interrupts_deferred():
                super().log_metrics(metrics, step)


class PeriodicCheckpoint(ModelCheckpoint):
    """Lightning's step-interval checkpoint, written after the step's training metrics reach the logger. Lightning
    saves it in `on_train_batch_end` and logs that batch's metrics only afterwards, so a kill -9 between the two
    lost the points of the batch before the checkpoint (a resume logs again only from the checkpoint's step on)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        n = self._every_n_train_steps
        if n and trainer.global_step % n == 0:
            # Lightning has no public flush; it logs the same step again after this hook (RunLogger drops it)
            trainer._logger_connector.update_train_step_metrics()
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


class LastCheckpoint(OnExceptionCheckpoint):
    """`last.ckpt` where training stops: at max_steps (so that raising trainer.max_steps continues from the final
    state) and at an interrupt (Ctrl-C, SIGTERM; Lightning's OnExceptionCheckpoint), so the run continues from the
    interrupted step. After a crash (e.g. a non-finite loss) the last good periodic checkpoint stays `last`."""

    def on_train_end(self, trainer, pl_module):
        trainer.save_checkpoint(self.ckpt_path)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        # Lightning restores its loop counters right only from checkpoints written at a batch's end or the run's end;
        # from an interrupt anywhere else the step it logs at (`_batches_that_stepped`) came back one off the global
        # step (a resumed run skipped a step or, once in the Ctrl-C test, logged one twice; every later point one
        # step off) and so did the batch index that schedules validation. One optimizer step per batch here: all
        # three are the same number.
        loop = trainer.fit_loop.epoch_loop
        loop._batches_that_stepped = trainer.global_step
        loop.batch_progress.total.ready = trainer.global_step + 1  # this batch is ready, not yet started

    def on_exception(self, trainer, pl_module, exception):
        if isinstance(exception, (KeyboardInterrupt, SIGTERMException)):
            progress = trainer.fit_loop.epoch_loop.batch_progress.total
            if progress.processed == progress.completed + 1:  # in the step's end hooks: its update is done, its
                trainer._logger_connector.update_train_step_metrics()  # training metrics not yet logged
            super().on_exception(trainer, pl_module, exception)

    def teardown(self, trainer, pl_module, stage):
        pass  # OnExceptionCheckpoint deletes its file at teardown; this one is the run's last.ckpt and stays

"""What phasefix prints while it works: one progress bar for training and one for evaluation, and nothing the user
did not ask for (library banners, database-migration lines, dataset-cache bars, deprecation warnings) unless
`verbose` (`-v` or `verbose=true` on the command line)."""
from __future__ import annotations

import logging
import os
import sys
import warnings

from lightning.pytorch.callbacks import Callback

NOISY_LOGGERS = ("mlflow", "alembic", "lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning",
                 "datasets", "torch.distributed")


def quiet(verbose: bool = False) -> None:
    """Silence the libraries' own chatter (their warnings and errors still show); `verbose` keeps all of it."""
    if verbose:
        return
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"  # the "Downloading artifacts" bars
    import lightning.pytorch  # noqa: F401  (it sets its own loggers to INFO on import)

    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*LeafSpec.*")
    for msg in (r".*does not have many workers.*", r".*Checkpoint directory .* exists and is not empty.*",
                r".*Total length of .* across ranks is zero.*", r".*smaller than the logging interval.*",
                r".*your dataloader is not resumable.*",  # StepBatchSampler is: batches are a function of the step
                # ckpt_path=None with an OnExceptionCheckpoint: Lightning looks for a "last" one (fit refuses an
                # output_dir that holds checkpoints, so a new run finds none)
                r".*was called without a model.*", r".*is set, but there is no last checkpoint available.*",
                # a fork saves its checkpoints under its own output_dir by design; only the best path carries over
                r".*The dirpath has changed from.*"):
        warnings.filterwarnings("ignore", message=msg)
    try:
        import datasets

        datasets.disable_progress_bars()  # "Saving the dataset" when the cache is built
    except ImportError:
        pass


class TrainProgress(Callback):
    """One bar: steps out of max_steps, the training loss and the last validation mean / worst residue."""

    def __init__(self, padding: str = "prefix"):
        self.padding, self.bar, self.val = padding, None, ""

    def on_train_start(self, trainer, pl_module):
        if not trainer.is_global_zero:
            return
        from tqdm.auto import tqdm

        self.bar = tqdm(total=trainer.max_steps, initial=trainer.global_step, desc="train", unit="step",
                        file=sys.stderr, dynamic_ncols=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.bar is None:
            return
        self.bar.n = trainer.global_step
        loss = trainer.callback_metrics.get("train/loss")
        post = f"loss {float(loss):.3f}" if loss is not None else ""
        self.bar.set_postfix_str(post + self.val, refresh=False)
        self.bar.refresh()

    def on_validation_end(self, trainer, pl_module):
        m = trainer.callback_metrics
        from phasefix.tracking import phase_metric

        mean, worst = (m.get(phase_metric("val", self.padding, k)) for k in ("acc_mean", "acc_worst"))
        if mean is not None and worst is not None:
            self.val = f", val {self.padding} mean {float(mean):.2f} worst {float(worst):.2f}"

    def on_train_end(self, trainer, pl_module):
        self.close()

    def on_exception(self, trainer, pl_module, exception):
        self.close()

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None

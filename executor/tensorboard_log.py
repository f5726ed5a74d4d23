"""TensorBoard event files for `smplan execute --tensorboard` (rank 0 writes them).

metrics.jsonl stays the source of truth; these files are a view of the same records for
people who already watch their runs in TensorBoard: `tensorboard --logdir RUN_DIR/tensorboard`.
"""

from __future__ import annotations

from pathlib import Path

INSTALL_HINT = "--tensorboard needs the tensorboard package: pip install 'smplan[monitor]'"
MEASURED_TAG = "step_time_s/measured"
PREDICTED_TAG = "step_time_s/predicted"
BLOCK_NORMS_TAG = "grad_norm/blocks"
SCALARS = ("loss", "grad_norm", "tokens_per_s", "peak_memory_gib")
OPTIONAL_SCALARS = ("lr", "val_loss")  # lr on every step; val_loss on --eval-every steps


class TensorBoardMissingError(ValueError):
    """--tensorboard without the tensorboard package."""


def require_tensorboard() -> None:
    """Fail before any worker starts (not in every rank after the model is built)."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise TensorBoardMissingError(INSTALL_HINT) from None


class TensorBoardLog:
    def __init__(self, log_dir: str | Path, predicted_step_time_s: float | None, resume_step: int = 0):
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        # purge_step hides the steps a resumed run trains again from the earlier attempt.
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=resume_step + 1 if resume_step else None,
                                    flush_secs=10)
        self.predicted_step_time_s = predicted_step_time_s
        # Measured and predicted step time as two lines of one chart (the custom-scalars tab).
        self.writer.add_custom_scalars({"smplan": {"step time vs plan (s)": [
            "Multiline", [MEASURED_TAG, PREDICTED_TAG]]}})

    def write(self, record: dict) -> None:
        step = record["step"]
        for key in SCALARS:
            self.writer.add_scalar(key, record[key], step)
        for key in OPTIONAL_SCALARS:
            if key in record:
                self.writer.add_scalar(key, record[key], step)
        self.writer.add_scalar(MEASURED_TAG, record["step_time_s"], step)
        if self.predicted_step_time_s:
            self.writer.add_scalar(PREDICTED_TAG, self.predicted_step_time_s, step)
        for phase, seconds in (record.get("phases_s") or {}).items():
            self.writer.add_scalar(f"phases_s/{phase}", seconds, step)
        norms = record.get("block_grad_norms")
        if norms:
            import numpy as np

            self.writer.add_histogram(BLOCK_NORMS_TAG, np.asarray(norms, dtype=np.float64), step)

    def close(self) -> None:
        self.writer.close()

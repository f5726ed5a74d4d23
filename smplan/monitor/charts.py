"""Charts of one run: loss (and validation loss) and grad norm, the learning rate, step time
vs the plan, memory per rank, and the gradient-norm heatmap (blocks x steps). Same look as the what-if report (its style module).

Each takes a RunData and returns a matplotlib Figure, or None when the run has no data for
it (no per-rank records, no block gradient norms).
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.ticker import EngFormatter, FuncFormatter, MaxNLocator

from smplan.report.style import color, finish, label_log_axis, new_figure, save_figure

from .rundir import RunData
from .status import own_time_matrix


def loss_chart(run: RunData, path=None):
    fig, (ax_loss, ax_norm) = new_figure("Loss and gradient norm", ncols=2, width=12, height=4.5)
    steps = [r["step"] for r in run.records]
    ax_loss.plot(steps, [r["loss"] for r in run.records], marker=".", color=color("", 0), label="training",
                 gid="loss")
    evals = [(r["step"], r["val_loss"]) for r in run.records if r.get("val_loss") is not None]
    if evals:  # --eval-every steps, on the same axis: the gap between them is what to watch
        ax_loss.plot([s for s, _ in evals], [v for _, v in evals], marker="s", color=color("", 2),
                     label="validation", gid="val_loss")
        ax_loss.legend(fontsize=8)
    ax_loss.set_title("loss" if evals else "training loss")
    ax_norm.plot(steps, [r["grad_norm"] for r in run.records], marker=".", color=color("", 1), gid="grad_norm")
    ax_norm.set_title("global gradient norm (before clipping)")
    for ax in (ax_loss, ax_norm):
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return finish(fig, path)


def lr_chart(run: RunData, path=None):
    """The learning rate of every step (warmup, schedule, resumes), or None when not recorded."""
    points = [(r["step"], r["lr"]) for r in run.records if r.get("lr") is not None]
    if not points:
        return None
    schedule = (run.config or {}).get("lr_schedule")
    fig, ax = new_figure("Learning rate" + (f" ({schedule})" if schedule else ""), width=8, height=3.5)
    ax.plot([s for s, _ in points], [v for _, v in points], color=color("", 3), gid="lr")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("lr")
    ax.set_ylim(bottom=0)
    return finish(fig, path)


def step_time_chart(run: RunData, path=None):
    """Measured step time per step, each rank's own time, and the plan's prediction."""
    predicted = run.predicted.get("step_time_s")
    fig, ax = new_figure("Step time: measured vs predicted" if predicted else "Step time (the plan predicts none)",
                         width=11, height=5)
    steps = [r["step"] for r in run.records]
    ax.plot(steps, [r["step_time_s"] for r in run.records], marker="o", color="black", label="measured step (rank 0)",
            gid="measured")
    own_steps, order, rows = own_time_matrix(run.ranks)
    for col, rank in enumerate(order):
        ax.plot(own_steps, [row[col] for row in rows], linewidth=1, alpha=0.7, color=color("", col + 1),
                label=f"rank {rank} own time", gid=f"own_rank_{rank}")
    if predicted:
        ax.axhline(predicted, color="#777777", linestyle="--", linewidth=1.5, label="predicted",
                   gid="predicted")
    ax.yaxis.set_major_formatter(EngFormatter(unit="s"))
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("time per optimizer step")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, title="own time: the ranks' median step less the rank's wait at its end", title_fontsize=8)
    return finish(fig, path)


def memory_chart(run: RunData, path=None):
    """Peak memory of each rank against the plan's predicted peak."""
    if not run.ranks:
        return None
    order = sorted(run.ranks)
    peaks = [max(r["peak_memory_gib"] for r in run.ranks[rank]) for rank in order]
    source = run.ranks[order[0]][-1].get("peak_memory_source", "rss")
    what = "process RSS on CPU" if source == "rss" else "CUDA allocator peak"
    fig, ax = new_figure(f"Peak memory per rank ({what})", width=max(6, 0.6 * len(order) + 4), height=4.5)
    ax.bar([str(r) for r in order], peaks, color=color("weights"), gid="peak")
    predicted = run.predicted_allocated_gib if source == "cuda_allocator" else None  # RSS: not comparable
    if predicted:
        ax.axhline(predicted, color="black", linestyle="--", linewidth=1.5, label="predicted peak (allocated)",
                   gid="predicted")
        ax.legend(fontsize=8)
    ax.set_xlabel("rank")
    ax.set_ylabel("GiB")
    return finish(fig, path)


MAX_STEP_TICKS = 12  # past this many recorded steps their labels would run into each other


def grad_norm_heatmap(run: RunData, path=None):
    """Gradient norm of every block (rows) at every recorded step (columns, at their steps), log colour."""
    recs = [r for r in run.records if r.get("block_grad_norms")]
    if not recs:
        return None
    grid = np.array([r["block_grad_norms"] for r in recs], dtype=float).T  # blocks x steps
    fig, ax = new_figure("Gradient norm per block", width=max(7, 0.35 * len(recs) + 4),
                         height=max(3.5, 0.25 * grid.shape[0] + 2))
    positive = grid[grid > 0]
    norm = LogNorm(vmin=positive.min(), vmax=positive.max()) if positive.size and positive.min() < positive.max() else None
    steps = [r["step"] for r in recs]
    image = ax.pcolormesh(step_edges(steps), np.arange(grid.shape[0] + 1) - 0.5, np.where(grid > 0, grid, np.nan),
                          cmap="viridis", norm=norm, gid="heatmap")
    if len(steps) <= MAX_STEP_TICKS:  # each recorded step named under its column
        ax.set_xticks(steps, [str(s) for s in steps])
        ax.set_xlabel("step (the recorded ones)")
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("block (first at the bottom)")
    bar = fig.colorbar(image, ax=ax, label="gradient 2-norm")
    if norm is not None:
        label_log_axis(bar.ax.yaxis, FuncFormatter(lambda v, _: f"{v:.3g}"))
    finish(fig, None)
    ax.grid(False)
    if path is not None:
        save_figure(fig, path)
    return fig


def step_edges(steps: list[int]) -> np.ndarray:
    """Column edges for records at `steps`: half-way to each neighbour, and half a step past the first
    and last (a record every K steps is a column K wide at its step, not one as wide as step 1's)."""
    at = np.asarray(steps, dtype=float)
    middles = (at[1:] + at[:-1]) / 2.0
    return np.concatenate([[at[0] - 0.5], middles, [at[-1] + 0.5]])


CHARTS = {"loss": loss_chart, "lr": lr_chart, "step_time": step_time_chart, "memory": memory_chart,
          "grad_norms": grad_norm_heatmap}

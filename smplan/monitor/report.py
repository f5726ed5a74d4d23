"""`smplan report RUN_DIR -o out.html`: one self-contained page (charts inlined as PNG).

The page reuses the what-if report's CSS and chart style so the two look alike; unlike
that report it has no files beside it, so it can be mailed or attached to an issue.
"""

from __future__ import annotations

import base64
import io
import os
from html import escape
from pathlib import Path

from smplan.executor.metrics import METRICS_FILE, RUN_CONFIG_FILE, RUN_ENTRIES
from smplan.executor.run_lock import LOCK_FILE
from smplan.report.html import CSS

from .rundir import RunData, RunDirError, no_step_line
from .status import Thresholds, describe_lr, run_status

TITLES = {"loss": "Loss and gradient norm", "lr": "Learning rate", "step_time": "Step time",
          "memory": "Memory per rank", "grad_norms": "Gradient norm per block"}
CAPTIONS = {
    "loss": "Training loss and the global gradient norm (before clipping) at every step; the validation "
            "loss (--val-data) at the --eval-every steps.",
    "lr": "The learning rate each step ran at: warmup, then the --lr-schedule.",
    "step_time": "Wall-clock time of each optimizer step (rank 0's), each rank's own time (the ranks' median "
                 "step less its wait for the slowest rank at the step-end synchronisation), and the plan's prediction.",
    "memory": "Peak memory of every rank. On a GPU the dashed line is the plan's predicted peak (what the "
              "allocator hands out); on CPU the bars are process RSS, which includes the interpreter and "
              "libraries and is not held against the plan.",
    "grad_norms": "Gradient 2-norm of every repeated block at the steps it was recorded "
                  "(--grad-norms-every), on a log colour scale: vanishing or exploding layers stand out.",
}


class ReportPathError(ValueError):
    """-o names a folder, or a file in a folder that does not exist."""


def _png_data_uri(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def headline(run: RunData, status: dict) -> str:
    """What the run was and how it went, in one sentence: model, layout, steps, where it ran, and
    its measured step time against the plan's prediction (the page's title already names the folder)."""
    config, plan = run.config or {}, run.plan
    model = config.get("model_ref") or plan.get("model")
    summary = run.summary or {}
    where = f" on {summary['device']}" if summary.get("device") else ""
    where += f" in {summary['compute_dtype']}" if summary.get("compute_dtype") else ""
    st = status["step_time_s"]
    if st["predicted"]:
        against = f"{st['ratio']:.2f}x the predicted {st['predicted'] * 1e3:,.1f} ms"
    else:
        against = "the plan predicts none (a plan file from `smplan plan` does)"
    total = status["steps_total"]
    state = "" if status["finished"] else " (stopped)" if status["stopped"] else " so far"
    return (f"{short_model(model) if model else '(model not recorded)'}, {layout_label(plan)}: {status['steps_done']} of "
            f"{total or '?'} steps{state}{where}; measured {st['median'] * 1e3:,.1f} ms a step, {against}.")


def short_model(ref: str) -> str:
    """A model reference as a headline names it: its file and builder, not the folders ("gpt.py:tiny")."""
    prefix = "hf:" if ref.startswith("hf:") else ""
    return prefix + Path(ref[len(prefix):].rstrip("/")).name


def layout_label(plan: dict) -> str:
    """"dp=2 tp=1 pp=1 mbs=1 gbs=2", with cp, ep and zero where they are used ("no plan recorded" without one)."""
    shown = [("dp", "dp", 0), ("tp", "tp", 0), ("pp", "pp", 0), ("cp", "cp", 1), ("ep", "ep", 1),
             ("micro_batch", "mbs", 0), ("global_batch", "gbs", 0), ("zero", "zero", 0)]  # (key, name, shown above)
    parts = [f"{name}={plan[key]}" for key, name, above in shown if key in plan and plan[key] > above]
    return " ".join(parts) or "no plan recorded"


def render_run_html(run: RunData, thresholds: Thresholds | None = None) -> str:
    from .charts import CHARTS  # matplotlib: imported when a page is drawn, not by `smplan execute`

    status = run_status(run, thresholds)
    figures = {name: make(run) for name, make in CHARTS.items()}
    st = status["step_time_s"]
    stopped = status["stopped"]
    state = ("" if status["finished"] else f" (stopped: {stopped.get('detail') or stopped['reason']})" if stopped
             else " (not finished)")
    facts = [
        ("steps", f"{status['steps_done']} of {status['steps_total'] or '?'}{state}"),
        ("median step time", f"{st['median'] * 1e3:,.1f} ms" + (
            f" (predicted {st['predicted'] * 1e3:,.1f} ms, ratio {st['ratio']:.2f})" if st["predicted"] else "")),
        (f"median {status['throughput']['unit']}", f"{status['throughput']['median']:,.0f}"),
        ("loss", f"{status['loss']['first']:.4f} → {status['loss']['last']:.4f}"),
    ]
    val, lr = status["val_loss"], status["lr"]
    if val:
        facts.append(("validation loss", f"{val['first']:.4f} (step {val['first_step']}) → {val['last']:.4f} "
                                         f"(step {val['last_step']}); best {val['best']:.4f} at step {val['best_step']}"))
    if lr:
        facts.append(("learning rate", f"{describe_lr(lr)}; last {lr['last']:.3g}"))
    plan = run.plan
    if plan:
        facts.insert(0, ("plan", " ".join(f"{k}={plan[k]}" for k in ("dp", "tp", "pp", "micro_batch",
                                                                      "global_batch", "zero") if k in plan)))
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{PAGE_TITLE}{escape(run.run_dir.name)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>Run {escape(run.run_dir.name)}</h1>",
        f'<p class="question">{escape(headline(run, status))}</p>',
        '<div class="recommend"><dl>' + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in facts)
        + "</dl></div>",
    ]
    if status["warnings"]:
        parts.append("<h2>Warnings</h2><ul>" + "".join(f"<li>{escape(w)}</li>" for w in status["warnings"]) + "</ul>")
    parts.append("<h2>Charts</h2>")
    for name, fig in figures.items():
        if fig is None:
            continue
        caption = CAPTIONS[name]
        if name == "step_time" and not st["predicted"]:
            caption = caption.replace(", and the plan's prediction", "") + (
                " The plan carries no prediction (an inline plan): a plan file from `smplan plan` has one.")
        parts.append(f'<figure id="chart-{name}"><img src="{_png_data_uri(fig)}" alt="{escape(TITLES[name])} chart">'
                     f"<figcaption><b>{escape(TITLES[name])}.</b> {escape(caption)}</figcaption></figure>")
    parts.append("<p>Every number behind these charts: <code>metrics.jsonl</code> and <code>ranks/</code> "
                 "in the run directory.</p></body></html>")
    return "\n".join(parts) + "\n"


def _run_entry_owner(out: Path) -> tuple[Path, str] | None:
    """(the run directory; its entry) when `out` is, or lies in, an entry a run writes
    (metrics.jsonl, ranks/, checkpoints/, ...) of a run directory; else None. Checked where `out`
    really points too (resolve(): symbolic links followed, ".." collapsed)."""
    paths = [Path(os.path.normpath(out.absolute()))]
    try:
        paths.append(out.resolve())
    except (RuntimeError, OSError):  # a loop of links: nothing it names can be a run's file
        pass
    for path in paths:
        for folder in path.parents:
            if not any((folder / marker).is_file() for marker in (RUN_CONFIG_FILE, METRICS_FILE)):
                continue
            entry = path.relative_to(folder).parts[0]
            if entry in (*RUN_ENTRIES, LOCK_FILE):
                return folder, entry
    return None


PAGE_TITLE = "smplan run report: "  # how `is_run_report` knows a page this module wrote


def is_run_report(path: str | Path) -> bool:
    """Whether the file at `path` is a page `write_run_report` wrote (which a later call may
    rewrite), not one of the user's."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return False
    return f"<title>{PAGE_TITLE}" in head


def report_path_problem(out: str | Path) -> str | None:
    """Why the run page cannot be written to `out` (even with --force), or None."""
    out = Path(out)
    if out.is_dir():
        return f"{out} is a folder; pass a file name such as {out / 'report.html'}"
    owned = _run_entry_owner(out)
    if owned is not None:  # the run's records and checkpoints are not the page's to replace
        folder, entry = owned
        if not out.is_absolute():  # named as the user named -o: relative to here
            folder = Path(os.path.relpath(folder))
        return f"{out} is part of the run in {folder} (it writes {entry} there); choose another -o, such as " \
               f"{folder / 'report.html'}"
    if not out.parent.exists():
        return f"the folder of {out} does not exist; create it or choose another -o"
    return None


def write_run_report(run: RunData, out: str | Path, thresholds: Thresholds | None = None) -> Path:
    if not run.records:  # stopped before its first step: no figure to draw (said before any word on -o)
        raise RunDirError(no_step_line(run))
    out = Path(out)
    problem = report_path_problem(out)
    if problem:
        raise ReportPathError(problem)
    out.write_text(render_run_html(run, thresholds))
    return out

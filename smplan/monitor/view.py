"""The terminal view of a run status (see `smplan.monitor.status` for the fields)."""

from __future__ import annotations

from .status import describe_lr


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:,.1f} ms"


def _bar(fraction: float | None, width: int = 30) -> str:
    if fraction is None:
        return ""
    fill = round(width * min(1.0, max(0.0, fraction)))
    return f"[{'#' * fill}{'.' * (width - fill)}] {fraction:.0%}"


MAX_RANK_ROWS = 16


def _memory_by_rank(peaks: dict) -> str:
    if "max" in peaks:  # a run without per-rank records
        return f"max over ranks {peaks['max']:.2f}"
    if len(peaks) <= 8:
        return "  ".join(f"rank {r} {g:.2f}" for r, g in sorted(peaks.items()))
    low, high = min(peaks, key=peaks.get), max(peaks, key=peaks.get)
    median = sorted(peaks.values())[len(peaks) // 2]
    return f"min {peaks[low]:.2f} (rank {low})  median {median:.2f}  max {peaks[high]:.2f} (rank {high})"


def step_columns(row: dict) -> tuple[str, str, str]:
    """(step, own, waited) of a rank row as printed: own is the printed step less the printed wait,
    so the row adds up to the last digit shown (each rounded on its own may miss by 0.1 ms)."""
    if row.get("step_time_s") is None:  # a run whose records predate the wait
        return "—", "—", "—"
    step_ms, wait_ms = round(row["step_time_s"] * 1e3, 1), round(row["sync_wait_s"] * 1e3, 1)
    return _ms(step_ms / 1e3), _ms((step_ms - wait_ms) / 1e3), _ms(wait_ms / 1e3)


def render_status(status: dict) -> str:
    lines = []
    stopped = status.get("stopped")
    # a launch holds the run's lock while it runs (executor.run_lock); without one and without
    # stopped.json it may be a Slurm job on another node, or a launcher killed by SIGKILL
    running = status.get("running")
    state = ("finished" if status["finished"] else f"stopped ({stopped.get('reason', '?')})" if stopped
             else f"running ({running})" if running
             else f"ended without a record: its launch ({status['abandoned']}) is gone, killed (SIGKILL?) before it "
                  "could write stopped.json; `smplan execute` with -o this folder resumes it from its newest checkpoint, if it wrote one"
             if status.get("abandoned")
             else "unfinished: no launch holds it here (a job on another node, or a launcher killed by SIGKILL)")
    total = status["steps_total"]
    lines.append(f"run {status['run_dir']}  {state}")
    if stopped and stopped.get("detail"):
        lines.append(f"  stopped     {stopped['detail']}")
    lines.append(f"  progress    step {status['steps_done']}/{total or '?'}  {_bar(status['progress'])}".rstrip())
    if "step_time_s" not in status:  # stopped before its first step: nothing measured
        lines.append("  (stopped before its first step: nothing was measured)")
        return "\n".join(lines)
    st = status["step_time_s"]
    line = f"  step time   median {_ms(st['median'])}"
    if st["predicted"]:
        line += f"   predicted {_ms(st['predicted'])}   measured/predicted {st['ratio']:.2f}"
    lines.append(line)
    tok = status["throughput"]
    line = f"  {tok['unit']:<11} median {tok['median']:,.0f}"
    if tok["predicted"]:
        line += f"   predicted {tok['predicted']:,.0f}"
    lines.append(line)
    mem = status["memory"]
    line = f"  memory GiB  {_memory_by_rank(mem['peak_gib_by_rank'])}"
    if mem["compared"] and mem["predicted_peak_gib"] is not None:
        line += f"   predicted peak {mem['predicted_peak_gib']:.2f}"
    elif mem["source"] == "rss":  # the plan's GPU allocations are no prediction of a CPU process's RSS
        line += "   (CPU: process RSS, which the plan's GPU memory does not predict)"
    lines.append(line)
    loss, norm = status["loss"], status["grad_norm"]
    lines.append(f"  loss        {loss['first']:.4f} -> {loss['last']:.4f}  {loss['sparkline']}")
    lines.append(f"  grad norm   {norm['last']:.4f}  {norm['sparkline']}")
    val = status.get("val_loss")
    if val:
        lines.append(f"  val loss    {val['first']:.4f} (step {val['first_step']}) -> {val['last']:.4f} "
                     f"(step {val['last_step']}), best {val['best']:.4f} at step {val['best_step']}  {val['sparkline']}")
    lr = status.get("lr")
    if lr:
        lines.append(f"  lr          {lr['last']:.3g} now ({describe_lr(lr)})  {lr['sparkline']}")
    if status["ranks"]:
        lines.append("  rank  steps   mean step =  own time +    waited   peak GiB")
        rows = status["ranks"]
        if len(rows) > MAX_RANK_ROWS:  # the slowest ranks are the ones worth a line
            lines.append(f"  ({MAX_RANK_ROWS} of {len(rows)} ranks: the longest own step time)")
            rows = sorted(rows, key=lambda r: -(r["own_step_time_s"] or 0))[:MAX_RANK_ROWS]
        for r in rows:
            step, own, wait = step_columns(r)
            lines.append(f"  {r['rank']:>4}  {r['steps']:>5}  {step:>10}   {own:>9}   {wait:>9}   "
                         f"{r['peak_memory_gib']:>8.2f}")
        lines.append("  (means over the steps all ranks wrote but the first; step: the ranks' median; "
                     "own time: the step less the rank's wait at its end)")
    else:
        lines.append("  (no per-rank records: the run predates them; no straggler detection)")
    for warning in status["warnings"]:
        lines.append(f"warning: {warning}")
    if not status["warnings"]:
        th = status["thresholds"]
        memory = status["memory"]  # only a GPU allocator's peak against a prediction is checked
        checked = memory["compared"] and memory["predicted_peak_gib"] is not None
        lines.append(f"  no straggler (>{th['straggler_pct']:g}% for {th['straggler_steps']} steps)"
                     + (f" and no memory above the prediction (>{th['memory_pct']:g}%)" if checked else ""))
    return "\n".join(lines)


def skipped_note(status: dict) -> str | None:
    """One line on unreadable lines (a truncated last write), or None."""
    skipped = status["skipped_lines"]
    if not skipped:
        return None
    shown = ", ".join(skipped[:3]) + (" ..." if len(skipped) > 3 else "")
    return f"note: skipped {len(skipped)} unreadable line(s) ({shown}): a write cut short, e.g. a killed worker"

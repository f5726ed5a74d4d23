"""The self-contained `index.html` of a what-if report.

One page, inline CSS, no scripts and nothing fetched from the network: the question asked,
the recommended plan, the charts (image files beside the page) and the table of points.
"""

from __future__ import annotations

from html import escape

from smplan.display import days_text, memory_gib_text, mfu_percent_text

from .points import picked_word, unit_of

CAPTIONS = {
    "scaling": "Throughput and scaling efficiency as GPUs are added, one line per GPU type "
               "(or other varied setting). Dotted: perfectly linear scaling.",
    "versus": "Simulated step time against a varied hardware figure (or other numeric setting), "
              "one line per the other varied settings (e.g. gradient compression vs network bandwidth); "
              "goodput over the run instead when the setting only changes a whole run (failures, checkpoints).",
    "frontier": "Each feasible point's time to train against its cost, numbered #N as in the table; the red "
                "points are not beaten on both by any other, and the key beside the chart gives their "
                "settings and plans.",
    "memory": "Memory on the fullest GPU of each point's plan, stacked by what holds it; the black "
              "bar is the GPU's capacity. Hatched bars do not fit.",
    "breakdown": "Where one training step's time goes (exposed communication only); the black "
                 "bar is the simulated step time.",
    "gantt": "One simulated step of the {picked} plan: each row is a pipeline stage.",
    "goodput": "Share of wall-clock time that trains the model, over the whole run, from the "
               "failure simulation (several seeds).",
    "sensitivity": "How much the {picked} plan's step time moves when one hardware figure "
                   "is better or worse than its datasheet value.",
}
TITLES = {
    "scaling": "Scaling", "versus": "Step time (or goodput) vs a varied setting", "frontier": "Time to train vs cost", "memory": "Memory per GPU",
    "breakdown": "Step-time breakdown", "gantt": "Pipeline timeline", "goodput": "Goodput",
    "sensitivity": "Sensitivity",
}

CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2em auto;
       max-width: 1300px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { border-bottom: 2px solid #4477aa; padding-bottom: 0.2em; margin-top: 1.6em; }
code, pre { background: #f4f4f4; padding: 0.1em 0.3em; border-radius: 3px; font-size: 0.9em; }
pre { padding: 0.6em; overflow-x: auto; white-space: pre-wrap; }
.question { font-size: 1.15em; background: #eef3fa; padding: 0.8em 1em; border-radius: 6px; }
.recommend { border: 2px solid #228833; border-radius: 6px; padding: 0.6em 1.2em; background: #f3faf4; }
.recommend dl { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
.recommend dt { font-weight: 600; }
figure { margin: 1.2em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { color: #555; font-size: 0.92em; margin-top: 0.3em; }
table { border-collapse: collapse; font-size: 0.85em; width: 100%; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.5em; text-align: right; vertical-align: top; }
th { background: #f0f0f0; }
td.text { text-align: left; }
tr.infeasible td { background: #fdecec; color: #8a1c1c; }
tr.recommended td { background: #eaf6ec; font-weight: 600; }
"""


def render_html(record: dict) -> str:
    """The page for a points record whose `charts` maps chart names to files beside it."""
    q = record["question"]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>smplan what-if: {escape(q.get('model', ''))}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>What if… {escape(q.get('model', ''))}</h1>",
        f'<p class="question">{escape(q.get("text", ""))}</p>',
    ]
    if q.get("command"):
        parts.append(f"<p>Asked with <code>{escape(q['command'])}</code></p>")
    parts.append(_recommendation(record))
    if record.get("notes"):  # what `smplan whatif` prints under its table
        parts.append("<ul>" + "".join(f"<li>{escape(note)}</li>" for note in record["notes"]) + "</ul>")
    charts = record.get("charts") or {}
    if charts:
        parts.append("<h2>Charts</h2>")
    for name, file in charts.items():
        parts.append(
            f'<figure id="chart-{escape(name)}"><img src="{escape(file)}" alt="{escape(TITLES.get(name, name))} chart">'
            f"<figcaption><b>{escape(TITLES.get(name, name))}.</b> {escape(CAPTIONS.get(name, '').format(picked=picked_word(record)))}"
            "</figcaption></figure>"
        )
    parts.append("<h2>Points</h2>")
    parts.append(_table(record))
    parts.append('<p>Every number behind these charts: <a href="points.json">points.json</a> '
                 "(schema in <code>smplan.report.points</code>).</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _recommendation(record: dict) -> str:
    rid = record.get("recommended")
    if rid is None:
        return ('<h2>Recommended plan</h2><div class="recommend"><p>No point of this sweep is feasible: '
                f"{escape(record.get('recommendation', ''))}</p></div>")
    p = record["points"][rid]
    f = p["figures"]
    rows = [
        ("point", p["label"]),
        ("cluster", f"{p['nodes']} × {p['hw']} = {p['num_gpus']} × {p['gpu']}"),
        ("plan", p["plan_label"]),
        ("as --plan", p.get("plan_inline") or ""),
        ("step time", f"{f['step_time_s']:.3g} s"),
        ("throughput", f"{f['tokens_per_s']:,.0f} {unit_of(record)}s/s"),
        ("MFU", mfu_text(p)),
        ("peak memory", f"{memory_gib_text(f['peak_memory_gib'])} of {p['memory_capacity_gib']:.0f} GiB"),
    ]
    run = p.get("run")
    if run:
        rows += [
            ("time to train", f"{days_text(run['days'])} days ({days_text(run['ideal_days'])} without failures)"),
            ("cost", f"${run['usd']:,.0f}"),
            ("goodput", f"{run['goodput']:.1%} with a checkpoint every {run['checkpoint_interval_min']:.1f} min"),
        ]
    items = "".join(f"<dt>{escape(k)}</dt><dd>{_code(v) if k == 'as --plan' else escape(v)}</dd>" for k, v in rows)
    why = escape(record.get("recommendation", ""))
    title = "Best case" if picked_word(record) == "best case" else "Recommended plan"
    return f'<h2>{title}</h2><div class="recommend"><p>{why}</p><dl>{items}</dl></div>'


def mfu_text(point: dict) -> str:
    """A point's MFU, saying of which peak for an fp8 plan (as `smplan plan` does): fp8's is higher."""
    fp8 = (point.get("plan") or {}).get("dtype") == "fp8"
    return mfu_percent_text(point["figures"]["mfu"]) + (" of the fp8 peak" if fp8 else "")


def _code(text: str) -> str:
    return f"<code>{escape(text)}</code>"


def _table(record: dict) -> str:
    timed = any(p.get("run") for p in record["points"])
    days_given = bool(record["question"].get("days"))  # every point trains that long: show what it trains
    unit = unit_of(record)
    head = ["#", "point", "GPUs", "fits", "plan", "step (s)", f"{unit}s/s", "MFU", "peak GiB / cap"]
    if timed:
        head += [f"{unit}s" if days_given else "days", "cost ($)", "goodput", "checkpoint every (min)"]
    head.append("note")
    out = ["<table><thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for p in record["points"]:
        f = p.get("figures") or {}
        cls = "infeasible" if not p["feasible"] else ("recommended" if p["id"] == record.get("recommended") else "")
        peak = f.get("peak_memory_gib")
        cells = [
            str(p["id"]), _text(p["label"]), str(p["num_gpus"]), "yes" if p["feasible"] else "no",
            _text(p.get("plan_label") or "—"),
            _num(f.get("step_time_s"), "{:.3g}") if p["feasible"] else "—",
            _num(f.get("tokens_per_s"), "{:,.0f}") if p["feasible"] else "—",
            escape(mfu_text(p)) if p["feasible"] else "—",
            (f"{memory_gib_text(peak)} / {p['memory_capacity_gib']:.0f}" if peak is not None else "—"),
        ]
        if timed:
            run = p.get("run") or {}
            trained = _num(run.get("tokens"), "{:.3g}") if days_given else (escape(days_text(run["days"])) if run.get("days") is not None else "—")
            cells += [trained, _num(run.get("usd"), "{:,.0f}"), _num(run.get("goodput"), "{:.1%}"),
                      _num(run.get("checkpoint_interval_min"), "{:.1f}")]
        note = p.get("reason") or (picked_word(record) if p["id"] == record.get("recommended") else "")
        if p["id"] in set(record.get("pareto") or []):
            note = (note + "; " if note else "") + "Pareto"
        cells.append(_text(note))
        out.append(f'<tr class="{cls}">' + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _text(value: str) -> str:
    return f'<td class="text">{escape(str(value))}</td>'


def _num(value, fmt: str) -> str:
    return "—" if value is None else escape(fmt.format(value))

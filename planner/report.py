"""A self-contained HTML report of a plan: tables, predicted figures, baselines, plots, exports.

Images are inlined as base64 PNGs, so the page opens from disk in any browser with no server. A
small script marks the page once every image has decoded (`data-images-ok`), which the headless
browser test reads.
"""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

from matplotlib.figure import Figure

from planner.exports import summary as exports
from planner.plots import baselines_bar, pareto_frontier
from planner.sweeps import pareto
from sim import simulate
from sim.plots import gantt, plt, staleness_histogram, utilization
from traces import Cluster, CostModel, Plan, SpecError, Workload

_STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f4f4f4}img{max-width:100%;display:block;margin:.5em 0}pre{background:#f7f7f7;padding:.6em}
h2{border-bottom:1px solid #ddd;padding-bottom:.2em}"""
_CHECK = """<script>window.addEventListener('load',()=>{const imgs=[...document.images];
document.body.dataset.imagesOk=String(imgs.length>0&&imgs.every(i=>i.complete&&i.naturalWidth>0));
document.body.dataset.images=String(imgs.length);});</script>"""


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _img(fig: Figure, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{_png(fig)}">'


def _table(rows: dict[str, Any], head: str) -> str:
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{_fmt(v)}</td></tr>" for k, v in rows.items())
    return f'<table class="{head}">{body}</table>'


def _fmt(v: Any) -> str:
    return f"{v:,.4g}" if isinstance(v, float) else html.escape(str(v))


def render(plan: Plan, cluster: Cluster, workload: Workload, *, steps: int = 8, seed: int = 0,
           cost_model: CostModel | None = None) -> str:
    """The report page as one HTML string."""
    cm = cost_model or CostModel()
    result = simulate(cluster, workload, plan, cm, steps=steps, seed=seed)
    baselines = {k.split(":", 1)[1]: v for k, v in plan.predicted.items() if k.startswith("baseline:")}
    try:
        frontier = pareto(cluster, workload, points=6, cost_model=cm)
    except SpecError:
        frontier = None
    sim_rows = {k: v for k, v in result.summary().items() if not isinstance(v, dict)}
    parts = [
        f"<h1>rlfleet plan: {html.escape(workload.name)} on {html.escape(cluster.name)}</h1>",
        f"<p>{plan.mode} plan" + (f", staleness {plan.staleness}" if plan.mode == "async" else "")
        + f", {plan.total_gpus} GPUs, model {html.escape(workload.model.name)}, "
        f"{workload.samples_per_step} samples per step.</p>",
        "<h2>Plan</h2>", plan.to_frame().astype(object).fillna("").to_html(index=False, classes="plan-table"),
        "<h2>Predicted</h2>", _table(dict(plan.predicted) or {"(none)": "plan not made by rlfleet plan"}, "predicted"),
        f"<h2>Simulated here ({steps} steps, seed {seed})</h2>", _table(sim_rows, "simulated"),
        "<h2>Baselines</h2>",
        (_img(baselines_bar(result.samples_per_s, baselines), "baselines") + _table(baselines, "baselines"))
        if baselines else "<p>No baselines recorded in this plan; <code>rlfleet plan</code> records them.</p>",
        "<h2>Timeline</h2>", _img(gantt(result), "Gantt timeline"),
        "<h2>Utilization and staleness</h2>", _img(utilization(result), "utilization"),
        _img(staleness_histogram(result), "staleness histogram"),
    ]
    if frontier is not None and not frontier.empty:
        parts += ["<h2>Cost against throughput</h2>", _img(pareto_frontier({cluster.name: frontier}), "pareto")]
    parts += ["<h2>Exports</h2>", f"<pre>{html.escape(json.dumps(exports(plan, cluster, workload), indent=2))}</pre>",
              "<h2>Plan JSON</h2>", f"<pre>{html.escape(plan.to_json())}</pre>"]
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>rlfleet report</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(parts)}{_CHECK}</body></html>")

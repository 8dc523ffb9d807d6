"""Writes the what-if notebooks from the cell sources below (outputs stripped): `python notebooks/build.py`.

Keeping the cells here makes them reviewable as code; the .ipynb files are what users open.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

HERE = Path(__file__).parent

FLEET_WHAT_IF = [
    ("md", """# What if the fleet changed?

Start from the shipped mixed fleet (64 H800, 128 H20, 32 L40S) and the long-tailed GRPO job on
qwen2.5-7b. Each variant adds or removes GPUs or caps the budget; the planner re-plans it
(MILP, then the simulator re-ranks) and we compare throughput and dollars per 1k samples."""),
    ("code", """import matplotlib.pyplot as plt

from planner import Change, what_if
from traces import example_cluster, example_workload

cluster = example_cluster("mixed-h800-h20-l40s")
workload = example_workload("qwen2.5-7b-grpo-longtail")
variants = [
    Change("+64 H20", gpus={"H20": 64}),
    Change("-32 L40S", gpus={"L40S": -32}),
    Change("+16 H800", gpus={"H800": 16}),
    Change("budget $150/h", budget=150.0),
    Change("staleness 1", workload={"staleness": 1}),
]
table = what_if(cluster, workload, variants, sim_steps=6)
table"""),
    ("md", "Throughput (simulated) and cost per 1k samples of each variant's chosen plan:"),
    ("code", """fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
left.barh(table.variant, table.samples_per_s, color="#4c78a8")
left.set_xlabel("throughput (samples/s, simulated)")
left.set_title("Throughput of each variant's best plan")
left.invert_yaxis()
right.barh(table.variant, table.cost_per_1k_samples, color="#f58518")
right.set_xlabel("$ per 1k samples")
right.set_title("Cost of each variant's best plan")
right.invert_yaxis()
fig.tight_layout()"""),
    ("md", "Which GPUs each chosen plan uses, by role:"),
    ("code", """gpu_columns = [c for c in table.columns if c.endswith(("_rollout", "_train"))]
table.set_index("variant")[gpu_columns].astype(int)"""),
]

STALENESS_AND_MODES = [
    ("md", """# Staleness and modes

The same 16 H800 GPUs run GRPO on qwen2.5-7b three ways: asynchronous and disaggregated (8
engines, 8 trainer GPUs) with a staleness bound eta from 0 to 8, synchronous disaggregated, and
colocated synchronous (all 16 GPUs alternate). Short fixed responses against long-tailed ones."""),
    ("code", """import pandas as pd

from planner.plots import throughput_curve
from sim import simulate
from sim.plots import gantt, staleness_histogram
from traces import Cluster, Plan, RolloutGroup, TrainerGroup, Workload, get_model
from traces.lengths import LengthDist

cluster = Cluster(name="h800-16", node_groups=({"gpu_type": "H800", "nodes": 2},))
lengths = {
    "short fixed (256)": LengthDist(kind="fixed", value=256),
    "long tail (lognormal, cap 8k)": LengthDist(kind="lognormal", mean=1000, sigma=1.2, cap=8000),
}

def job(responses, mode, eta=0):
    return Workload(name="grpo", model=get_model("qwen2.5-7b"), prompts_per_step=32, group_size=8,
                    prompt_len=LengthDist(kind="fixed", value=200), response_len=responses, mode=mode,
                    staleness=eta, reward_seconds=0.01)

def plan(mode, eta=0):
    if mode == "colocated":
        return Plan(mode=mode, rollout=(RolloutGroup(gpu_type="H800", instances=16),),
                    trainer=TrainerGroup(gpu_type="H800", dp=16))
    return Plan(mode=mode, staleness=eta, rollout=(RolloutGroup(gpu_type="H800", instances=8),),
                trainer=TrainerGroup(gpu_type="H800", dp=8))

rows, runs = [], {}
for name, responses in lengths.items():
    for eta in (0, 1, 2, 4, 8):
        r = simulate(cluster, job(responses, "async", eta), plan("async", eta), steps=2 * (eta + 1) + 6)
        rows.append({"lengths": name, "mode": "async", "eta": eta, "samples_per_s": r.samples_per_s})
        runs[(name, f"async eta={eta}")] = r
    for mode in ("sync", "colocated"):
        r = simulate(cluster, job(responses, mode), plan(mode), steps=8)
        rows.append({"lengths": name, "mode": mode, "eta": 0, "samples_per_s": r.samples_per_s})
        runs[(name, mode)] = r
frame = pd.DataFrame(rows)
frame.pivot_table(index=["lengths", "mode"], columns="eta", values="samples_per_s")"""),
    ("md", "Throughput against the staleness bound (sync and colocated do not use it: flat lines at eta 0):"),
    ("code", """for name in lengths:
    part = frame[frame.lengths == name]
    sync_like = part[part["mode"] != "async"]
    curve = pd.concat([part[part["mode"] == "async"],
                       *[pd.DataFrame({"mode": m, "eta": [0, 8], "samples_per_s": [v, v]})
                         for m, v in zip(sync_like["mode"], sync_like.samples_per_s, strict=True)]])
    throughput_curve(curve, "eta", series="mode", xlabel="staleness bound eta",
                     title=f"Throughput against eta: {name}")"""),
    ("md", "How stale the trained tokens were (async, eta = 4):"),
    ("code", """for name in lengths:
    staleness_histogram(runs[(name, "async eta=4")], title=f"Token staleness, eta 4: {name}")"""),
    ("md", "What each mode's GPUs did, long-tailed responses (first rows of each timeline):"),
    ("code", """name = "long tail (lognormal, cap 8k)"
for mode in ("async eta=4", "sync", "colocated"):
    gantt(runs[(name, mode)], max_resources=9, title=f"{mode}: {runs[(name, mode)].samples_per_s:.1f} samples/s")"""),
]

COST_PARETO = [
    ("md", """# Cost against throughput

For a range of throughput targets, the cheapest plan on the shipped mixed fleet, beside the
cheapest plan on fleets of one GPU type (each with the same number of GPUs of that type as the
mixed fleet has in total). Analytic figures from the MILP (no simulation), so this is quick."""),
    ("code", """import pandas as pd

from planner import pareto
from planner.plots import pareto_frontier
from traces import Cluster, example_cluster, example_workload

cluster = example_cluster("mixed-h800-h20-l40s")
workload = example_workload("qwen2.5-7b-grpo-longtail")
frontiers = {"mixed fleet": pareto(cluster, workload, points=8)}
for group in cluster.node_groups:
    nodes = cluster.total_gpus // group.gpus_per_node
    alone = Cluster(name=group.gpu_type, node_groups=(group.model_copy(update={"nodes": nodes}),))
    frontiers[group.gpu_type] = pareto(alone, workload, points=8)
frontiers["mixed fleet"]"""),
    ("code", """pareto_frontier(frontiers,
                title="Cheapest $/h for each throughput, mixed fleet and one-type fleets");"""),
    ("md", "The cheapest fleet per target (analytic $/h):"),
    ("code", """best = []
for name, frame in frontiers.items():
    for row in frame.itertuples():
        best.append({"fleet": name, "samples_per_s": round(row.samples_per_s, 1), "cost_per_hour": row.cost_per_hour})
pd.DataFrame(best).sort_values(["samples_per_s", "cost_per_hour"]).groupby(
    pd.cut(pd.DataFrame(best).samples_per_s, 6), observed=True).first()"""),
]

VALIDATE = [
    ("md", """# Validate: predicted vs measured

A simulator is only as good as its costs. Here is a real run of rlfleet's runtime: the toy addition
task on `tiny-llama-256`, one rollout engine and one trainer as Ray actors, weights broadcast over
gloo, staleness bound 2, on this repository's 2-core CPU machine. Beside it are the stage costs
`rlfleet profile` measured on the same machine. We simulate the run's own plan, observed workload
and cluster (the run folder holds all three), then compare throughput, stage times and timelines.

Both are shipped (`traces/data/runs/toy-cpu-256/`, `traces/data/profiles/cpu-tiny-llama-256.csv`).
To make your own on any machine:

    rlfleet profile --model tiny-llama-256 --gpu-type CPU --out my-profile.csv
    rlfleet run traces/data/plans/toy-cpu-256.json --profile my-profile.csv --out my-run
    rlfleet fidelity my-run --profile my-profile.csv"""),
    ("code", """import matplotlib.pyplot as plt
import pandas as pd

from sim.fidelity import predict_run
from sim.plots import gantt
from traces import CostModel, ProfileTable
from traces.records import read_run

record = read_run("traces/data/runs/toy-cpu-256")
profile = ProfileTable.from_csv("traces/data/profiles/cpu-tiny-llama-256.csv")
print(f"{record.steps} steps of {record.workload.samples_per_step} samples, {record.plan.mode}, "
      f"staleness {record.plan.staleness}; {len(profile)} profiled rows")
record.plan"""),
    ("md", """Predict the run twice: with the measured profile, and with the roofline alone (the catalog's
order-of-magnitude figures for a CPU core). The error is (predicted - measured) / measured over
the same steady-state window (the first staleness + 1 steps are start-up)."""),
    ("code", """with_profile = predict_run(record, CostModel(profile))
roofline = predict_run(record, CostModel.roofline_only())
pd.DataFrame([{"costs": "measured profile", **with_profile.summary()},
              {"costs": "roofline only", **roofline.summary()}]).drop(columns="cost_sources")"""),
    ("md", "Where the time goes, stage by stage: mean interval length in the run and in its simulation."),
    ("code", """def stage_means(timeline: pd.DataFrame) -> pd.Series:
    t = timeline.assign(seconds=timeline.end - timeline.start)
    role = t.resource.str.startswith("trainer").map({True: "trainer", False: "engine"})
    return t.groupby([role, t.activity]).seconds.mean()

stages = pd.DataFrame({"measured": stage_means(record.timeline),
                       "simulated": stage_means(with_profile.simulation.timeline)})
ax = stages.plot.barh(figsize=(8, 3.6), color=["#4c78a8", "#f58518"])
ax.set_xlabel("mean interval (s)")
ax.set_ylabel("role, activity")
ax.set_title("Stage times: the run vs its simulation with the measured profile")
stages.round(4)"""),
    ("md", "The same run as two timelines, measured above and simulated below:"),
    ("code", """fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 4.2), sharex=True)
gantt(record.timeline, ax=top, title="measured: Ray actors on 2 CPU cores", xlabel="")
gantt(with_profile.simulation, ax=bottom, title="simulated with the measured profile",
      xlabel="time since the run's start (s)");"""),
    ("md", "Step times (time between two synced steps), measured and simulated:"),
    ("code", """measured_steps = pd.Series([m["time"] for m in record.metrics]).diff().dropna()
simulated_steps = pd.Series(with_profile.simulation.step_times[1:])
fig, ax = plt.subplots(figsize=(7, 3))
ax.plot(measured_steps.index, measured_steps.values, "o-", label="measured")
ax.plot(simulated_steps.index + 1, simulated_steps.values, "s--", label="simulated")
ax.set_xlabel("step")
ax.set_ylabel("step time (s)")
ax.set_title("Step times of the run and of its simulation")
ax.legend();"""),
]

MOE_OR_DENSE_TURNS = [
    ("md", """# MoE or dense, one turn or ten

The same GRPO job (32 prompts x 8 answers a step, staleness 2) on the shipped mixed fleet (64 H800,
128 H20, 32 L40S), four ways: a dense policy (qwen2.5-7b) or a mixture-of-experts one (qwen3-30b-a3b:
30.5B parameters, 3.3B active), and one long answer a sample or an agentic episode of ten turns
(answers of ~600 tokens, a ~2 s tool call after each but the last, each adding ~300 tokens to the
context). For each: the best plan the planner finds on the whole fleet, and the best plan that uses
the fleet's GPUs of one type only; the heterogeneous gain is the first over the second. Analytic
figures from the MILP (no simulation, so this is quick: tests/test_agentic_planner.py keeps the
agentic rate within 15% of the simulator's)."""),
    ("code", """import matplotlib.pyplot as plt
import pandas as pd

from planner.candidates import candidates
from planner.milp import solve
from traces import Cluster, CostModel, example_cluster
from traces.workload import workload_from_dict

cm = CostModel()
fleet = example_cluster("mixed-h800-h20-l40s")
ten_turns = {"turns": {"kind": "fixed", "value": 10},
             "tool_latency": {"kind": "lognormal", "mean": 2.0, "sigma": 1.0, "cap": 30.0},
             "tool_tokens": {"kind": "lognormal", "mean": 300, "sigma": 0.8, "cap": 1024}}
one_answer = {"kind": "lognormal", "mean": 2000, "sigma": 0.9, "cap": 8192}
turn_answer = {"kind": "lognormal", "mean": 600, "sigma": 0.8, "cap": 2048}

def job(model, agentic):
    extra = {"agentic": agentic, "response_len": turn_answer} if agentic else {"response_len": one_answer}
    return workload_from_dict({"model": model, "prompts_per_step": 32, "group_size": 8, "mode": "async",
                               "staleness": 2, "prompt_len": {"kind": "lognormal", "mean": 400, "sigma": 0.5,
                                                              "cap": 1024}, **extra}, "notebook")

def best(cluster, workload):
    cand = candidates(cm, cluster, workload)
    found = solve(cand, "async", "throughput", None, None, 1, "auto")
    return cand, (found[0] if found else None)

def one_type(cluster, gpu_type):
    groups = [g for g in cluster.node_groups if g.gpu_type == gpu_type]
    merged = groups[0].model_copy(update={"nodes": sum(g.nodes for g in groups), "label": None})
    return Cluster(name=gpu_type, gpus=cluster.gpus, node_groups=(merged,))

def gpus(cand, option, count):
    return cand.pools[option.pool].gpu.name, option.tp * count

rows = []
for model, kind in (("qwen2.5-7b", "dense 7B"), ("qwen3-30b-a3b", "MoE 30B-A3B")):
    for turns, agentic in (("one turn", None), ("ten turns", ten_turns)):
        w = job(model, agentic)
        cand, sol = best(fleet, w)
        rollout = {}
        for option, count in sol.engines:
            name, n = gpus(cand, option, count)
            rollout[name] = rollout.get(name, 0) + n
        trainer = cand.pools[sol.trainer.pool].gpu.name
        single = {}
        for gpu in sorted({g.gpu_type for g in fleet.node_groups}):
            _, s = best(one_type(fleet, gpu), w)
            single[gpu] = s.samples_per_s if s else 0.0
        top = max(single, key=single.get)
        rows.append({"model": kind, "turns": turns, "samples/s": round(sol.samples_per_s, 2),
                     "tokens/sample": round(w.mean_tokens_per_sample),
                     "trainer": f"{sol.trainer.nodes * cand.pools[sol.trainer.pool].per_node} {trainer}",
                     "rollout": " + ".join(f"{n} {g}" for g, n in sorted(rollout.items())),
                     "$/h": sol.cost_per_hour, "best one type": f"{top} ({single[top]:.2f}/s)",
                     "heterogeneous gain": round(sol.samples_per_s / single[top], 2)})
table = pd.DataFrame(rows)
table"""),
    ("md", "Throughput and the heterogeneous gain of each job:"),
    ("code", """labels = table.model + ", " + table.turns
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
left.barh(labels, table["samples/s"], color="#4c78a8")
left.set_xlabel("samples/s (analytic)")
left.set_title("Best plan on the mixed fleet")
left.invert_yaxis()
right.barh(labels, table["heterogeneous gain"], color="#54a24b")
right.axvline(1.0, color="grey", lw=1)
right.set_xlabel("mixed fleet / best single GPU type")
right.set_title("Heterogeneous gain")
right.invert_yaxis()
fig.tight_layout()"""),
    ("md", """Ten turns make a sample an episode of ~6,000 decoded tokens at a context that grows turn by
turn, so samples/s fall; the tool calls free batch slots, which the staleness allowance refills with
other episodes (Little's law on the slots). Where the plans put the trainer and the engines above
shows how each job shifts the split between the GPU types."""),
]

NOTEBOOKS = {"fleet_what_if": FLEET_WHAT_IF, "staleness_and_modes": STALENESS_AND_MODES,
             "cost_pareto": COST_PARETO, "validate": VALIDATE, "moe_or_dense_turns": MOE_OR_DENSE_TURNS}


def build() -> list[Path]:
    written = []
    for name, cells in NOTEBOOKS.items():
        nb = nbformat.v4.new_notebook()
        # ids from the cell's place, not nbformat's random ones: rebuilding an unchanged notebook changes nothing
        nb.cells = [nbformat.v4.new_markdown_cell(src, id=f"{name}-{i}") if kind == "md"
                    else nbformat.v4.new_code_cell(src, id=f"{name}-{i}") for i, (kind, src) in enumerate(cells)]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        path = HERE / f"{name}.ipynb"
        nbformat.write(nb, path)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in build():
        print(path)

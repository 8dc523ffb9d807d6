"""Expert parallelism in the planner, the simulator and the exports (planner/candidates.py,
traces/plan_check.py, planner/exports): a mixture-of-experts model gets EP options, a dense one does
not; `rlfleet plan` on Qwen3-30B-A3B over a small mixed fleet picks EP and prints it; AReaL's and
verl's own loaders read the EP an export writes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from planner.candidates import engine_options, pools_of, trainer_options
from planner.exports import data, render
from sim.simulate import simulate
from traces import CostModel, Plan, RolloutGroup, SpecError, TrainerGroup, get_model, load_cluster, load_workload
from traces.costmodel.rl import trainer_fits, trainer_step_seconds
from traces.plan_check import plan_problems

DATA = Path(__file__).parents[1] / "traces" / "data"
CLUSTER = DATA / "clusters" / "h800-h20-l40s-4node.yaml"
WORKLOAD = DATA / "workloads" / "qwen3-30b-a3b-grpo.yaml"
CM = CostModel()


def _moe() -> tuple:  # type: ignore[type-arg]
    return load_cluster(CLUSTER), load_workload(WORKLOAD)


def test_moe_engines_get_ep_options_and_dense_engines_do_not() -> None:
    cluster, workload = _moe()
    pools = pools_of(cluster)
    moe = engine_options(CM, pools, workload)
    assert {(o.tp, o.ep) for o in moe if o.ep > 1} == {(2, 2), (4, 4), (8, 8)}
    dense = engine_options(CM, pools, workload.model_copy(update={"model": get_model("qwen2.5-7b")}))
    assert {o.ep for o in dense} == {1}
    # data-parallel attention: an EP engine schedules max_num_seqs per GPU, so it runs more sequences
    h20 = {(o.tp, o.ep): o for o in moe if pools[o.pool].gpu.name == "H20"}
    assert h20[(8, 8)].batch > h20[(8, 1)].batch == CM.efficiency.max_num_seqs


def test_trainer_options_take_ep_where_it_pays() -> None:
    """On 4 H20 nodes (96 GB, slow network) the fastest trainer splits the experts whole; the same
    layout without EP does not fit or is slower."""
    workload = load_workload(WORKLOAD)
    pools = pools_of(load_cluster(DATA / "clusters" / "mixed-h800-h20-l40s.yaml"))
    (h20,) = [p for p in pools if p.gpu.name == "H20"]
    best = max((t for t in trainer_options(CM, (h20,), workload, 0.0, 4)), key=lambda t: t.nodes)
    assert best.nodes == 4 and best.ep > 1
    kw = {"zero_stage": best.zero_stage, "recompute": best.recompute}
    layout = (best.dp, best.tp, best.pp)
    tokens = workload.samples_per_step * workload.mean_tokens_per_sample
    fits = bool(trainer_fits(CM, h20.gpu, workload, *layout, ep=1, **kw))
    logprob, train = trainer_step_seconds(CM, h20.gpu, workload, *layout, tokens, ep=1, gpus_per_node=8,
                                          inter_node_bytes_per_s=h20.inter_node_bytes_per_s, **kw)
    assert not fits or float(logprob + train) > best.step_seconds


def test_plan_on_a_mixed_fleet_chooses_ep_and_prints_it(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "plan.json"
    # judged on a 4-step screening window alone (--no-settle), where EP wins on this fleet; settled, it does not
    res = cli("plan", "--cluster", str(CLUSTER), "--workload", str(WORKLOAD), "--no-baselines", "--quiet",
              "--sim-steps", "4", "--top-k", "2", "--no-settle", "--out", str(out))
    assert res.code == 0, res.err
    plan = Plan.from_json(out.read_text())
    ep_groups = [g for g in plan.rollout if g.ep > 1]
    assert ep_groups or plan.trainer.ep > 1
    assert any(f"TP{g.tp} EP{g.ep} engines" in res.out for g in ep_groups) or f"ep{plan.trainer.ep}," in res.out


def _ep_plan(rollout_gpu: str = "H20") -> Plan:
    return Plan(cluster="h800-h20-l40s-4node", workload="qwen3-30b-a3b-grpo", model="qwen3-30b-a3b", mode="async",
                staleness=8, rollout=(RolloutGroup(gpu_type=rollout_gpu, tp=4, ep=4, instances=2, nodes=(2,)),),
                trainer=TrainerGroup(gpu_type="H800", dp=16, tp=1, pp=1, ep=8, zero_stage=1, nodes=(0, 1)))


def test_an_ep_plan_checks_and_simulates() -> None:
    cluster, workload = _moe()
    plan = _ep_plan()
    assert plan_problems(cluster, workload, plan) == []
    result = simulate(cluster, workload, plan, CM, steps=3, seed=0)
    assert result.mean_step_s > 0 and result.samples_per_s > 0


@pytest.mark.parametrize(("change", "needle"), [
    ({"rollout": (RolloutGroup(gpu_type="H20", tp=4, ep=2, instances=2),)}, "EP 2 must be 1 or the engine's TP (4)"),
    ({"trainer": TrainerGroup(gpu_type="H800", dp=12, tp=1, ep=8)}, "EP 8 does not divide the trainer's dp x tp"),
])
def test_bad_ep_is_named_in_one_line(change: dict[str, object], needle: str) -> None:
    cluster, workload = _moe()
    problems = plan_problems(cluster, workload, _ep_plan().model_copy(update=change))
    assert any(needle in p for p in problems), problems


def test_ep_on_a_dense_model_is_refused() -> None:
    cluster, workload = _moe()
    dense = workload.model_copy(update={"model": get_model("qwen2.5-7b")})
    assert any("needs a mixture-of-experts model" in p for p in plan_problems(cluster, dense, _ep_plan()))


def test_verl_export_carries_ep_and_composes_with_verls_config() -> None:
    hydra = pytest.importorskip("hydra", reason="make test installs hydra-core with verl")
    cluster, workload = _moe()
    plan = _ep_plan().model_copy(update={"rollout": (RolloutGroup(gpu_type="H20", tp=8, ep=8, instances=1,
                                                                  nodes=(2,)),)})
    spec = data("verl", plan, cluster, workload)[1]
    root = Path(importlib.util.find_spec("verl").submodule_search_locations[0])  # type: ignore[union-attr]
    with hydra.initialize_config_dir(config_dir=str(root / spec["config_dir"]), version_base=None):
        cfg = hydra.compose(config_name=spec["config_name"], overrides=spec["overrides"])  # unknown keys fail
    rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor.megatron
    assert (rollout.tensor_model_parallel_size, rollout.data_parallel_size, rollout.expert_parallel_size) == (1, 8, 8)
    assert (actor.expert_model_parallel_size, actor.expert_tensor_parallel_size) == (8, 1)


def test_areal_export_folds_trainer_ep_and_refuses_ep_engines() -> None:
    alloc = pytest.importorskip("areal.api.alloc_mode", reason="make test installs AReaL")
    cluster, workload = _moe()
    plan = _ep_plan().model_copy(update={"rollout": (RolloutGroup(gpu_type="H20", tp=4, instances=2, nodes=(2,)),)})
    backend = yaml.safe_load(render("areal", plan, cluster, workload))["actor"]["backend"]
    assert backend == "megatron:(attn:d16p1t1|ffn:d2p1t1e8)"
    actor = alloc.ModelAllocation.from_str(backend, name="actor")
    assert actor.parallel.world_size == 16 and actor.parallel.ep_size == 8
    with pytest.raises(SpecError, match="no expert-parallel dimension"):
        render("areal", _ep_plan(), cluster, workload)


def test_costs_prices_ep_and_refuses_it_for_a_dense_model(cli) -> None:  # type: ignore[no-untyped-def]
    base = ("costs", "decode", "--gpu", "h20", "--model", "qwen3-30b-a3b", "--tp", "8", "--context", "2000",
            "--json")
    ep = cli(*base, "--ep", "8", "--batch", "1024").json()
    tp = cli(*base, "--batch", "1024").json()
    assert ep["ep"] == 8 and ep["max_batch"] > tp["max_batch"] == 256  # per-GPU schedulers, no KV replication
    dense = cli("costs", "train", "--gpu", "h100", "--model", "llama-3.1-8b", "--dp", "8", "--ep", "8",
                "--tokens", "65536")
    assert dense.code == 2 and dense.err.strip().count("\n") == 0 and "needs a mixture-of-experts model" in dense.err

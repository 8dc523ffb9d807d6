"""Every export loads with its framework's own code: AReaL's GRPOConfig and ModelAllocation, verl's Hydra
config, Ray's placement groups as `rlfleet run` reserves them, Slurm host lists (python-hostlist)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from typing import Any

import hostlist
import pytest
import yaml

from planner.api import PlanReport, plan_report
from planner.exports import data, render
from planner.exports.verl import RECIPES
from traces import Cluster, CostModel, Plan, SpecError, Workload, example_cluster, example_workload, load_plan

areal_cli = pytest.importorskip("areal.api.cli_args", reason="make test installs AReaL (the frameworks stamp)")
alloc = pytest.importorskip("areal.api.alloc_mode", reason="make test installs AReaL (the frameworks stamp)")
hydra = pytest.importorskip("hydra", reason="make test installs hydra-core with verl")

CM = CostModel()
FAST: dict[str, Any] = {"top_k": 2, "sim_steps": 2, "baselines": False, "marginal": False, "refine": 0,
                        "cost_model": CM}
CASES = {  # the shipped mixed fleet, a two-type fleet, a colocated plan
    "mixed": ("mixed-h800-h20-l40s", "qwen2.5-7b-grpo-longtail", None),
    "two-type": ("a100-l4", "llama-3.1-8b-grpo-4k", None),
    "colocated": ("h100-64", "qwen2.5-1.5b-math-short", "colocated"),
}
_PLANS: dict[tuple[str, str | None], tuple[Cluster, Workload, PlanReport]] = {}


def _planned(case: str, framework: str | None) -> tuple[Cluster, Workload, PlanReport]:
    """Planned once per (case, framework) for the whole module: planning is the slow part."""
    if (case, framework) not in _PLANS:
        cluster_name, workload_name, mode = CASES[case]
        cluster, workload = example_cluster(cluster_name), example_workload(workload_name)
        if mode is not None:
            workload = workload.model_copy(update={"mode": mode, "staleness": 0})
        _PLANS[(case, framework)] = cluster, workload, plan_report(cluster, workload, framework=framework, **FAST)
    return _PLANS[(case, framework)]


def _hosts(role_nodes: tuple[int, ...]) -> list[str]:
    return [f"node{n}" for n in role_nodes]


def _rollout_nodes(plan: Plan) -> tuple[int, ...]:
    return tuple(sorted({n for g in plan.rollout for n in g.nodes}))


# ---- AReaL ---------------------------------------------------------------------------------------
def _areal_loads(plan: Plan, cluster: Cluster, workload: Workload) -> None:
    from omegaconf import OmegaConf

    text = render("areal", plan, cluster, workload)
    # what only the user knows (the data set), then the export merged over it as AReaL's loader does
    user = OmegaConf.create({"train_dataset": {"path": "/data/train.jsonl", "type": "rl"}})
    exported = OmegaConf.merge(user, OmegaConf.create(yaml.safe_load(text)))
    merged = areal_cli.to_structured_cfg(exported, areal_cli.GRPOConfig)  # unknown keys fail here
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, areal_cli.GRPOConfig)
    rollout = alloc.ModelAllocation.from_str(cfg.rollout.backend, name="rollout")
    actor = alloc.ModelAllocation.from_str(cfg.actor.backend, name="actor")
    assert rollout.backend == "vllm" and rollout.parallel.world_size == sum(g.gpus for g in plan.rollout)
    assert rollout.parallel.tp_size == plan.rollout[0].tp
    assert rollout.parallel.dp_size == sum(g.instances for g in plan.rollout)
    t = plan.trainer
    assert actor.parallel.world_size == t.gpus and actor.parallel.dp_size == t.dp
    assert (actor.parallel.tp_size, actor.parallel.pp_size) == (t.tp, t.pp)
    assert cfg.rollout.max_head_offpolicyness == plan.staleness
    assert cfg.train_dataset.batch_size == workload.prompts_per_step
    assert cfg.gconfig.n_samples == workload.group_size and cfg.gconfig.max_new_tokens == workload.response_len.max
    assert cfg.actor.ppo_n_minibatches == workload.ppo_minibatches
    assert hostlist.expand_hostlist(cfg.actor.scheduling_spec[0].nodelist) == _hosts(t.nodes)
    if plan.mode == "colocated":
        strategy = cfg.rollout.scheduling_strategy
        assert strategy.type == "colocation" and strategy.target == "actor"
        assert cfg.cluster.n_nodes == len(t.nodes)
    else:
        assert hostlist.expand_hostlist(cfg.rollout.scheduling_spec[0].nodelist) == _hosts(_rollout_nodes(plan))
        assert cfg.cluster.n_nodes == len(t.nodes) + len(_rollout_nodes(plan))


# ---- verl ----------------------------------------------------------------------------------------
def _verl_loads(plan: Plan, cluster: Cluster, workload: Workload) -> None:
    from hydra import compose, initialize_config_dir

    spec = data("verl", plan, cluster, workload)[1]
    root = Path(importlib.util.find_spec("verl").submodule_search_locations[0])  # type: ignore[union-attr]
    with initialize_config_dir(config_dir=str(root / spec["config_dir"]), version_base=None):
        cfg = compose(config_name=spec["config_name"], overrides=spec["overrides"])
    t = plan.trainer
    assert cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node == t.gpus
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == plan.rollout[0].tp
    assert cfg.actor_rollout_ref.rollout.n == workload.group_size
    assert cfg.data.train_batch_size == workload.prompts_per_step
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size * workload.ppo_minibatches == workload.prompts_per_step
    assert cfg.data.max_response_length == workload.response_len.max
    if t.tp > 1 or t.pp > 1:
        assert cfg.actor_rollout_ref.actor.megatron.tensor_model_parallel_size == t.tp
    if plan.mode == "colocated":
        assert spec["config_dir"] == RECIPES["ppo"][0] and "rollout" not in cfg
    else:
        assert cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node == sum(g.gpus for g in plan.rollout)
        assert cfg.async_training.staleness_threshold == plan.staleness


LOADERS = {"areal": _areal_loads, "verl": _verl_loads}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("framework", ["areal", "verl"])
def test_restricted_plan_exports_and_loads(case: str, framework: str) -> None:
    cluster, workload, report = _planned(case, framework)
    LOADERS[framework](report.plan, cluster, workload)
    free = report.restriction["unrestricted_samples_per_s"]  # type: ignore[index]
    print(f"{case}: --framework {framework} {report.chosen.samples_per_s:.2f} samples/s simulated, "
          f"unrestricted {free:.2f}")
    assert report.chosen.samples_per_s > 0 and free > 0


@pytest.mark.parametrize("case", list(CASES))
def test_unrestricted_plan_exports_or_names_the_replan(case: str) -> None:
    cluster, workload, report = _planned(case, None)
    plan = report.plan
    for framework, load in LOADERS.items():
        try:
            load(plan, cluster, workload)
        except SpecError as exc:
            assert f"--framework {framework}" in str(exc) and "\n" not in str(exc)
    for target in ("ray", "slurm"):
        assert render(target, plan, cluster, workload)
    if case == "mixed":  # the shipped plan has two engine kinds (H20 and L40S): neither framework runs that
        shipped = load_plan("traces/data/plans/mixed-async.json")
        for framework in LOADERS:
            with pytest.raises(SpecError, match="mixes engine kinds"):
                data(framework, shipped, cluster, workload)


# ---- Slurm ---------------------------------------------------------------------------------------
def test_slurm_script_has_one_component_per_group_on_its_nodes(tmp_path: Path) -> None:
    cluster, workload, report = _planned("mixed", None)
    plan = report.plan
    text = render("slurm", plan, cluster, workload)
    (tmp_path / "job.sh").write_text(text)
    subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], check=True)
    parts = text.split("#SBATCH hetjob")
    assert len(parts) == 1 + len(plan.rollout)
    groups = [plan.trainer, *plan.rollout]
    for part, group in zip(parts, groups, strict=True):
        opts = dict(line.removeprefix("#SBATCH --").split("=", 1) for line in part.splitlines()
                    if line.startswith("#SBATCH --"))
        assert hostlist.expand_hostlist(opts["nodelist"]) == _hosts(group.nodes)
        if "gpus" in opts:  # a group on part of its nodes asks its GPUs in all
            assert int(opts["gpus"]) == group.gpus and int(opts["nodes"]) == len(group.nodes)
        else:
            assert int(opts["nodes"]) * int(opts["gpus-per-node"]) == group.gpus


# ---- Ray -----------------------------------------------------------------------------------------
def test_ray_export_is_what_rlfleet_run_reserves() -> None:
    ray = pytest.importorskip("ray", reason="ray is part of the runtime extra that make test installs")
    from planner.exports.ray import placement_groups
    from runtime.placement import place
    from traces import RolloutGroup, TrainerGroup
    from traces.placement import TYPE_RESOURCE

    plan = Plan(mode="async", staleness=1, rollout=(RolloutGroup(gpu_type="H20", tp=2, instances=2),
                                                    RolloutGroup(gpu_type="L40S", tp=1, instances=1)),
                trainer=TrainerGroup(gpu_type="H800", dp=2))
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False,
             resources={TYPE_RESOURCE.format(t): 1.0 for t in ("H20", "L40S", "H800")})
    try:
        groups = place(plan, gpus=False)
        reserved = [{"role": g.role, "gpu_type": g.gpu_type, "bundles": g.placement_group.bundle_specs}
                    for g in groups]
    finally:
        ray.shutdown()
    exported = [{k: pg[k] for k in ("role", "gpu_type", "bundles")} for pg in placement_groups(plan, gpus=False)]
    assert reserved == exported
    assert [len(pg["bundles"]) for pg in exported] == [4, 1, 2]


# ---- the CLI -------------------------------------------------------------------------------------
def test_cli_export_writes_and_refuses_in_one_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster_file, workload_file = (str(Path("traces/data") / p) for p in (
        "clusters/mixed-h800-h20-l40s.yaml", "workloads/qwen2.5-7b-grpo-longtail.yaml"))
    _, _, areal_ = _planned("mixed", "areal")
    mixed, fits = "traces/data/plans/mixed-async.json", tmp_path / "areal.json"  # the shipped plan: two engine kinds
    areal_.plan.save(fits)
    args = ("--cluster", cluster_file, "--workload", workload_file)
    bad = cli("export", str(mixed), *args, "--to", "areal")
    assert bad.code == 2 and bad.err.count("\n") == 1 and "rlfleet plan --framework areal" in bad.err
    out = tmp_path / "areal.yaml"
    good = cli("export", str(fits), *args, "--to", "areal", "--out", str(out))
    assert good.code == 0, good.err
    assert yaml.safe_load(out.read_text())["rollout"]["backend"].startswith("vllm:d")
    _, _, colo = _planned("colocated", None)
    colo_file = tmp_path / "colo.json"
    colo.plan.save(colo_file)
    c_args = ("--cluster", str(Path("traces/data/clusters/h100-64.yaml")), "--workload",
              str(Path("traces/data/workloads/qwen2.5-1.5b-math-short.yaml")))
    refused = cli("export", str(colo_file), *c_args, "--to", "verl", "--recipe", "fully_async")
    assert refused.code == 2 and "--recipe ppo" in refused.err and refused.err.count("\n") == 1


def test_cli_plan_framework_names_the_restriction_and_its_cost(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "plan.json"
    r = cli("plan", "--cluster", "traces/data/clusters/a100-l4.yaml", "--workload",
            "traces/data/workloads/llama-3.1-8b-grpo-4k.yaml", "--framework", "verl", "--no-baselines",
            "--sim-steps", "2", "--top-k", "1", "--out", str(out))
    assert r.code == 0, r.err
    assert "restricted to what verl launches" in r.out and "the unrestricted plan simulates" in r.out
    verl_line = next(line for line in r.out.splitlines() if line.startswith("verl: "))
    assert "trainer.nnodes=" in verl_line and "rlfleet plan --framework" not in verl_line  # it exports as it is
    assert f"rlfleet export {out}" in r.out


@pytest.mark.parametrize("framework", ["areal", "verl"])
def test_a_lora_job_exports_its_adapter_in_the_frameworks_own_fields(framework: str) -> None:
    """AReaL's TrainEngineConfig.use_lora / lora_rank / target_modules (and its engines' enable_lora) and
    verl's actor_rollout_ref.model.lora_rank / target_modules: both for FSDP actors only."""
    cluster, workload, report = _planned("colocated", framework)
    t = report.plan.trainer
    plan = report.plan.model_copy(update={"trainer": t.model_copy(update={"dp": t.gpus, "tp": 1, "pp": 1})})
    lora = workload.model_copy(update={"lora_rank": 8})
    LOADERS[framework](plan, cluster, lora)  # still loads with the framework's own code
    if framework == "areal":
        exported = yaml.safe_load(render("areal", plan, cluster, lora))
        assert exported["actor"]["use_lora"] is True and exported["actor"]["lora_rank"] == 8
        assert exported["actor"]["target_modules"] == ["all-linear"] and exported["vllm"]["max_lora_rank"] == 8
    else:
        over = data("verl", plan, cluster, lora)[1]["overrides"]
        assert "actor_rollout_ref.model.lora_rank=8" in over
        assert "actor_rollout_ref.model.target_modules=all-linear" in over
    megatron = plan.model_copy(update={"trainer": plan.trainer.model_copy(update={"dp": t.gpus // 2, "tp": 2})})
    with pytest.raises(SpecError, match="lora_rank 8") as err:
        data(framework, megatron, cluster, lora)
    assert "\n" not in str(err.value)

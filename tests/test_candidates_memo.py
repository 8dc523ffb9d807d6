"""Engine curves and trainer layouts computed once per cost model (planner.memo, issue 19): a
fleet's options are the ones a fresh cost model gives it, whatever fleets of the same GPU types
came first; only the fleet's own weight-sync time is priced again."""

from __future__ import annotations

import dataclasses
import gc

import pytest

from planner import memo
from planner.candidates import EngineOption, candidates
from traces import Cluster, CostModel, Workload, get_model
from traces.lengths import LengthDist


def _workload(interruptible: bool, mode: str = "async") -> Workload:
    return Workload(name="memo", model=get_model("qwen2.5-1.5b"), prompts_per_step=16, group_size=8,
                    prompt_len=LengthDist(kind="uniform", low=64, high=256),
                    response_len=LengthDist(kind="lognormal", mean=600, sigma=0.8, cap=2048),
                    staleness=2 if mode == "async" else 0, interruptible=interruptible, mode=mode)


def _fleet(h800_nodes: int) -> Cluster:
    return Cluster(name=f"memo-{h800_nodes}", node_groups=({"gpu_type": "H800", "nodes": h800_nodes},
                                                           {"gpu_type": "H20", "nodes": 1}))


def _fields(o: EngineOption) -> tuple[object, ...]:
    """Every field but the drain source, which is compared by identity (its curve by value)."""
    plain = tuple(getattr(o, f.name) for f in dataclasses.fields(o) if f.name != "drain_source")
    return (*plain, o.drain)


@pytest.mark.parametrize(("interruptible", "mode"), [(True, "async"), (False, "async"), (False, "sync")])
def test_a_fleet_after_others_gets_the_options_a_fresh_cost_model_gives(interruptible: bool, mode: str) -> None:
    workload = _workload(interruptible, mode)
    shared = CostModel.roofline_only()
    first = candidates(shared, _fleet(1), workload)
    later = candidates(shared, _fleet(3), workload)  # more GPUs: a longer weight sync than the first fleet's
    fresh = candidates(CostModel.roofline_only(), _fleet(3), workload)
    assert later.sync_seconds != first.sync_seconds
    assert [_fields(o) for o in later.engines] == [_fields(o) for o in fresh.engines]
    assert later.trainers == fresh.trainers
    one_node = later.trainers[0], first.trainers[0]  # one H800 node in both fleets: the same layout, its own sync
    assert one_node[0].nodes == one_node[1].nodes == 1 and one_node[0].step_seconds != one_node[1].step_seconds
    assert one_node[0].step_seconds - later.sync_seconds == pytest.approx(one_node[1].step_seconds - first.sync_seconds)
    if interruptible:  # the update pause is this fleet's: its weight sync, then the re-prefill
        assert [o.update_seconds for o in later.engines] != [o.update_seconds for o in first.engines]


def test_the_memo_is_dropped_with_its_cost_model() -> None:
    cm = CostModel.roofline_only()
    assert memo.once(cm, "k", lambda: 1) == 1
    assert memo.once(cm, "k", lambda: 2) == 1  # computed once
    ident = id(cm)
    del cm
    gc.collect()
    assert ident not in memo._MEMOS


def test_trainer_layouts_a_sync_apart_pick_as_a_fresh_cost_model_does() -> None:
    """A pool's layouts are priced without the sync and picked with it: at 100,000 GPUs two layouts
    of one node count tie only once the sync is added, and the fresh pick (the first) must stay."""
    types = ("H800", "H20", "L40S", "A100-80G", "H100", "H200", "A10G", "L4", "A800", "L20", "B200", "MI300X")
    workload = Workload(name="memo", model=get_model("qwen2.5-32b"), prompts_per_step=64, group_size=16,
                        prompt_len=LengthDist(kind="lognormal", mean=400, sigma=0.5, cap=1024),
                        response_len=LengthDist(kind="lognormal", mean=2000, sigma=0.9, cap=8192), staleness=4)
    fleets = [Cluster(name=f"tie-{extra}", node_groups=tuple({"gpu_type": t, "nodes": 1042 + (i < 4) + extra * (i == 0)}
                                                             for i, t in enumerate(types))) for extra in (0, 1)]
    shared = CostModel()
    warm = [candidates(shared, f, workload).trainers for f in fleets]
    assert warm == [candidates(CostModel(), f, workload).trainers for f in fleets]

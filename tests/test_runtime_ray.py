"""The async loop on Ray: engines and trainer as actors on a loopback cluster, weights synced over gloo.

- the sync path (runtime.sync) hands every engine bitwise the sender's tensors and the version,
  across dtypes, shapes, non-contiguous tensors and both bucket paths (packed, alone);
- after a real train step, the actors' sync leaves every engine with exactly the trainer's weights;
- the toy task on Ray (one trainer, two engines, eta = 2) beats 5x chance within the step budget,
  with no trained token older than eta.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray", reason="ray is part of the runtime extra that make test installs")

from runtime.records import TIMELINE_COLUMNS, read_metrics  # noqa: E402
from runtime.sync import SyncGroup, WeightReceiver, WeightSender, as_bytes  # noqa: E402

STEPS = 150
ETA = 2


@ray.remote(num_cpus=0)
class Receiver:
    """A bare receiving rank: returns what arrived as raw bytes, shapes and dtypes."""

    def join_and_receive(self, port: int, rank: int, world: int, template: dict[str, torch.Tensor],
                         bucket_bytes: int) -> tuple[dict[str, tuple[bytes, tuple[int, ...], str]], int]:
        receiver = WeightReceiver(SyncGroup("127.0.0.1", port, rank, world), template, bucket_bytes)
        state, version = receiver.receive()
        return {k: (as_bytes(v).numpy().tobytes(), tuple(v.shape), str(v.dtype)) for k, v in state.items()}, version


def _mixed_state_dict() -> dict[str, torch.Tensor]:
    """Every path of a 4 KB bucket: packed buckets between lone tensors, odd and even counts of them."""
    g = torch.Generator().manual_seed(7)
    blocks = {}
    for k in range(3):
        for j in range(2 + k):  # 1200 B each: buckets of 3 tensors, so 1 or 2 packed buckets per block
            blocks[f"block{k}.small{j}"] = torch.randn(300, generator=g)
        blocks[f"block{k}.big"] = torch.randn(40, 200, generator=g)  # 32 KB: alone
    return {
        **blocks,
        "small": torch.randn(3, 5, generator=g),
        "big_bf16": torch.randn(1500, 700, generator=g).to(torch.bfloat16),  # > a bucket: sent alone
        "ints": torch.arange(7, dtype=torch.int64) * -3,
        "scalar": torch.tensor(3.5),
        "transposed": torch.randn(4, 6, generator=g).t(),  # not contiguous
        "half": torch.randn(9, generator=g).half(),
        "nan_inf": torch.tensor([float("nan"), float("inf"), -0.0]),  # bitwise, not by value
    }


def test_sync_delivers_the_senders_bytes_and_version_to_every_engine(ray_cluster: None) -> None:
    sd = _mixed_state_dict()
    template = {k: torch.zeros_like(v) for k, v in sd.items()}  # the receivers' own (different) values
    world, bucket = 3, 4096
    store = SyncGroup.host_store("127.0.0.1", world)
    receivers = [Receiver.remote() for _ in range(world - 1)]
    futures = [r.join_and_receive.remote(store.port, i + 1, world, template, bucket) for i, r in enumerate(receivers)]
    sender = WeightSender(SyncGroup("127.0.0.1", store.port, 0, world, store=store), bucket)
    assert sender.send(sd, 17) == sum(v.numel() * v.element_size() for v in sd.values())
    for got, version in ray.get(futures):
        assert version == 17
        assert list(got) == list(sd)
        for name, tensor in sd.items():
            raw, shape, dtype = got[name]
            assert raw == as_bytes(tensor).numpy().tobytes(), name
            assert shape == tuple(tensor.shape) and dtype == str(tensor.dtype), name
    for r in receivers:
        ray.kill(r)


def test_actors_sync_leaves_every_engine_with_the_trainers_weights(ray_cluster: None) -> None:
    from runtime.fleet import start_actors
    from runtime.model import CharTokenizer, build_model, tiny_llama_config
    from runtime.placement import place
    from runtime.toy import toy_plan
    from runtime.trainer import Rollout, TrainConfig

    tok = CharTokenizer()
    model = build_model(tiny_llama_config(tok), seed=0)
    groups = place(toy_plan(engines=2, staleness=ETA), gpus=False)
    handles, trainer = start_actors(groups, model, tok, TrainConfig(), seed=0, max_batch=8, interruptible=True)
    try:
        prompt = tuple(tok.encode("1+2="))
        batch = [Rollout(prompt, (5 + i, tok.eos_id), (-2.0, -1.0), (0, 0), float(i % 2), 0) for i in range(4)]
        stats, _ = ray.get(trainer.train_step.remote(batch))
        assert stats.step == 0
        sent = trainer.send_weights.remote()
        statuses = ray.get([h.actor.receive_weights.remote() for h in handles])
        assert ray.get(sent)[0] == 1
        assert all(s.accepts == 1 and not s.idle for s in statuses)  # queued, applied at the next iteration
        ray.get([h.actor.step.remote([]) for h in handles])
        want = ray.get(trainer.weights.remote())
        assert any(not torch.equal(want[k], v) for k, v in model.state_dict().items())  # the step changed them
        for h in handles:
            got = ray.get(h.actor.weights.remote())
            assert list(got) == list(want)
            assert all(torch.equal(as_bytes(got[k]), as_bytes(want[k])) for k in want)
            assert ray.get(h.actor.status.remote()).accepts == 1
    finally:
        for actor in [*(h.actor for h in handles), trainer]:
            ray.kill(actor)
        for g in groups:
            ray.util.remove_placement_group(g.placement_group)


def test_async_grpo_on_ray_beats_five_times_chance_within_the_staleness_bound(ray_cluster: None,
                                                                               tmp_path: Path) -> None:
    from runtime.toy import run_toy_ray

    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    result = run_toy_ray(STEPS, engines=2, staleness=ETA, seed=0, out_dir=tmp_path, progress=rows.append)
    wall = time.perf_counter() - t0

    tenth = STEPS // 10
    curve = [sum(result.rewards[i:i + tenth]) / tenth for i in range(0, STEPS, tenth)]
    print(f"\nreward by tenth of the run: {[round(r, 3) for r in curve]}")
    print(f"eval before {result.eval_before:.4f}, after {result.eval_after:.4f}; target {5 * result.chance:.4f}")
    print(f"staleness (lag, tokens): {result.staleness_tokens}; {result.samples} samples in {result.seconds:.1f} s "
          f"({result.samples_per_s:.0f}/s), {wall:.1f} s with evaluation and actor start-up")

    assert result.steps == STEPS and [r["step"] for r in rows] == list(range(STEPS))
    assert curve[0] <= result.chance
    assert result.eval_after >= 5 * result.chance
    assert curve[-1] >= 5 * result.chance
    assert result.max_staleness <= ETA
    assert all(r["max_staleness"] <= ETA for r in read_metrics(tmp_path))
    assert wall < 150
    with (tmp_path / "timeline.csv").open() as handle:
        timeline = list(csv.DictReader(handle))
    assert tuple(timeline[0]) == TIMELINE_COLUMNS
    assert {(r["resource"], r["activity"]) for r in timeline} >= {
        ("engine0", "prefill"), ("engine1", "decode"), ("engine0", "weight_load"), ("engine1", "weight_load"),
        ("trainer0", "train"), ("trainer0", "sync")}
    # engines and trainer are processes: some generation overlaps some training in wall time (generation
    # is 2 tokens here, so most of it finishes before the trainer's step: little overlap, but not none)
    spans = {key: [(float(r["start"]), float(r["end"])) for r in timeline if (r["group"] == "trainer") == key]
             for key in (True, False)}
    assert any(s < te and e > ts for s, e in spans[False] for ts, te in spans[True])
    assert (tmp_path / "checkpoint.json").exists() and (tmp_path / "checkpoints" / f"trainer-{STEPS:06d}.pt").exists()


def test_ray_loop_keeps_the_bound_with_draining_engines_on_policy(ray_cluster: None) -> None:
    """eta = 0 with non-interruptible engines: each engine drains, loads, then accepts again (no stall)."""
    from runtime.toy import run_toy_ray

    rows: list[dict[str, Any]] = []
    result = run_toy_ray(6, engines=2, staleness=0, seed=1, prompts_per_step=4, group_size=4, interruptible=False,
                         progress=rows.append)
    assert result.steps == 6 and result.samples == 6 * 16
    assert result.staleness_tokens == ((0, sum(r["tokens"] for r in rows)),)

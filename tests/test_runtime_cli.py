"""`rlfleet run` on the toy task: reward from chance to >= 5x chance, staleness bound kept, records written."""

from __future__ import annotations

import json
from pathlib import Path


def test_rlfleet_run_learns_within_the_bound(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    res = cli("run", "traces/data/plans/toy-cpu.json", "--steps", "150", "--out", str(tmp_path), "--json")
    assert res.code == 0, res.err
    assert res.json()["executor"] == "ray-local"  # Ray actors on a fake node mirroring cpu-host, weights over gloo
    assert res.code == 0, res.err
    out = res.json()
    print(f"reward {out['eval_before']:.3f} -> {out['eval_after']:.3f} (chance {out['chance']:.3f}) "
          f"in {out['seconds']:.1f} s, max staleness {out['max_staleness']}")
    assert out["eval_after"] >= 5 * out["chance"]
    assert out["max_staleness"] <= out["staleness_bound"] == 2
    assert out["seconds"] < 300
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 150 and max(r["max_staleness"] for r in rows) <= 2
    assert (tmp_path / "timeline.csv").read_text().startswith("resource,group,activity,start,end,version,samples")


def test_rlfleet_run_refuses_what_it_cannot_do(cli, write) -> None:  # type: ignore[no-untyped-def]
    h100 = write("p.json", json.dumps({"mode": "colocated", "rollout": [{"gpu_type": "H100", "instances": 1}],
                                       "trainer": {"gpu_type": "H100", "dp": 1}}))
    res = cli("run", str(h100), "--steps", "1", "--in-process")  # the default cluster is this machine, cpu-host
    assert res.code == 2 and "H100" in res.err and "cpu-host" in res.err and len(res.err.strip().splitlines()) == 1
    res = cli("run", "traces/data/plans/toy-cpu.json", "--steps", "1", "--in-process", "--address", "127.0.0.1:1")
    assert res.code == 2 and "not allowed with" in res.err
    res = cli("run", "traces/data/plans/toy-cpu.json", "--steps", "1", "--address", "127.0.0.1:1")  # nobody listens
    assert res.code == 2 and "nothing answers at Ray address 127.0.0.1:1" in res.err
    res = cli("run", "traces/data/plans/toy-cpu.json", "--steps", "1", "--address", "no port")
    assert res.code == 2 and "ray address 'no port'" in res.err

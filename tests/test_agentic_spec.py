"""The agentic workload fields (traces.agentic): episode lengths and the refusals of bad input."""

from __future__ import annotations

import numpy as np
import pytest

from traces import SpecError
from traces.agentic import SecondsDist
from traces.workload import workload_from_dict

BASE = {"model": "qwen2.5-7b", "prompts_per_step": 4, "group_size": 2,
        "prompt_len": {"kind": "fixed", "value": 100}, "response_len": {"kind": "fixed", "value": 200}}


def _w(**agentic: object):
    return workload_from_dict({**BASE, "agentic": agentic}, "test.yaml")


def test_one_turn_is_the_single_turn_episode() -> None:
    single, one = workload_from_dict(BASE, "t.yaml"), _w(turns={"kind": "fixed", "value": 1})
    assert one.max_seq_len == single.max_seq_len == 300
    assert one.mean_tokens_per_sample == single.mean_tokens_per_sample == 300
    assert one.mean_generated_tokens_per_sample == 200


def test_episode_lengths_by_hand() -> None:
    w = _w(turns={"kind": "uniform", "low": 1, "high": 5}, tool_tokens={"kind": "fixed", "value": 50},
           tool_latency={"kind": "fixed", "value": 2.0})
    assert w.max_seq_len == 100 + 5 * 200 + 4 * 50
    assert w.mean_tokens_per_sample == pytest.approx(100 + 3 * 200 + 2 * 50)
    assert w.mean_generated_tokens_per_sample == pytest.approx(600)


def test_capped_lognormal_latency_mean_matches_draws() -> None:
    d = SecondsDist(kind="lognormal", mean=3.0, sigma=1.2, cap=10.0)
    draws = d.sample(np.random.default_rng(0), 400_000)
    assert draws.max() <= 10.0
    assert d.expected() == pytest.approx(float(draws.mean()), rel=0.01)


@pytest.mark.parametrize("agentic, words", [
    ({"turns": {"kind": "fixed", "value": 2000}}, "turns"),
    ({"turns": {"kind": "fixed", "value": 2}, "tool_latency": {"kind": "uniform", "low": 3, "high": 1}}, "low"),
    ({"turns": {"kind": "fixed", "value": 2}, "tool_latency": {"kind": "fixed", "value": -1}}, "tool_latency"),
    ({"turns": {"kind": "fixed", "value": 2}, "tools": 3}, "tools"),
    ({"turns": {"kind": "fixed", "value": 1000}, "tool_tokens": {"kind": "fixed", "value": 1000}}, "1048576"),
])
def test_bad_agentic_fields_name_the_field(agentic: dict, words: str) -> None:
    with pytest.raises(SpecError, match=words):
        _w(**agentic)

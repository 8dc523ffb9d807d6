"""Multi-turn episodes with a calculator tool through the runtime's loop (issue 16, point 5).

Two policies write the turns. A scripted one (`ScriptedEngine`: turn 1 is a call `<calc>EXPR</calc>`
built from the prompt, turn 2 copies the tool's result out of its context; the logprobs are the real
model's of those tokens) makes every episode call the tool, so what the environment does is checked
exactly: one call per sample, each recorded with its real latency (end - start >= the sampled
seconds), the engine serving other samples while calls sleep, the reward read off the last turn, and
the tool's tokens left out of the loss. Then the real tiny Qwen3-MoE writes the turns itself, and its
calls (rare: random weights) are whatever it emits.
"""

from __future__ import annotations

import csv
import re
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from runtime.calculator_tool import CALL_CLOSE, CALL_OPEN, RESULT_CLOSE, RESULT_OPEN
from runtime.contracts import Tokenizer
from runtime.controller import LoopConfig
from runtime.data_task import DatasetTask
from runtime.dataset import load_records
from runtime.engine import Completion, EngineBase, Request
from runtime.episodes import AgenticRun
from runtime.hf_model import load_causal_lm, load_tokenizer
from runtime.loop import AsyncLoop
from runtime.rewards import load_reward
from runtime.task_factory import TaskSource
from runtime.tiny_hf import TOOL_POSITIONS, TinySpec, tiny_model
from runtime.toy import run_toy
from runtime.trainer import Rollout, TrainConfig, Trainer, pack, token_logprobs
from traces.agentic import SecondsDist
from traces.records import TOOL_ACTIVITY, TOOL_CALLS_FILE
from traces.workload import load_workload

CALC = "runtime/data/calc.jsonl"
WORKLOAD = "traces/data/workloads/tiny-moe-calc-agentic.yaml"
LATENCY = SecondsDist(kind="uniform", low=0.05, high=0.15)


@pytest.fixture(scope="module")
def tools_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3-MoE whose tokenizer writes the tool's markers (runtime.tiny_hf --tools)."""
    spec = TinySpec(family="qwen3_moe", tools=True, max_positions=TOOL_POSITIONS)
    return tiny_model(tmp_path_factory.mktemp("tiny-moe-tools"), spec)


class ScriptedEngine(EngineBase):
    """A scripted policy: one token per row per iteration; turn 1 calls the tool, turn 2 answers with its result."""

    def __init__(self, model: PreTrainedModel, tokenizer: Tokenizer, max_batch: int) -> None:
        super().__init__("engine0", max_batch, interruptible=True, version=0, clock=time.time)
        self.model, self.tok, self.now = model, tokenizer, time.time
        self._rows: list[tuple[Request, list[int]]] = []
        self._open, self._close = tokenizer.encode(RESULT_OPEN)[0], tokenizer.encode(RESULT_CLOSE)[0]

    def script(self, request: Request) -> list[int]:
        ids = list(request.prompt)
        if self._open in ids:  # turn 2: the tool's answer, read out of the context
            start = len(ids) - 1 - ids[::-1].index(self._open)
            answer = self.tok.decode(ids[start + 1: ids.index(self._close, start)])
            return [*self.tok.encode(f"The answer is {answer}."), self.tok.eos_id]
        a, op, b = re.search(r"What is (\d+) ([*+-]) (\d+)\?", self.tok.decode(ids)).groups()  # type: ignore[union-attr]
        pad = " " * (request.sid % 4)  # turns of different lengths: samples leave for the tool at different times
        return [*self.tok.encode(f"{pad}{CALL_OPEN}{a}{op}{b}{CALL_CLOSE}"), self.tok.eos_id]

    def step(self) -> list[Completion]:
        t0 = self.now()
        while self._waiting and len(self._rows) < self.max_batch:
            request = self._waiting.popleft()
            self._rows.append((request, self.script(request)))
        if not self._rows:
            return []
        self._iterations += 1
        done, keep = [], []
        for request, tokens in self._rows:
            tokens = tokens[1:]  # one token written this iteration
            (keep if tokens else done).append((request, tokens))
        self._rows = keep
        out = [self._finish(request) for request, _ in done]
        self._record("decode", t0, len(keep) + len(done))
        return out

    def _finish(self, request: Request) -> Completion:
        tokens = self.script(request)
        ids = torch.tensor([[*request.prompt, *tokens]])
        with torch.no_grad():
            logp = token_logprobs(self.model, ids, torch.ones_like(ids))[0, len(request.prompt) - 1:].tolist()
        self._completed += 1
        return Completion(request.sid, request.prompt, tuple(tokens), tuple(logp), (self._version,) * len(tokens),
                          True)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        self.model.load_state_dict(state_dict)
        self._version = version


def test_scripted_episodes_call_the_tool_with_real_latency_and_train_without_its_tokens(
        tools_model: Path, tmp_path: Path) -> None:
    tokenizer = load_tokenizer(tools_model)
    task = DatasetTask.build(load_records(CALC, "prompt", "answer"), tokenizer.render, load_reward("math"), "math",
                             max_new_tokens=16)
    model = load_causal_lm(tools_model)
    steps, prompts, group = 2, 2, 4
    run = AgenticRun(max_turns=3, latency=LATENCY, seed=5, max_context=TOOL_POSITIONS)
    config = LoopConfig(steps, prompts, group, staleness=1, agentic=run)
    engine = ScriptedEngine(model, tokenizer, max_batch=6)  # fewer slots than samples: others wait their turn
    loop = AsyncLoop(task, tokenizer, [engine], Trainer(model, tokenizer.pad_id, TrainConfig(lr=1e-3)), config,
                     seed=5, out_dir=tmp_path, clock=time.time)
    history = loop.run()
    control = loop.control
    trained = control.trained_sids
    assert len(trained) == len(set(trained)) == steps * prompts * group
    assert all(s.mean_reward == 1.0 for s in history)  # the tool's answer reached the context, the last turn scored

    with (tmp_path / TOOL_CALLS_FILE).open() as handle:
        calls = list(csv.DictReader(handle))
    called = {int(c["sample"]) for c in calls}
    assert set(trained) <= called  # every trained sample called once (samples admitted ahead may too)
    assert all(c["turn"] == "1" for c in calls) and len(called) == len(calls)
    for c in calls:
        assert float(c["latency"]) == pytest.approx(run.latency_s(int(c["sample"]), 1), abs=1e-6)
        assert float(c["end"]) - float(c["start"]) >= float(c["latency"]) - 1e-6  # it really slept that long
    timeline = list(csv.DictReader((tmp_path / "timeline.csv").open()))
    tools = [r for r in timeline if r["activity"] == TOOL_ACTIVITY]
    busy = [r for r in timeline if r["resource"] == "engine0"]
    assert len(tools) == len(calls)
    # the engine iterated while some call slept: a sample out for its tool does not hold the loop
    assert any(float(b["start"]) > float(t["start"]) and float(b["end"]) < float(t["end"]) for t in tools for b in busy)

    # each trained episode is turn 1, the tool's result, turn 2: the step trains the turns' tokens only
    result_len = len(tokenizer.encode(f"{RESULT_OPEN}0{RESULT_CLOSE}"))  # every answer here has 2-3 digits
    for row in control.recorder.metrics:
        episode_tokens = sum(int(k) * v for k, v in row["response_lengths"].items())
        assert episode_tokens - row["tokens"] >= row["samples"] * (result_len + 1)


def test_tool_tokens_are_masked_out_of_the_loss(tools_model: Path) -> None:
    tokenizer = load_tokenizer(tools_model)
    model = load_causal_lm(tools_model)
    prompt = tuple(tokenizer.encode(tokenizer.render("What is 23 * 7?")))
    turn1 = (*tokenizer.encode(f"{CALL_OPEN}23*7{CALL_CLOSE}"), tokenizer.eos_id)
    tool = tuple(tokenizer.encode(f"{RESULT_OPEN}161{RESULT_CLOSE}"))
    turn2 = (*tokenizer.encode("The answer is 161."), tokenizer.eos_id)
    tokens = (*turn1, *tool, *turn2)
    generated = (True,) * len(turn1) + (False,) * len(tool) + (True,) * len(turn2)
    batch = pack([Rollout(prompt, tokens, (0.0,) * len(tokens), (0,) * len(tokens), 1.0, 0, generated)],
                 tokenizer.pad_id)
    cols = batch.response[0, len(prompt) - 1:len(prompt) - 1 + len(tokens)]
    assert cols.tolist() == list(generated) and int(batch.response.sum()) == len(turn1) + len(turn2)

    def step(tool_logprob: float, tool_ids: tuple[int, ...]) -> dict[str, torch.Tensor]:
        """One step on a group of two episodes whose tool tokens differ in what the loss must not see."""
        seqs = [(*turn1, *tool_ids, *turn2)] * 2
        rollouts = [Rollout(prompt, s, tuple(tool_logprob if not g else -1.0 for g in generated), (0,) * len(s), r, 0,
                            generated) for s, r in zip(seqs, (1.0, 0.0), strict=True)]
        trainer = Trainer(model, tokenizer.pad_id, TrainConfig(lr=1e-2, minibatches=1), seed=0)
        trainer.train_step(rollouts)
        return trainer.model.state_dict()

    a, b = step(-1.0, tool), step(-50.0, tool)  # the tool tokens' "behaviour logprobs" are not used
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_real_moe_model_runs_agentic_episodes_with_whatever_calls_it_writes(tools_model: Path,
                                                                                 tmp_path: Path) -> None:
    agentic = load_workload(WORKLOAD).agentic
    assert agentic is not None
    source = TaskSource(model=str(tools_model), dataset=CALC, reward="math", max_new_tokens=16, lr=1e-3)
    steps, prompts, group = 4, 4, 8
    result = run_toy(steps, engines=2, staleness=1, seed=0, out_dir=tmp_path, prompts_per_step=prompts,
                     group_size=group, source=source, agentic=agentic)
    assert result.steps == steps
    assert len(set(result.trained_sids)) == len(result.trained_sids) == steps * prompts * group
    assert result.max_staleness <= 1
    calls = list(csv.DictReader((tmp_path / TOOL_CALLS_FILE).open())) if (tmp_path / TOOL_CALLS_FILE).exists() else []
    assert len(calls) == result.tool_calls
    for c in calls:  # whatever it wrote: each call within the turn limit, each with its real latency
        assert 1 <= int(c["turn"]) < agentic.turns.max
        assert float(c["end"]) - float(c["start"]) >= float(c["latency"]) - 1e-6
        assert agentic.tool_latency.low <= float(c["latency"]) <= agentic.tool_latency.high  # type: ignore[operator]


def test_the_shipped_calculator_data_set_is_what_its_script_writes() -> None:
    from runtime import calc_data

    assert Path(CALC).read_text(encoding="utf-8") == calc_data.dataset_text()
    assert len(load_records(CALC, "prompt", "answer")) == calc_data.DATASET_SIZE


PLAN = "traces/data/plans/toy-cpu-moe.json"


def test_agentic_runs_it_cannot_do_are_refused_in_one_line(cli, tools_model: Path) -> None:  # type: ignore[no-untyped-def]
    toy = cli("run", PLAN, "--workload", WORKLOAD, "--in-process", "--steps", "1")
    assert toy.code == 2 and "character tokenizer cannot write a calculator call" in toy.err
    assert len(toy.err.strip().splitlines()) == 1
    vllm = cli("run", PLAN, "--workload", WORKLOAD, "--steps", "1", "--model", str(tools_model), "--dataset", CALC,
               "--engine", "vllm")
    assert vllm.code == 2 and "mixture-of-experts" in vllm.err and len(vllm.err.strip().splitlines()) == 1


@pytest.mark.slow
def test_rlfleet_run_on_ray_runs_the_moe_model_on_agentic_episodes(cli, tools_model: Path,  # type: ignore[no-untyped-def]
                                                                    tmp_path: Path) -> None:
    """The acceptance run: `rlfleet run` on the fake-node Ray cluster, a tiny Qwen3-MoE, calculator episodes."""
    res = cli("run", PLAN, "--workload", WORKLOAD, "--model", str(tools_model), "--dataset", CALC, "--engine", "torch",
              "--steps", "6", "--lr", "1e-3", "--out", str(tmp_path), "--json")
    assert res.code == 0, res.err
    summary = res.json()
    assert summary["executor"] == "ray-local" and summary["engine"] == "torch" and summary["steps"] == 6
    assert summary["samples_trained"] == 6 * 8 * 8 and summary["duplicates_dropped"] == 0
    assert summary["max_staleness"] <= 1
    rows = list(csv.DictReader((tmp_path / TOOL_CALLS_FILE).open())) if (tmp_path / TOOL_CALLS_FILE).exists() else []
    assert len(rows) == summary["tool_calls"]
    assert any("agentic" in note for note in summary["not_applied"])


def test_an_episode_ends_at_its_turn_limit_or_the_models_context(tools_model: Path) -> None:
    from runtime.episodes import Episodes

    tokenizer = load_tokenizer(tools_model)
    prompt = tuple(tokenizer.encode(tokenizer.render("What is 23 * 7?")))
    call = (*tokenizer.encode(f"{CALL_OPEN}23*7{CALL_CLOSE}"), tokenizer.eos_id)
    turn = Completion(0, prompt, call, (-1.0,) * len(call), (0,) * len(call), True)
    quick = SecondsDist(kind="fixed", value=0.01)

    one_turn = Episodes(AgenticRun(max_turns=1, latency=quick), tokenizer, 8, time.time)
    assert one_turn.turn_done(turn, 0) == turn and one_turn.in_flight() == 0  # a call in the last turn is not made
    one_turn.close()

    tight = AgenticRun(max_turns=3, latency=quick, max_context=len(prompt) + len(call) + 8)  # no room for a result
    episodes = Episodes(tight, tokenizer, 8, time.time)
    assert episodes.turn_done(turn, 0) is None and episodes.in_flight() == 1
    episodes.wait(5.0)
    resumed, ended, calls = episodes.collect()
    assert not resumed and ended == [turn] and len(calls) == 1 and calls[0].result == "<result>161</result>"
    episodes.close()

    run = AgenticRun(max_turns=3, latency=LATENCY, seed=1)
    assert run.latency_s(4, 1) == run.latency_s(4, 1) != run.latency_s(4, 2)  # seeded per sample and turn
    assert run.latency_s(4, 1) != AgenticRun(max_turns=3, latency=LATENCY, seed=2).latency_s(4, 1)


@pytest.mark.slow
def test_vllm_engines_run_agentic_episodes(cli, tmp_path_factory: pytest.TempPathFactory,  # type: ignore[no-untyped-def]
                                           tmp_path: Path) -> None:
    """The same episodes on vLLM engines (a dense tiny Qwen2 with the tool's tokens: vLLM on CPU does not
    reload an MoE model's weights, runtime.engine_spec): each turn is a vLLM request of the episode so far."""
    spec = TinySpec(family="qwen2", tools=True, max_positions=TOOL_POSITIONS)
    model = tiny_model(tmp_path_factory.mktemp("tiny-qwen2-tools"), spec)
    res = cli("run", PLAN, "--workload", WORKLOAD, "--model", str(model), "--dataset", CALC, "--engine", "vllm",
              "--steps", "6", "--lr", "1e-3", "--out", str(tmp_path), "--json")
    assert res.code == 0, res.err
    summary = res.json()
    assert summary["engine"] == "vllm" and summary["steps"] == 6 and summary["samples_trained"] == 6 * 8 * 8
    assert summary["duplicates_dropped"] == 0 and summary["max_staleness"] <= 1
    rows = list(csv.DictReader((tmp_path / TOOL_CALLS_FILE).open())) if (tmp_path / TOOL_CALLS_FILE).exists() else []
    assert len(rows) == summary["tool_calls"]
    assert all(float(r["end"]) - float(r["start"]) >= float(r["latency"]) - 1e-6 for r in rows)

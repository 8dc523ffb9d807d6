"""The profiler: measure this device's stage costs with the runtime's own engine, trainer and sync.

What is timed is what a run executes, so a simulation fed these rows predicts a run:
- prefill and decode: `TorchEngine.step()` wall time (forward pass plus sampling). `batch`
  requests of `context` prompt tokens are admitted in one step (a prefill row, tokens = batch x
  context), then `decode_steps` steps each decode one token per row (a decode row per step, at the
  rows' mean context). eos is disabled so no row leaves early and the batch stays `batch`;
- logprob and train: `Trainer.train_step` on a synthetic GRPO batch of `tokens` tokens in sequences
  of `seq_len`, one minibatch, so its two intervals are one proximal forward and one optimizer step
  over `tokens` (the cost model multiplies by the workload's minibatch count);
- sync: `WeightSender.send` from this process to `engines` receiver processes over gloo
  (runtime.sync), between barriers.
Every measurement is repeated and the median kept (a shared machine is noisy); the first pass of
each shape is a warm-up and is discarded. Rows come out in the traces profile-table format
(traces.costmodel.tables.COLUMNS) with source "measured: ...", which the cost model prefers to its
roofline wherever they reach.

On a GPU host `device="cuda"` times the same engine and trainer on the GPU (synchronising before each
clock reading) and skips the sync rows (gloo between CPU processes only). No GPU was available to run
that path here: it is wired, not tested.
"""

from __future__ import annotations

import datetime
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pandas as pd
import torch
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM, PretrainedConfig, Qwen2Config

from runtime.engine import Request, TorchEngine
from runtime.sync import SyncGroup, WeightReceiver, WeightSender
from runtime.trainer import Rollout, TrainConfig, Trainer
from traces import ModelSpec, SpecError
from traces.costmodel.tables import COLUMNS

NO_EOS = -1  # an id the sampler never returns: rows run to max_new_tokens


@dataclass(frozen=True)
class Grid:
    """The shapes to measure. Defaults suit a tiny model on a CPU core (seconds, not minutes)."""

    batches: tuple[int, ...] = (1, 4, 16, 64, 256)
    contexts: tuple[int, ...] = (4, 16, 48)
    decode_steps: int = 3
    train_tokens: tuple[int, ...] = (256, 1024, 4096)
    seq_len: int = 8
    sync_engines: tuple[int, ...] = (1, 2)
    repeats: int = 3

    def check(self) -> None:
        for name in ("batches", "contexts", "train_tokens", "sync_engines"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise SpecError(f"profile grid: {name.replace('_', '-')} needs positive integers, got {values}")
        for name in ("decode_steps", "seq_len", "repeats"):
            if getattr(self, name) < 1:
                raise SpecError(f"profile grid: {name.replace('_', '-')} must be at least 1")
        if min(self.train_tokens) < self.seq_len:
            raise SpecError(f"profile grid: train tokens {min(self.train_tokens)} is less than one sequence "
                            f"(seq-len {self.seq_len}); raise --train-tokens or lower --seq-len")

    @property
    def points(self) -> int:
        """Measurements to make, for a progress bar."""
        return len(self.batches) * len(self.contexts) + len(self.train_tokens) + len(self.sync_engines)


def hf_config(spec: ModelSpec, max_positions: int) -> PretrainedConfig:
    """A transformers config with the catalog model's shapes (Qwen2 where it has qkv biases)."""
    if not spec.gated_mlp or spec.qk_norm:
        raise SpecError(f"rlfleet profile builds Llama/Qwen2-shaped models; {spec.name} "
                        f"({'GELU MLP' if not spec.gated_mlp else 'qk-norm'}) is not one")
    kw = {"vocab_size": spec.vocab, "hidden_size": spec.hidden, "intermediate_size": spec.intermediate,
          "num_hidden_layers": spec.layers, "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads,
          "max_position_embeddings": max_positions, "tie_word_embeddings": spec.tied_embeddings,
          "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    if spec.head_dim is not None:
        kw["head_dim"] = spec.head_dim
    return Qwen2Config(**kw) if spec.qkv_bias else LlamaConfig(**kw)


def build(spec: ModelSpec, grid: Grid, seed: int = 0) -> torch.nn.Module:
    """Random weights in the catalog's dtype (float32 where it says 4 bytes per parameter)."""
    longest = max(max(grid.contexts) + grid.decode_steps + 1, grid.seq_len)
    config = hf_config(spec, max(64, longest))
    dtype = torch.float32 if spec.bytes_per_param >= 4 else torch.bfloat16
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config) if isinstance(config, LlamaConfig) else _qwen2(config)
    return model.to(dtype).eval()


def _qwen2(config: PretrainedConfig) -> torch.nn.Module:
    from transformers import Qwen2ForCausalLM

    return Qwen2ForCausalLM(config)


def profile(spec: ModelSpec, gpu_type: str, grid: Grid | None = None, device: str = "cpu",
            tick: Callable[[], None] = lambda: None) -> pd.DataFrame:
    """Measure every stage over `grid`; rows in the profile-table format, tagged as measured."""
    grid = grid or Grid()
    grid.check()
    dev = _device(device)
    model = build(spec, grid)
    source = (f"measured: rlfleet profile on {platform.node() or 'this host'} ({platform.machine()}), "
              f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {datetime.date.today()}")
    rows: list[dict[str, object]] = []
    base = {"gpu_type": gpu_type, "model": spec.name, "tp": 1, "pp": 1, "dp": 1, "batch": 0, "context": 0,
            "tokens": 0, "source": source}
    for row in _engine_rows(model, spec, grid, tick, dev):
        rows.append({**base, **row})
    for row in _trainer_rows(model, spec, grid, tick, dev):
        rows.append({**base, **row})
    if dev.type == "cpu":  # sync is timed over gloo between CPU processes; NCCL timing is not wired
        for row in _sync_rows(model, grid, tick):
            rows.append({**base, **row})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _device(name: str) -> torch.device:
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise SpecError(f"--device {name!r} is not a torch device; use cpu or cuda") from None
    if dev.type not in ("cpu", "cuda"):
        raise SpecError(f"--device {name!r}: profile on cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SpecError(f"--device {name!r}: no CUDA device here; profile with --device cpu")
    return dev


def _sync(dev: torch.device) -> None:
    """Wall times must include the kernels: CUDA launches return before they finish."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


# ---- engine ------------------------------------------------------------------------------------
def _engine_rows(model: torch.nn.Module, spec: ModelSpec, grid: Grid, tick: Callable[[], None],
                 dev: torch.device) -> Iterator[dict[str, object]]:
    gen = torch.Generator().manual_seed(0)
    for batch in grid.batches:
        for context in grid.contexts:
            prefill: list[float] = []
            decode: list[list[float]] = []
            for _ in range(grid.repeats + 1):  # the first pass warms up this shape
                p, d = _engine_pass(model, spec, batch, context, grid.decode_steps, gen, dev)
                prefill.append(p)
                decode.append(d)
            yield {"stage": "prefill", "batch": batch, "context": context, "tokens": batch * context,
                   "seconds": statistics.median(prefill[1:])}
            for j in range(grid.decode_steps):
                # the j-th decode step feeds token context + j + 1 after context + j cached ones
                yield {"stage": "decode", "batch": batch, "context": context + j + 1,
                       "seconds": statistics.median(run[j] for run in decode[1:])}
            tick()


def _engine_pass(model: torch.nn.Module, spec: ModelSpec, batch: int, context: int, steps: int,
                 gen: torch.Generator, dev: torch.device) -> tuple[float, list[float]]:
    """One admission of `batch` prompts, then `steps` decode iterations: their step() wall times."""
    engine = TorchEngine(model, eos_id=NO_EOS, pad_id=0, max_batch=batch, seed=1, device=dev)
    prompts = torch.randint(3, spec.vocab, (batch, context), generator=gen).tolist()
    engine.submit([Request(i, tuple(p), steps + 1) for i, p in enumerate(prompts)])
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        engine.step()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return times[0], times[1:]


# ---- trainer -----------------------------------------------------------------------------------
def _trainer_rows(model: torch.nn.Module, spec: ModelSpec, grid: Grid, tick: Callable[[], None],
                  dev: torch.device) -> Iterator[dict[str, object]]:
    # the trainer's own interval clock, synchronised on a GPU so an interval ends when its kernels do
    trainer = Trainer(model, pad_id=0, config=TrainConfig(minibatches=1), device=dev,
                      clock=lambda: (_sync(dev), time.perf_counter())[1])
    gen = torch.Generator().manual_seed(1)
    for tokens in grid.train_tokens:
        batch = _synthetic_batch(spec, tokens // grid.seq_len, grid.seq_len, gen)
        logprob: list[float] = []
        train: list[float] = []
        for _ in range(grid.repeats + 1):
            trainer.train_step(batch)
            spans = dict((name, end - start) for name, start, end in trainer.last_intervals)
            logprob.append(spans["logprob"])
            train.append(spans["train"])
        n = (tokens // grid.seq_len) * grid.seq_len
        yield {"stage": "logprob", "tokens": n, "seconds": statistics.median(logprob[1:])}
        yield {"stage": "train", "tokens": n, "seconds": statistics.median(train[1:])}
        tick()


def _synthetic_batch(spec: ModelSpec, samples: int, seq_len: int, gen: torch.Generator) -> list[Rollout]:
    """GRPO groups of 8 with mixed rewards (non-zero advantages), half prompt and half response."""
    prompt_len = max(1, seq_len // 2)
    response_len = max(1, seq_len - prompt_len)
    ids = torch.randint(3, spec.vocab, (samples, prompt_len + response_len), generator=gen).tolist()
    return [Rollout(tuple(row[:prompt_len]), tuple(row[prompt_len:]), (-1.0,) * response_len, (0,) * response_len,
                    float(i % 2), i // 8) for i, row in enumerate(ids)]


# ---- sync --------------------------------------------------------------------------------------
def _sync_rows(model: torch.nn.Module, grid: Grid, tick: Callable[[], None]) -> Iterator[dict[str, object]]:
    state = {k: v.detach() for k, v in model.state_dict().items()}
    shapes = [(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in state.items()]
    for engines in grid.sync_engines:
        seconds = _time_sync(state, shapes, engines, grid.repeats)
        yield {"stage": "sync", "batch": engines, "seconds": seconds}
        tick()


def _time_sync(state: dict[str, torch.Tensor], shapes: list[tuple[str, tuple[int, ...], str]], engines: int,
               repeats: int) -> float:
    """Median seconds of one `WeightSender.send` to `engines` receiver processes on loopback."""
    store = SyncGroup.host_store("127.0.0.1", engines + 1)
    ctx = mp.get_context("spawn")  # a fork would inherit this process's threads and torch state
    procs = [ctx.Process(target=_receiver, args=(store.port, r, engines + 1, shapes, repeats + 1), daemon=True)
             for r in range(1, engines + 1)]
    for p in procs:
        p.start()
    try:
        group = SyncGroup("", 0, 0, engines + 1, store=store)
        sender = WeightSender(group)
        times = []
        for version in range(repeats + 1):
            group.pg.barrier().wait()
            t0 = time.perf_counter()
            sender.send(state, version)
            group.pg.barrier().wait()
            times.append(time.perf_counter() - t0)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return statistics.median(times[1:])


def _receiver(port: int, rank: int, world: int, shapes: list[tuple[str, tuple[int, ...], str]], rounds: int) -> None:
    torch.set_num_threads(1)
    template = {k: torch.empty(shape, dtype=getattr(torch, dtype)) for k, shape, dtype in shapes}
    group = SyncGroup("127.0.0.1", port, rank, world)
    receiver = WeightReceiver(group, template)
    for _ in range(rounds):
        group.pg.barrier().wait()
        receiver.receive()
        group.pg.barrier().wait()

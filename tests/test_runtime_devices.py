"""Device and backend choices of the runtime: CPU/gloo run here; CUDA/NCCL are refused clearly without a GPU."""

from __future__ import annotations

import pytest
import torch

from runtime.engine import Request, TorchEngine
from runtime.model import CharTokenizer, build_model, tiny_llama_config
from runtime.sync import SyncGroup


def test_engine_runs_on_an_explicit_cpu_device() -> None:
    tok = CharTokenizer()
    model = build_model(tiny_llama_config(tok))
    engine = TorchEngine(model, tok.eos_id, tok.pad_id, device="cpu", seed=3)
    engine.submit([Request(0, tuple(tok.encode("1+2=")), 3)])
    done = []
    while not done:
        done = engine.step()
    assert engine.device == torch.device("cpu") and len(done[0].tokens) == len(done[0].logprobs) >= 1
    assert all(p.device.type == "cpu" for p in engine.model.parameters())


def test_sync_backend_choice_is_checked() -> None:
    store = SyncGroup.host_store("127.0.0.1", 1)
    with pytest.raises(ValueError, match="gloo"):
        SyncGroup("", 0, 0, 1, store=store, backend="mpi")
    if not torch.cuda.is_available():  # this machine: NCCL is refused with the reason, not a crash later
        with pytest.raises(RuntimeError, match="CUDA"):
            SyncGroup("", 0, 0, 1, store=store, backend="nccl")
    group = SyncGroup("", 0, 0, 1, store=store)  # gloo, a group of one
    assert group.device == torch.device("cpu")

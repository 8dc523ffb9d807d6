"""The vLLM worker extension: new weights reach the model in place, inside vLLM's worker process.

vLLM mixes `WeightSyncExtension` into its worker class (`LLM(worker_extension_cls=...)`); the engine
calls its methods on every worker through `collective_rpc`. Only control messages travel as RPC
arguments (an address, a version, a file path): the weights themselves come over the runtime's
sync group (`runtime.sync.WeightReceiver`, the worker is one rank) or from a safetensors file,
because pickling hundreds of MB through vLLM's RPC queue would copy them twice more and block it.

Weights go in through vLLM's layerwise reload helpers (`initialize_layerwise_reload`, the model's
own `load_weights` with Hugging Face names, `finalize_layerwise_reload`): they restore each layer
to its checkpoint form, let the model's loaders fuse q/k/v and gate/up as at start-up, re-run any
post-load processing (weight repacking on CPU), and copy the result into the tensors the running
engine already holds, so KV caches and compiled graphs keep pointing at live storage. On CPU the
linear layers keep packed copies of their weights, which only that processing rebuilds: assigning
to parameters directly would leave the model computing with the old weights.

This module imports vLLM lazily: it is imported by vLLM's workers, never by the rest of the runtime.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from runtime.settings import SYNC_TIMEOUT_S
from runtime.sync import DEFAULT_BUCKET_BYTES, SyncGroup, WeightReceiver

# Hugging Face names of the tied pair in Llama-family checkpoints (Llama, Qwen2, Mistral)
EMBEDDING, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def hf_template(hf_config: Any, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The trainer's state-dict layout (names, shapes, dtype, order) for this config, on the meta device.

    The trainer holds the Hugging Face model class, so its state dict (tied weights included) is what
    the sync group carries; building the same class on `meta` gives that layout without memory.
    """
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    return model.state_dict()


class WeightSyncExtension:
    """Methods added to vLLM's worker (`self` is the worker); names prefixed so they clash with none of its own."""

    _rlfleet_receiver: WeightReceiver | None = None
    _rlfleet_received: tuple[dict[str, torch.Tensor], int] | None = None

    def rlfleet_join_sync(self, host: str, port: int, rank: int, world_size: int, dtype: str,
                          bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = SYNC_TIMEOUT_S) -> None:
        """Join the trainer's sync group as `rank` + this worker's rank in vLLM (tensor-parallel workers
        each receive the full weights: vLLM's loaders cut their shards); blocks until every rank joins."""
        template = hf_template(self.model_config.hf_config, getattr(torch, dtype))  # type: ignore[attr-defined]
        self._rlfleet_receiver = None  # a previous group, broken by a dead rank, is dropped
        group = SyncGroup(host, port, rank + self.rank, world_size, timeout_s=timeout_s)  # type: ignore[attr-defined]
        self._rlfleet_receiver = WeightReceiver(group, template, bucket_bytes)

    def rlfleet_receive(self) -> int:
        """Take part in one broadcast from the trainer; the weights wait in the receiver until applied."""
        if self._rlfleet_receiver is None:
            raise RuntimeError("rlfleet_join_sync first")
        self._rlfleet_received = self._rlfleet_receiver.receive()
        return self._rlfleet_received[1]

    def rlfleet_apply_received(self) -> int:
        """Load the weights of the last `rlfleet_receive` into the model; returns their version."""
        if self._rlfleet_received is None:
            raise RuntimeError("no weights received")
        state, version = self._rlfleet_received
        self._rlfleet_received = None  # the receiver overwrites these tensors at its next receive
        self._rlfleet_reload(state.items())
        return version

    def rlfleet_load_file(self, path: str) -> None:
        """Load a safetensors file of Hugging Face-named weights into the model."""
        from safetensors.torch import load_file

        self._rlfleet_reload(load_file(path).items())

    def _rlfleet_reload(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        model = self.model_runner.model  # type: ignore[attr-defined]
        tied = bool(getattr(self.model_config.hf_config, "tie_word_embeddings", False))  # type: ignore[attr-defined]
        initialize_layerwise_reload(model)
        model.load_weights(_with_tied_head(weights) if tied else weights)
        finalize_layerwise_reload(model, self.model_config)  # type: ignore[attr-defined]


def _with_tied_head(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
    """The weights, plus `lm_head.weight` (the embedding) when they lack it.

    A reload unties the head: it comes back as a layer of its own, and on CPU its linear kernel keeps
    a packed copy of the old weights unless the head itself is loaded (measured: the samples then
    follow the old head). A safetensors file, or a state dict that dropped the alias, lacks it.
    """
    embedding: torch.Tensor | None = None
    has_head = False
    for name, tensor in weights:
        if name == EMBEDDING:
            embedding = tensor
        has_head = has_head or name == HEAD
        yield name, tensor
    if embedding is not None and not has_head:
        yield HEAD, embedding

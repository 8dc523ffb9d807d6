"""Weight sync: trainer rank 0 broadcasts its state dict, with the version, to every engine over gloo.

The group is a `ProcessGroupGloo` of its own (store + ranks), not torch's default process group:
the trainer's ranks keep the default group for DDP/FSDP, and an engine may live in a process that
has one of its own. Rank 0 (the trainer) hosts the TCP store on a free port; engines are ranks
1..n. gloo carries CPU tensors; on GPUs the same protocol runs over NCCL (`backend="nccl"`,
untested here: no GPU was available).

Protocol, one `send` matched by one `receive` on every engine:
1. a header of three int64: version, layout fingerprint, total bytes. Both sides derive the layout
   (names, shapes, dtypes, in state-dict order) from their own copy of the model, so only bytes
   travel; the fingerprint catches a mismatch before any weight is misread;
2. the tensors as raw bytes, in buckets of about `bucket_bytes`: small tensors are packed together
   (one broadcast per bucket rather than per tensor: gloo's per-call latency dominates small
   tensors); a bucket of one tensor (any tensor of a bucket's size or more) goes straight from
   (into) that tensor's own storage, without a copy.
   Broadcasts are asynchronous: lone tensors are all posted at once, packing (unpacking) a bucket
   overlaps the transfer of the one before (after) it, in two alternating buffers.
Bytes, not values: what arrives is bitwise what the trainer holds, whatever the dtype.
"""

from __future__ import annotations

import datetime
import socket
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

# 1 MB: tensors of 1 MB and more then go alone, uncopied; measured on 2 cores, 138 MB to 2 engines: 0.80-0.84x
# of a bare broadcast at 1 MB, 0.81 at 4 MB, 0.68 at 16 MB (packing copies dominate)
DEFAULT_BUCKET_BYTES = 1 << 20
HEADER_LEN = 3  # version, fingerprint, total bytes


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """The state dict's tensors in order, cut into buckets: (first, end) index ranges."""

    tensors: tuple[TensorSpec, ...]
    buckets: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, state_dict: Mapping[str, torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Layout:
        specs = tuple(TensorSpec(k, tuple(v.shape), v.dtype, v.numel() * v.element_size())
                      for k, v in state_dict.items())
        buckets: list[tuple[int, int]] = []
        first, size = 0, 0
        for i, spec in enumerate(specs):
            if size and size + spec.nbytes > bucket_bytes:  # close the bucket before it overflows
                buckets.append((first, i))
                first, size = i, 0
            size += spec.nbytes
        if first < len(specs):
            buckets.append((first, len(specs)))
        return cls(specs, tuple(buckets))

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.tensors)

    @property
    def fingerprint(self) -> int:
        text = ";".join(f"{s.name}:{s.shape}:{s.dtype}" for s in self.tensors)
        return zlib.crc32(text.encode())

    def bucket_bytes(self, index: int) -> int:
        first, end = self.buckets[index]
        return sum(s.nbytes for s in self.tensors[first:end])


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a tensor's storage (a copy only if it is not contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


class SyncGroup:
    """A group of `world_size` ranks on its own TCP store; rank 0 hosts the store.

    `backend` "gloo" moves CPU tensors; "nccl" moves tensors on `device` (default the current
    CUDA device) GPU to GPU. Only gloo has run here (no GPU was available): the NCCL path uses
    the same protocol with every buffer on the device, and is untested.
    """

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float = 300.0,
                 store: dist.TCPStore | None = None, backend: str = "gloo", device: str | None = None) -> None:
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size = rank, world_size
        self.store = store or dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
        self.device, self.pg = _process_group(backend, device, self.store, rank, world_size, timeout)

    @staticmethod
    def host_store(host: str = "127.0.0.1", world_size: int = 1, timeout_s: float = 300.0) -> dist.TCPStore:
        """Rank 0's store on a free port of `host` (read it back from `.port`), listening there only.

        torch's TCPStore binds every interface whatever host it is given (pytorch issue 173909); a
        socket bound here and handed over (`master_listen_fd`) keeps it on `host` (the node's Ray
        address; 127.0.0.1 in tests and local runs)."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, 0), family=family)
        port = sock.getsockname()[1]
        # detach: the store owns the descriptor from now on, Python must never close it under it
        return dist.TCPStore(host, port, world_size, is_master=True, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=timeout_s), master_listen_fd=sock.detach())

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> dist.Work:
        """Asynchronous broadcast of `tensor` from rank `src`; call `.wait()` on the result."""
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        return self.pg.broadcast([tensor], opts)


def _process_group(backend: str, device: str | None, store: dist.TCPStore, rank: int, world_size: int,
                   timeout: datetime.timedelta) -> tuple[torch.device, dist.ProcessGroup]:
    """The device buffers live on and the group; both block until every rank has joined."""
    if backend == "gloo":
        return torch.device("cpu"), dist.ProcessGroupGloo(store, rank, world_size, timeout)
    if backend != "nccl":
        raise ValueError(f"sync backend {backend!r}: use gloo (CPU tensors) or nccl (CUDA tensors)")
    if not torch.cuda.is_available() or not hasattr(dist, "ProcessGroupNCCL"):
        raise RuntimeError("sync backend nccl needs a CUDA device and a CUDA build of torch; use gloo on CPU")
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return torch.device(device or f"cuda:{torch.cuda.current_device()}"), dist.ProcessGroupNCCL(
        store, rank, world_size, opts)


def _header(version: int, layout: Layout, device: torch.device) -> torch.Tensor:
    return torch.tensor([version, layout.fingerprint, layout.total_bytes], dtype=torch.int64, device=device)


class WeightSender:
    """Trainer rank 0's side: `send(state_dict, version)`, matched by `WeightReceiver.receive` on each engine."""

    def __init__(self, group: SyncGroup, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        if group.rank != 0:
            raise ValueError(f"weights are sent from rank 0, not {group.rank}")
        self.group, self.bucket_bytes = group, bucket_bytes
        self._layout: Layout | None = None
        self._buffers: list[torch.Tensor] = []

    def send(self, state_dict: Mapping[str, torch.Tensor], version: int) -> int:
        """Broadcast every tensor's bytes and the version; returns the bytes sent (header excluded)."""
        layout = self._layout_for(state_dict)
        self.group.broadcast(_header(version, layout, self.group.device)).wait()
        tensors = list(state_dict.values())
        works: list[dist.Work] = []
        buffer_work: list[dist.Work | None] = [None, None]  # the last broadcast out of each packing buffer
        packed = 0  # packed buckets so far: they alternate between the two buffers
        for first, end in layout.buckets:
            if end - first == 1:  # a lone tensor goes from its own storage: no copy, nothing to wait for
                works.append(self.group.broadcast(as_bytes(tensors[first])))
                continue
            slot, packed = packed % 2, packed + 1
            if buffer_work[slot] is not None:  # its last bucket must be out before the buffer is refilled
                buffer_work[slot].wait()  # type: ignore[union-attr]
            # packing here overlaps the broadcasts already posted
            buffer_work[slot] = self.group.broadcast(self._pack(tensors[first:end], self._buffers[slot]))
            works.append(buffer_work[slot])  # type: ignore[arg-type]
        for work in works:
            work.wait()
        return layout.total_bytes

    def _layout_for(self, state_dict: Mapping[str, torch.Tensor]) -> Layout:
        layout = Layout.of(state_dict, self.bucket_bytes)
        if layout != self._layout:  # the same model every step: buffers are allocated once
            self._layout = layout
            size = max((layout.bucket_bytes(i) for i in range(len(layout.buckets))), default=0)
            self._buffers = [torch.empty(size, dtype=torch.uint8, device=self.group.device) for _ in range(2)]
        return layout

    @staticmethod
    def _pack(tensors: list[torch.Tensor], buffer: torch.Tensor) -> torch.Tensor:
        offset = 0
        for t in tensors:
            raw = as_bytes(t)
            buffer[offset:offset + raw.numel()].copy_(raw)
            offset += raw.numel()
        return buffer[:offset]


class WeightReceiver:
    """An engine's side: the layout comes from the engine's own state dict (`template`), values from rank 0.

    Weights land in tensors the receiver allocates once and overwrites at every `receive` (fresh
    allocations each time cost page faults comparable to the transfer itself: measured 0.7x of a
    bare broadcast with them). Load or copy what `receive` returns before the next one.
    """

    def __init__(self, group: SyncGroup, template: Mapping[str, torch.Tensor],
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        if group.rank == 0:
            raise ValueError("rank 0 sends the weights; receivers are ranks 1..n")
        self.group = group
        self.layout = Layout.of(template, bucket_bytes)
        device = group.device
        self._state = {s.name: torch.empty(s.shape, dtype=s.dtype, device=device) for s in self.layout.tensors}
        size = max((self.layout.bucket_bytes(i) for i in range(len(self.layout.buckets))), default=0)
        self._buffers = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(2)]

    def receive(self) -> tuple[dict[str, torch.Tensor], int]:
        """Block until rank 0 sends; returns the weights (valid until the next `receive`) and their version."""
        header = torch.zeros(HEADER_LEN, dtype=torch.int64, device=self.group.device)
        self.group.broadcast(header).wait()
        version, fingerprint, total = (int(x) for x in header)
        if (fingerprint, total) != (self.layout.fingerprint, self.layout.total_bytes):
            raise RuntimeError(f"weight layout mismatch: sender has fingerprint {fingerprint} and {total} bytes, "
                               f"this engine {self.layout.fingerprint} and {self.layout.total_bytes}; "
                               "trainer and engines must hold the same model")
        # lone tensors are received in place and can all be posted at once; a packed bucket is unpacked
        # only after the next one is posted, so copying out overlaps the transfer
        works: list[dist.Work] = []
        pending: tuple[dist.Work, int, torch.Tensor] | None = None
        packed = 0  # packed buckets so far: they alternate between the two buffers
        for i, (first, end) in enumerate(self.layout.buckets):
            if end - first == 1:
                works.append(self.group.broadcast(as_bytes(self._state[self.layout.tensors[first].name])))
                continue
            buffer = self._buffers[packed % 2][:self.layout.bucket_bytes(i)]
            packed += 1
            work = self.group.broadcast(buffer)
            if pending is not None:  # the previous packed bucket, in the other buffer
                self._unpack(*pending)
            pending = (work, i, buffer)
        if pending is not None:
            self._unpack(*pending)
        for work in works:
            work.wait()
        return dict(self._state), version

    def _unpack(self, work: dist.Work, index: int, buffer: torch.Tensor) -> None:
        """Wait for packed bucket `index`, then copy each tensor's bytes out of its buffer."""
        work.wait()
        first, end = self.layout.buckets[index]
        offset = 0
        for spec in self.layout.tensors[first:end]:
            as_bytes(self._state[spec.name]).copy_(buffer[offset:offset + spec.nbytes])
            offset += spec.nbytes

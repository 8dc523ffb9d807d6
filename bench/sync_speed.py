"""Weight-sync speed: the runtime's bucketed send/receive vs a bare gloo broadcast of the same bytes.

One sender (rank 0, the trainer) and `--engines` receivers, each its own process, in one gloo group
on 127.0.0.1 (runtime.sync.SyncGroup). The state dict has a Llama's shapes (embedding, per-layer
attention and MLP matrices, small norm vectors), so bucketing of small tensors is exercised. Each
round times, on rank 0 between barriers, (a) `WeightSender.send` matched by `WeightReceiver.receive`
(which also hands every engine fresh tensors), and (b) one bare broadcast of a flat tensor of the
same byte count into a preallocated buffer. Rounds alternate the two; the best round of each is kept
(a shared 2-core machine makes the median noisy). Prints both rates and the ratio (goal >= 0.8).

Usage: python bench/sync_speed.py [--engines 2] [--hidden 768] [--layers 4] [--rounds 10] [--bucket-mb 1]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.multiprocessing as mp

from runtime.sync import SyncGroup, WeightReceiver, WeightSender


def llama_like(hidden: int, layers: int, vocab: int = 8192, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    inter = hidden * 8 // 3
    sd = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + f"self_attn.{name}.weight"] = torch.randn(hidden, hidden, generator=g)
        sd[p + "mlp.gate_proj.weight"] = torch.randn(inter, hidden, generator=g)
        sd[p + "mlp.up_proj.weight"] = torch.randn(inter, hidden, generator=g)
        sd[p + "mlp.down_proj.weight"] = torch.randn(hidden, inter, generator=g)
        sd[p + "input_layernorm.weight"] = torch.randn(hidden, generator=g)
        sd[p + "post_attention_layernorm.weight"] = torch.randn(hidden, generator=g)
    sd["model.norm.weight"] = torch.randn(hidden, generator=g)
    return sd


def run_rank(rank: int, port: int, args: argparse.Namespace, store: object | None = None) -> dict[str, list[float]]:
    """One rank's rounds; rank 0 (which hosts `store`) returns the timings and the byte count."""
    torch.set_num_threads(1)
    world = args.engines + 1
    group = SyncGroup("127.0.0.1", port, rank, world, store=store)  # type: ignore[arg-type]
    sd = llama_like(args.hidden, args.layers)
    total = sum(t.numel() * t.element_size() for t in sd.values())
    flat = torch.zeros(total, dtype=torch.uint8)
    if rank == 0:
        flat.random_(0, 256)
    bucket = args.bucket_mb << 20
    sender = WeightSender(group, bucket) if rank == 0 else None
    receiver = WeightReceiver(group, sd, bucket) if rank else None
    times: dict[str, list[float]] = {"sync": [], "bare": [], "bytes": [float(total)]}
    for r in range(args.rounds + 1):  # round 0 warms up connections and buffers
        for kind in (("sync", "bare") if r % 2 else ("bare", "sync")):
            group.pg.barrier().wait()
            t0 = time.perf_counter()
            if kind == "bare":
                group.broadcast(flat).wait()
            elif sender is not None:
                sender.send(sd, r)
            else:
                assert receiver is not None
                _, version = receiver.receive()
                assert version == r
            group.pg.barrier().wait()
            if r:
                times[kind].append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--bucket-mb", type=int, default=1)
    args = ap.parse_args()
    store = SyncGroup.host_store("127.0.0.1", args.engines + 1)  # rank 0 here: the port is known before spawning
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=run_rank, args=(r, store.port, args)) for r in range(1, args.engines + 1)]
    for p in procs:
        p.start()
    times = run_rank(0, store.port, args, store)
    for p in procs:
        p.join()
    total = times["bytes"][0]
    sync, bare = min(times["sync"]), min(times["bare"])
    print(f"{total / 1e6:.1f} MB to {args.engines} engines, bucket {args.bucket_mb} MB, best of {args.rounds} rounds")
    print(f"runtime sync  : {total / sync / 1e6:8.1f} MB/s ({sync * 1e3:.1f} ms)")
    print(f"bare broadcast: {total / bare / 1e6:8.1f} MB/s ({bare * 1e3:.1f} ms)")
    print(f"ratio sync / bare: {bare / sync:.2f} (goal >= 0.8)")


if __name__ == "__main__":
    main()

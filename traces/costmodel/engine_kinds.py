"""Engines without a scheduler: a compiled loop that replays one CUDA graph per generated token.

The fitted Efficiency.decode_overhead_s is that of serving engines (vLLM, SGLang, TensorRT-LLM,
LMDeploy): each iteration schedules the batch, samples, detokenises and updates its block tables
in Python or C++. gpt-fast (github.com/pytorch-labs/gpt-fast, generate.py) runs one request in a
loop over a `torch.compile(mode="reduce-overhead")` forward, i.e. a CUDA-graph replay with no
scheduler, so its fixed cost per token is its own field (Efficiency.graph_loop_decode_overhead_s).
A calibration row's `engine` column names the engine; the rule lives here only.
"""

from __future__ import annotations

from dataclasses import replace

from traces.costmodel.efficiency import Efficiency

GRAPH_LOOP_ENGINES = ("gpt-fast",)


def is_graph_loop(engine: str) -> bool:
    """Whether `engine` (a calibration row's engine column) is a scheduler-free CUDA-graph loop."""
    return engine.strip().lower().startswith(GRAPH_LOOP_ENGINES)


def engine_efficiency(eff: Efficiency, engine: str) -> Efficiency:
    """`eff` as `engine` runs: a graph loop's own fixed decode cost and no per-sequence bookkeeping
    (it serves one request); any other engine as fitted."""
    if not is_graph_loop(engine):
        return eff
    return replace(eff, decode_overhead_s=eff.graph_loop_decode_overhead_s, decode_overhead_per_seq_s=0.0)

"""The token-level reference: one simulation event per decode iteration, one object per sample.

`simulate(..., token_level=True)` runs this; the fast path (sim.engine, sim.fleet, sim.controller)
must agree with it. It is kept plain on purpose: it imports only traces (the capacity rule and the
routing policy) and the shared trainer and recorder, and is handed the decode and prefill tables.
So the step's mechanisms hold in it as in the fast path: a fractional staleness bound, streaming
chunks and dynamic sampling's drops through the capacity ledger (traces.capacity), decode without
CUDA graphs through the tables, colocated offload through the trainer's hand-over time and the
KV cache it is given. Which completion of an instant is surplus under over-generation follows
each path's delivery order, so there the two may train different ids (not their number).
"""

from sim.reference.controller import Controller
from sim.reference.engine import Engine
from sim.reference.sample import Sample
from sim.reference.tool_calls import ToolCalls

__all__ = ["Controller", "Engine", "Sample", "ToolCalls"]

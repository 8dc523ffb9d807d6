"""The token-level reference: one simulation event per decode iteration, one object per sample.

`simulate(..., token_level=True)` runs this; the fast path (sim.engine, sim.fleet, sim.controller)
must agree with it. It is kept plain on purpose: it imports only traces (the capacity rule and the
routing policy) and the shared trainer and recorder, and is handed the decode and prefill tables.
"""

from sim.reference.controller import Controller
from sim.reference.engine import Engine
from sim.reference.sample import Sample

__all__ = ["Controller", "Engine", "Sample"]

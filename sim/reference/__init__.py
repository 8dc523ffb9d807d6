"""The token-level reference: one simulation event per decode iteration, one object per sample.

`simulate(..., token_level=True)` runs this; the fast path (sim.engine, sim.controller) must agree
with it. It is kept plain on purpose: it shares only the cost tables, trainer and recorder.
"""

from sim.reference.controller import Controller
from sim.reference.engine import Engine
from sim.reference.sample import Sample

__all__ = ["Controller", "Engine", "Sample"]

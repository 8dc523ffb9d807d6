"""sim: a simpy discrete-event simulation of one deployment plan running an RL job."""

from sim.result import SimResult
from sim.simulate import check_plan, simulate

__all__ = ["SimResult", "check_plan", "simulate"]

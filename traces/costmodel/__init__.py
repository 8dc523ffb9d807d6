"""Cost model: profiled tables where measured, roofline elsewhere; every answer names its source."""

from traces.costmodel.efficiency import DEFAULT_EFFICIENCY, Efficiency
from traces.costmodel.model import PROFILE, ROOFLINE, SCALED, CostModel, Estimate, GenerationRate
from traces.costmodel.tables import COLUMNS, ProfileTable

__all__ = [
    "COLUMNS",
    "DEFAULT_EFFICIENCY",
    "PROFILE",
    "ROOFLINE",
    "SCALED",
    "CostModel",
    "Efficiency",
    "Estimate",
    "GenerationRate",
    "ProfileTable",
]

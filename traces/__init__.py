"""traces: what we know. Hardware catalog, model presets, workloads, plans, the cost model."""

from traces.cluster import Cluster, NodeGroup, example_cluster, example_clusters, load_cluster
from traces.costmodel import CostModel, Efficiency, Estimate, ProfileTable
from traces.errors import SpecError
from traces.hardware import GpuType, get_gpu, gpu_names
from traces.lengths import LengthDist
from traces.models import ModelSpec, get_model, model_names
from traces.plan import Plan, RolloutGroup, TrainerGroup, load_plan
from traces.workload import Workload, example_workload, example_workloads, load_workload

__all__ = [
    "Cluster",
    "CostModel",
    "Efficiency",
    "Estimate",
    "GpuType",
    "LengthDist",
    "ModelSpec",
    "NodeGroup",
    "Plan",
    "ProfileTable",
    "RolloutGroup",
    "SpecError",
    "TrainerGroup",
    "Workload",
    "example_cluster",
    "example_clusters",
    "example_workload",
    "example_workloads",
    "get_gpu",
    "get_model",
    "gpu_names",
    "load_cluster",
    "load_plan",
    "load_workload",
    "model_names",
]

"""TF-free discrete-event cluster simulator that runs the engine's policy objects."""

from .simulator import SimResult, Simulator
from .speeds import CpuTrace, SpeedModel, load_cpu_traces

__all__ = ["CpuTrace", "SimResult", "Simulator", "SpeedModel", "load_cpu_traces"]

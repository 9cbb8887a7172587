"""TF-free discrete-event cluster simulator that runs the engine's policy objects."""

from .simulator import SimResult, Simulator
from .monitor import SimMonitor
from .speeds import SpeedModel
from ..base.traces import CpuTrace, TraceError, TraceRangeError, load_cpu_traces

__all__ = ["CpuTrace", "SimMonitor", "SimResult", "Simulator", "SpeedModel", "TraceError", "TraceRangeError",
           "load_cpu_traces"]

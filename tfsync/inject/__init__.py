"""Straggler injection for experiments and tests: real competing processes
(``CpuBurner``), the heterogeneity levels of LB-BSP §5.2 (``level_plan``), and
trace-driven load (``TraceDriver``)."""

from .burner import CpuBurner
from .levels import LEVELS, BurnSpec, level_plan, spec_for_share
from .trace import TraceDriver, load_trace_csv

__all__ = ["BurnSpec", "CpuBurner", "LEVELS", "TraceDriver", "level_plan", "load_trace_csv",
           "spec_for_share"]

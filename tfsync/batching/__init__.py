"""LB-BSP batch-size solvers (LB-BSP §3): the CPU rule (sizes proportional to
predicted speeds; the affine rule where part of a step does not shrink with the
batch), the GPU rule (a linear program over profiled compute-time lines),
and hysteresis against churn. Plain functions on numbers; no TensorFlow."""

from .apportion import affine_rule, cpu_rule, round_to_total, water_fill
from .gpu import GpuProfile, gpu_rule, predicted_times, profile_worker
from .hysteresis import Hysteresis

__all__ = ["GpuProfile", "Hysteresis", "affine_rule", "cpu_rule", "gpu_rule", "predicted_times", "profile_worker",
           "round_to_total", "water_fill"]

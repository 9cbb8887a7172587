"""Sync-Switch: configuration policy at a switch; timing and straggler policies (issue 5)."""

from .online import ElasticStragglerPolicy, GreedyStragglerPolicy
from .plan import SwitchPlan
from ..base.curves import converged_accuracy
from .search import SearchResult, SearchSettings, binary_search
from .search_cost import RecordedRun, RunBank, cost_table, simulate_setting
from .slowdown import Slowdown, TransientSlowdown
from .stragglers import StragglerDetector, StragglerEvent, detect
from .trials import JobStoreTrials, JsonTrials, MemoryTrials, TrialKey, TrialResult, job_signature

__all__ = ["ElasticStragglerPolicy", "GreedyStragglerPolicy", "JobStoreTrials", "JsonTrials", "MemoryTrials",
           "RecordedRun", "RunBank", "SearchResult", "SearchSettings", "Slowdown", "StragglerDetector",
           "StragglerEvent", "SwitchPlan", "TransientSlowdown", "TrialKey", "TrialResult", "binary_search",
           "converged_accuracy", "cost_table", "detect", "job_signature", "simulate_setting"]

"""Sync-Switch's protocol and timing plan (Sync-Switch §IV-A, §IV-B1): an ordered list of
protocols, each running until a fraction of the total workload (in samples).

The paper's protocol policy is BSP first, then ASP (§IV-A: "start the training with BSP
and then switch to ASP"); the timing policy picks the switch point, offline by binary
search (``tfsync.switch.search``). ``SwitchPlan()`` is the paper's P3 of Table I,
[("bsp", 0.5), ("asp", 1.0)].
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..base.exits import BadInput

logger = logging.getLogger(__name__)


class PlanError(BadInput, ValueError):
    """A switch plan, fraction or workload that cannot be (exit 2: a search's options)."""


@dataclass(frozen=True)
class SwitchPlan:
    """``phases``: (protocol name, until) pairs; ``until`` strictly increasing in (0, 1],
    the last one 1.0."""

    phases: tuple[tuple[str, float], ...] = (("bsp", 0.5), ("asp", 1.0))

    def __post_init__(self):
        phases = tuple((str(name), float(until)) for name, until in self.phases)
        object.__setattr__(self, "phases", phases)
        if not phases:
            raise PlanError("switch plan has no phases; expected e.g. [('bsp', 0.5), ('asp', 1.0)]")
        last = 0.0
        for name, until in phases:
            if not last < until <= 1.0:
                raise PlanError(f"switch plan phase {name!r} until {until}: each 'until' must be in "
                                f"(previous {last}, 1.0], increasing")
            last = until
        if last != 1.0:
            raise PlanError(f"switch plan ends at {last}; the last phase must run until 1.0")

    @classmethod
    def bsp_then_asp(cls, fraction: float) -> "SwitchPlan":
        """BSP for ``fraction`` of the workload, then ASP (0: ASP only, 1: BSP only)."""
        f = float(fraction)
        if not 0.0 <= f <= 1.0:
            raise PlanError(f"switch fraction {fraction!r}: must be in [0, 1]")
        if f == 0.0:
            return cls((("asp", 1.0),))
        if f == 1.0:
            return cls((("bsp", 1.0),))
        return cls((("bsp", f), ("asp", 1.0)))

    @staticmethod
    def words(fraction: float) -> str:
        """How a person reads ``bsp_then_asp(fraction)``."""
        f = float(fraction)
        return "BSP only" if f >= 1.0 else "ASP only" if f <= 0.0 else f"BSP for {f:.4g} of the workload, then ASP"

    def index_at(self, done: float, total: float) -> int:
        """Index of the phase active once ``done`` of ``total`` samples are trained."""
        if not total > 0:
            raise PlanError(f"total workload {total!r}: must be > 0 samples")
        x = float(done) / float(total)
        for i, (_, until) in enumerate(self.phases):
            if x < until:
                return i
        return len(self.phases) - 1

    def protocol_at(self, done: float, total: float) -> str:
        return self.phases[self.index_at(done, total)][0]

    def boundaries(self, total: int) -> list[tuple[str, int]]:
        """(protocol, samples at which it ends) per phase, in whole samples."""
        return [(name, int(round(until * total))) for name, until in self.phases]

    def fraction_of(self, protocol: str) -> float:
        """Total workload fraction run under ``protocol``."""
        out, last = 0.0, 0.0
        for name, until in self.phases:
            if name == protocol:
                out += until - last
            last = until
        return out

    def to_phases(self) -> list:
        """The plan as ``tfsync.job.schema.ProtocolEntry`` objects (the job file's phase list)."""
        from ..job.schema import ProtocolEntry  # TF-free; imported here to keep this module standalone
        return [ProtocolEntry(name, until) for name, until in self.phases]

    def describe(self) -> list[dict]:
        return [{"name": name, "until": until} for name, until in self.phases]

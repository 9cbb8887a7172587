"""The protocol plan of a ``SyncSwitch``: which protocols ``model.fit`` runs, and where it switches.

A plan is written as a job file's ``[[protocol]]`` list, in Python: a list of phases, each
a protocol name or a dict ``{"name": ..., "until": fraction}`` with the same rules (every
phase but the last ends at a fraction in (0, 1), fractions increase, the last runs to the
end). Here a fraction is of the steps of each ``fit`` call (``epochs * steps_per_epoch``).

What the callback can honour inside ``model.fit``:

- ``["bsp"]``: aggregated BSP for every step (one update per ``num_workers`` steps);
- ``["asp"]``: every step applies its own gradient at once;
- ``[{"name": "bsp", "until": f}, "asp"]``: Sync-Switch, BSP then ASP at ``f``
  (``switch_at=f`` says the same).

Everything else is refused with one line naming the phase, never run as something else:

- ``ssp``: SSP holds a worker that is ``staleness`` steps ahead of the slowest. Under
  ParameterServerStrategy ``fit`` hands each step to whichever worker is idle and no
  step knows which worker runs it, so there is no per-worker clock to hold; and a
  worker held at the bound could wait for steps that ``fit`` gives to no other worker
  (its epoch's ``join`` would never return). The engine (``tfsync run``, ``Engine``)
  grants each worker its own steps, so it runs SSP.
- ``asp`` then ``bsp``: steps already past the gate as ASP when BSP starts would update
  the weights that the first round's gradients are computed on.
- other protocols, per-worker ``batch_sizes`` and protocol options: the engine's.
"""

from __future__ import annotations

import dataclasses
import numbers

from ..policy import catalogue

RUNS = ("bsp", "asp")
KEYS = ("name", "until")
ENGINE = "run it with `tfsync run` or the Engine (tfsync.Engine, tfsync.Phase)"
SSP_REFUSED = ("ssp cannot be honoured inside model.fit: ParameterServerStrategy gives each step to "
               "whichever worker is idle and no step knows its worker, so no worker can be held "
               "`staleness` steps ahead of the slowest (and one held there could wait for steps fit "
               "gives no other worker); run SSP with `tfsync run` or the Engine "
               "(Phase(SSP(staleness=s)))")
EXAMPLE = "[{'name': 'bsp', 'until': 0.5}, 'asp']"


@dataclasses.dataclass(frozen=True)
class Plan:
    """``first``: the protocol the first step runs; ``switch_at``: the fraction of a fit's
    steps after which BSP becomes ASP (None: no switch, ``first`` throughout)."""

    first: str
    switch_at: float | None


def parse(plan=None, switch_at: float | None = None) -> Plan:
    """The plan ``SyncSwitch(plan=..., switch_at=...)`` asks for; ValueError (one line
    naming the argument) for any it cannot honour. Neither given: BSP, ASP at 0.5."""
    if plan is not None and switch_at is not None:
        raise ValueError(f"SyncSwitch: give plan or switch_at, not both (switch_at={switch_at!r} "
                         f"is plan=[{{'name': 'bsp', 'until': {switch_at!r}}}, 'asp'])")
    if plan is None:
        at = 0.5 if switch_at is None else switch_at
        if isinstance(at, bool) or not isinstance(at, numbers.Real) or not 0.0 <= at <= 1.0:
            raise ValueError(f"switch_at={switch_at!r} is a fraction of the training steps; use 0..1")
        return Plan("bsp", float(at))
    phases = [plan] if isinstance(plan, (str, dict)) else plan
    if not isinstance(phases, (list, tuple)) or not phases:
        raise ValueError(f"plan={plan!r}: expected a non-empty list of phases, e.g. {EXAMPLE}")
    raws = [_phase(f"plan[{i}]", raw) for i, raw in enumerate(phases)]
    names = [raw["name"] for raw in raws]
    if "asp" in names and "bsp" in names[names.index("asp"):]:
        raise ValueError(f"plan={' -> '.join(names)}: asp -> bsp cannot be honoured inside model.fit "
                         "(steps already past the gate as ASP would update the weights the first BSP "
                         "round computes on); the callback runs bsp, asp, or bsp then asp")
    if len(set(names)) < len(names):
        raise ValueError(f"plan={' -> '.join(names)}: one phase per protocol; the callback runs bsp, "
                         "asp, or bsp then asp (one switch)")
    ends = [0.0]
    for i, raw in enumerate(raws):
        ends.append(_until(f"plan[{i}]", raw, ends[-1], i == len(raws) - 1))
    return Plan(names[0], ends[1] if len(names) == 2 else None)


def _phase(where: str, raw) -> dict:
    """One phase as a dict, its protocol and keys checked (its name in lower case)."""
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict):
        raise ValueError(f"{where} = {raw!r}: expected a protocol name or a dict like "
                         "{'name': 'bsp', 'until': 0.5}")
    if "name" not in raw:
        raise ValueError(f"{where}: no name; one of {', '.join(RUNS)}")
    name = str(raw["name"]).lower()
    if name == "ssp":
        raise ValueError(f"{where}: {SSP_REFUSED}")
    if name not in RUNS:
        known = catalogue.find(name) is not None
        raise ValueError(f"{where}: protocol {raw['name']!r} " + (
            f"cannot run inside model.fit (the callback runs {', '.join(RUNS)}); {ENGINE}" if known
            else f"is unknown; the callback runs {', '.join(RUNS)}"))
    for key in raw:
        if key == "batch_sizes":
            raise ValueError(f"{where}.batch_sizes: per-worker batch sizes cannot be honoured inside "
                             f"model.fit (each step's batch is the dataset's); {ENGINE}")
        if key not in KEYS:
            raise ValueError(f"{where}.{key}: the callback's {name} takes no option {key!r} "
                             "(a phase is {'name': ..., 'until': fraction})" + (
                                 f"; {ENGINE}" if key in catalogue.spec(name).options else ""))
    return {**raw, "name": name}


def _until(where: str, raw: dict, prev: float, last: bool) -> float:
    """Where a phase ends: a fraction after ``prev``; 1.0 (or omitted) for the last."""
    until = raw.get("until", 1.0 if last else None)
    if until is None:
        raise ValueError(f"{where}.until: missing; every phase but the last needs until, a "
                         "fraction of the fit's steps in (0, 1)")
    if isinstance(until, bool) or not isinstance(until, numbers.Real) or until > 1.0 \
            or (last and until != 1.0) or (not last and not 0.0 < until < 1.0):
        raise ValueError(f"{where}.until = {until!r}: expected " + (
            "1.0 or omitted (the last phase runs to the end)" if last
            else "a fraction in (0, 1) (only the last phase ends at 1.0)"))
    if until <= prev:
        raise ValueError(f"{where}.until = {until!r}: expected more than the previous phase's "
                         f"until = {prev!r} (fractions strictly increase)")
    return float(until)

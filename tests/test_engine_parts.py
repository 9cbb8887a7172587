"""The engine's parts decide by returning values and the loop carries them out
(tfsync.engine.loop): no part receives or imports the loop, and their decisions can be
made on invented values, with no cluster."""

import ast
import pathlib

import pytest

from tfsync.engine import recovery, scaling
from tfsync.engine.phase import Phase
from tfsync.policy import ASP, BSP, BatchSizer
from tfsync.policy.catalogue import aggregating

pytestmark = pytest.mark.unit

ENGINE = pathlib.Path(__file__).resolve().parent.parent / "tfsync" / "engine"


def _imports() -> dict[str, set[str]]:
    """Each engine module's imports of the others: at the top, in functions and under
    TYPE_CHECKING alike."""
    modules = {p.stem for p in ENGINE.glob("*.py")}
    graph = {}
    for path in ENGINE.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfsync.engine."):
                deps.add(node.module.split(".")[2])
        graph[path.stem] = (deps & modules) - {path.stem}
    return graph


def test_no_engine_module_imports_another_round_a_circle_and_only_the_engine_imports_the_loop():
    graph = _imports()

    def reaches(start, goal):
        todo, seen = [start], set()
        while todo:
            for d in graph[todo.pop()] - seen:
                if d == goal:
                    return True
                seen.add(d)
                todo.append(d)
        return False
    circles = sorted(m for m in graph if reaches(m, m))
    assert not circles, f"engine modules in an import circle: {circles}"
    assert sorted(m for m, deps in graph.items() if "loop" in deps) == ["engine"]


def test_a_lost_ps_is_recovered_only_from_a_checkpoint_that_reads_back_and_within_the_limit(tmp_path):
    dead = [("ps", 0, -9)]
    checkpoints = [{"path": str(tmp_path / "ckpt-4"), "samples": 40}]
    assert recovery.after_ps_loss([("worker", 1, -9)], checkpoints, [], 3) is None   # no PS among them
    assert recovery.after_ps_loss(dead, [], [], 3) is None                            # nothing to restore
    assert recovery.after_ps_loss(dead, checkpoints, [{}] * 3, 3) is None             # the limit reached
    decided = recovery.after_ps_loss(dead, checkpoints, [], 3)
    assert decided.checkpoint is None and [p for p, _ in decided.skipped] == [str(tmp_path / "ckpt-4")]


def test_lost_workers_are_recovered_while_each_is_under_the_limit_and_no_ps_died():
    dead = [("worker", 2, -9), ("worker", 0, 1)]
    decided = recovery.after_worker_loss(dead, [{"task": "worker:2"}], 2)
    assert decided.workers == (0, 2) and decided.dead == (("worker", 2, -9), ("worker", 0, 1))
    assert recovery.after_worker_loss(dead, [{"task": "worker:2"}] * 2, 2) is None
    assert recovery.after_worker_loss([*dead, ("ps", 0, -9)], [], 2) is None
    assert recovery.after_worker_loss([], [], 2) is None


def test_a_shrink_after_a_loss_is_decided_within_the_bounds_and_its_rate_follows_the_count():
    def paper_rule(protocol, n):
        return float(n) if aggregating(protocol) else 1.0

    def phases():
        return [Phase(BSP(BatchSizer(8)), until=0.5, lr_scale=4.0), Phase(ASP(BatchSizer(8)))]
    elastic = scaling.Elastic(min_workers=2)
    assert scaling.after_loss(phases(), 3, [2, 1], elastic, paper_rule, 8) is None   # 1 left, under 2
    assert scaling.after_loss(phases(), 3, [2], scaling.Elastic(), paper_rule, 8) is None   # no bounds
    plan = phases()
    decided = scaling.after_loss(plan, 4, [3, 1], elastic, paper_rule, 8)
    assert (decided.old, decided.workers, decided.by, decided.detail) == (4, 2, "loss", {"lost": [1, 3]})
    assert [p.lr_scale for p in plan] == [4.0, 1.0]   # decided, not carried out
    decided.resize()
    assert [p.lr_scale for p in plan] == [2.0, 1.0]
    assert decided.lr_scale(4.0, plan[0].policy) == 2.0 and decided.lr_scale(1.0, plan[1].policy) == 1.0
    event = decided.event(2.0, 64, 8, "ckpt-8", {"seconds": 1.23456})
    assert event == {"from": 4, "to": 2, "by": "loss", "rule": "local", "lost": [1, 3], "samples": 64,
                     "updates": 8, "checkpoint": "ckpt-8", "lr_scale": 2.0, "seconds": 1.235}

"""tfsync's layers (README "Architecture"), checked on the package's import graph.

The graph is built from the source, without importing it: every ``import`` and
``from ... import`` anywhere in a module (inside functions too), resolved to the tfsync
modules it names. Two rules: lower layers never import higher ones, and no two units
(the entries of LAYERS) import each other, directly or round a longer circle.
"""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
# setup.py's package_dir: the top-level folders manager/ and hooks/ are tfsync.manager and tfsync.hooks.
FOLDERS = {"tfsync": ROOT / "tfsync", "tfsync.manager": ROOT / "manager", "tfsync.hooks": ROOT / "hooks"}

# Lowest first. A module may import its own layer and the layers before it. Each entry is a
# unit: a module, or a package with everything in it that a longer entry does not claim
# ("tfsync" alone is the package's __init__).
LAYERS = [
    # base: helpers that import no other layer: safe file writes, free ports, network namespaces, TF's
    # noise, the name registry, curves, arrays and the input pipeline, user-code references,
    # data readers and the bundled data and models, the task command line, progress
    # displays, exit codes and the one-line error, CPU and memory readings (psutil), the
    # plain-data form of the state policies keep across restarts
    ("base", ["tfsync", "tfsync.safefile", "tfsync.nospace", "tfsync.ports", "tfsync.tfconfig", "tfsync.netns", "tfsync.netguard", "tfsync.nft", "tfsync.rundir", "tfsync.quiet", "tfsync.registry", "tfsync.curves",
              "tfsync.arrays", "tfsync.pipeline", "tfsync.usercode", "tfsync.data", "tfsync.datasets",
              "tfsync.examples", "tfsync.taskcmd", "tfsync.progress", "tfsync.exits", "tfsync.procstats",
              "tfsync.plainstate"]),
    # decisions, plain Python (no gRPC; TensorFlow only inside the learned predictors'
    # training): the sync policies and their catalogue, speed predictors, batch-size
    # rules, push records
    ("decisions", ["tfsync.policy", "tfsync.predict", "tfsync.batching", "tfsync.pushlog"]),
    # the job: a job file's configuration, its metrics, the limits it must fit
    ("job", ["tfsync.config", "tfsync.metrics", "tfsync.limits"]),
    # offline, no cluster: the simulator, Sync-Switch's plans, search and straggler policies,
    # RLP's training, the HTML report of a run directory
    ("offline", ["tfsync.sim", "tfsync.switch", "tfsync.rl", "tfsync.report"]),
    # api: the control plane's wire contract (api/v1, generated from proto/) and how to
    # speak it: job tokens (api/auth.py), gRPC servers, channels and TLS (api/transport.py)
    ("api", ["tfsync.api"]),
    # engine: a policy run on ParameterServerStrategy, the workload it trains, straggler
    # injection into its tasks, the Keras callback
    ("engine", ["tfsync.engine", "tfsync.workload", "tfsync.inject", "tfsync.keras"]),
    # hooks: the node agent that starts a node's TF tasks for a manager
    ("hooks", ["tfsync.hooks"]),
    # manager: the control service, job store, launchers and the cluster on hooks, embedded
    # in `tfsync run` or standalone
    ("manager", ["tfsync.manager"]),
    # runner: one job from its configuration to its summary (engine + cluster + manager link)
    ("runner", ["tfsync.jobrun"]),
    # commands: each sub-command's module (and the search's trial process, the testbed)
    ("commands", ["tfsync.switch.cli", "tfsync.switch.trial", "tfsync.rl.cli", "tfsync.predict.cli",
                  "tfsync.report.cli", "tfsync.testbed", "tfsync.manager.cli", "tfsync.manager.jobs_cli"]),
    # the command line: `tfsync`, which assembles the sub-commands; nothing imports it
    ("cli", ["tfsync.cli"]),
]

# Imports that break a rule today, each named with why and what would remove it. Both
# rules skip them; a test fails when one is no longer there (then delete it here).
EXCEPTIONS = {
    # decisions -> offline, and a circle predict -> sim -> predict (the simulator trains
    # predictors with predict.trainer): offline scoring of predictors reads CPU traces with
    # the simulator's loader. Fix: move the trace readers (sim/traces.py) to the base layer.
    ("tfsync.predict.score", "tfsync.sim.traces"): "predictor scoring reads traces through tfsync.sim",
    # a circle inside the commands layer: `tfsync runs` and `tfsync status` of an ended job
    # (jobs_cli) find a job's run directory with manager.cli.run_dir_of, and `tfsync status`
    # (manager.cli) falls back to jobs_cli.show_ended. Fix: one module for the job lookup.
    ("tfsync.manager.jobs_cli", "tfsync.manager.cli"): "the two manager command modules call each other",
}


def modules() -> dict[str, tuple[Path, bool]]:
    """``{module name: (file, is a package __init__)}`` of every module of tfsync."""
    found = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if package == "tfsync" and parts[0] in ("manager", "hooks"):
                continue  # not part of the package: setup.py maps these names to the top-level folders
            is_package = parts[-1] == "__init__"
            found[".".join([package, *(parts[:-1] if is_package else parts)])] = (path, is_package)
    return found


def imported(name: str, is_package: bool, node, known) -> set[str]:
    """The tfsync modules an import statement in module ``name`` names."""
    if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
    else:
        if node.level:  # relative: from the package of the module (the module itself for an __init__)
            base = name.split(".")[:len(name.split(".")) - (not is_package) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module
        # `from pkg import mod` names pkg.mod; `from pkg import name` names pkg
        candidates = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                      for alias in node.names]
    out = set()
    for candidate in candidates:
        while candidate and candidate not in known:  # `import a.b.C` or a name in a module: its module
            candidate = candidate.rpartition(".")[0]
        if candidate:
            out.add(candidate)
    return out


def import_graph() -> dict[str, dict[str, str]]:
    """``{importer: {imported: "file:line"}}`` over tfsync's modules."""
    known = modules()
    graph = {}
    for name, (path, is_package) in known.items():
        edges = graph.setdefault(name, {})
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in imported(name, is_package, node, known):
                    if target != name:
                        edges.setdefault(target, f"{path.relative_to(ROOT)}:{node.lineno}")
    return graph


def unit_of(module: str) -> str | None:
    """The LAYERS entry that holds ``module``: the longest one that is it or a package above it."""
    units = [u for _, us in LAYERS for u in us
             if module == u or (u != "tfsync" and module.startswith(u + "."))]
    return max(units, key=len, default=None)


LAYER_OF = {u: i for i, (_, us) in enumerate(LAYERS) for u in us}
GRAPH = import_graph()


def unit_edges() -> dict[tuple[str, str], list[str]]:
    """``{(unit, unit it imports): ["importer -> imported at file:line", ...]}``, exceptions left out."""
    out = {}
    for importer, edges in GRAPH.items():
        for target, where in edges.items():
            a, b = unit_of(importer), unit_of(target)
            if a != b and (importer, target) not in EXCEPTIONS:
                out.setdefault((a, b), []).append(f"{importer} -> {target} at {where}")
    return out


def test_the_graph_sees_imports_in_functions_relative_ones_and_the_folders_outside_tfsync():
    assert "tfsync.exits" in GRAPH["tfsync.manager.cli"]                 # manager/cli.py, absolute
    assert "tfsync.manager.embedded" in GRAPH["tfsync.cli"]              # inside cmd_run, relative
    assert "tfsync.switch.trials" in GRAPH["tfsync.manager.daemon"]      # inside a method
    assert "tfsync.api.auth" in GRAPH["tfsync.hooks.node"]               # hooks/node.py
    assert "tfsync.safefile" in GRAPH["tfsync.rl.cli"]                   # `from .. import safefile`
    assert "tfsync.pipeline" in GRAPH["tfsync"]                          # the package's __init__


def test_every_module_is_in_one_layer():
    listed = [u for _, us in LAYERS for u in us]
    assert len(listed) == len(set(listed)), "a unit is listed twice in LAYERS"
    missing = sorted(m for m in GRAPH if unit_of(m) is None)
    assert not missing, f"modules in no layer: {missing}; add each to the LAYERS entry it belongs to"
    assert all(m in GRAPH or any(g.startswith(m + ".") for g in GRAPH) for m in listed), \
        f"LAYERS names modules that do not exist: {[m for m in listed if m not in GRAPH]}"


def test_lower_layers_never_import_higher_ones():
    upward = [f"{a} ({LAYERS[LAYER_OF[a]][0]}) imports {b} ({LAYERS[LAYER_OF[b]][0]}): " + "; ".join(where)
              for (a, b), where in sorted(unit_edges().items()) if LAYER_OF[a] < LAYER_OF[b]]
    assert not upward, ("a lower layer imports a higher one (tests/test_layers.py LAYERS, lowest first): move the "
                        "code it needs down, or pass it in as an argument:\n  " + "\n  ".join(upward))


def test_no_import_circle_between_units():
    edges = unit_edges()
    succ = {}
    for a, b in edges:
        succ.setdefault(a, set()).add(b)
    # Tarjan's strongly connected components: a component of more than one unit is a circle
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(succ.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(component)

    for v in sorted(succ):
        if v not in index:
            visit(v)
    shown = ["{" + ", ".join(sorted(c)) + "}: " + "; ".join(w for (a, b), ws in sorted(edges.items())
                                                              if a in c and b in c for w in ws)
             for c in circles]
    assert not shown, "units import each other in a circle; make the dependency one-way:\n  " + "\n  ".join(shown)


def test_every_exception_is_still_needed():
    gone = [f"{a} -> {b}" for a, b in EXCEPTIONS if b not in GRAPH.get(a, {})]
    assert not gone, f"these imports are gone: delete them from EXCEPTIONS in tests/test_layers.py: {gone}"


def test_sub_commands_do_not_import_the_command_line():
    # the circle tfsync.cli <-> rl.cli <-> switch.cli is gone: tfsync.cli assembles, nothing imports it
    assert not [m for m, edges in GRAPH.items() if "tfsync.cli" in edges]


def test_no_module_cites_a_document_that_is_not_in_the_repository():
    """A reader of the code must find what it cites: a ``NAME.md`` named in a module is a
    file of the repository (the design notes it needs are in the README or docstrings)."""
    import re

    present = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts}
    missing = [(str(path.relative_to(ROOT)), name) for folder in FOLDERS.values() for path in folder.rglob("*.py")
               for name in re.findall(r"\b[A-Za-z_]+\.md\b", path.read_text()) if name not in present]
    assert not missing, missing


# classes that are control flow, not failures a user is told of
NOT_FAILURES = {"StopRequested", "Restart", "NoObservation"}


def test_every_failure_derives_from_one_base_with_its_exit_code():
    """One error contract: each exception class tfsync defines derives from
    ``tfsync.exits.TfsyncError`` (directly or through another of them), so the command line
    has one handler that turns it into one line and its exit code."""
    bases = {}
    for folder in FOLDERS.values():
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id.endswith(("Error",
                                                          "Exception", "BadInput")) for b in node.bases):
                    bases[node.name] = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]

    def derives(name, seen=()):
        return name in ("TfsyncError", "BadInput") or any(
            b in bases and b not in seen and derives(b, seen + (name,)) for b in bases.get(name, []))

    loose = sorted(n for n in bases if n not in NOT_FAILURES | {"TfsyncError", "BadInput"} and not derives(n))
    assert not loose, loose

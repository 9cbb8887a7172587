"""tfsync's layers (docs/internals/architecture.md), checked on the package's import graph.

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
PACKAGE = ROOT / "tfsync"

# Lowest first. Each part of tfsync (a folder, or the package's __init__) is in one
# layer: its place in the tree says its layer. A module may import its own layer and the
# layers before it, and no two parts import each other, directly or round a longer circle.
LAYERS = [
    # base/: helpers that import no other layer (safe file writes, free ports, network
    # namespaces, TF's noise, names, curves, arrays and the input pipeline, user-code
    # references, data and trace readers, the task command line, progress, exit codes and
    # the one error contract, CPU and memory readings, policies' plain state); the bundled
    # data and models
    ("base", ["base", "datasets", "examples"]),
    # decisions, plain Python (no gRPC; TensorFlow only inside the learned predictors'
    # training): the sync policies, their catalogue and push records, speed predictors,
    # batch-size rules
    ("decisions", ["policy", "predict", "batching"]),
    # job/: a job file's configuration, its metrics, the limits it must fit
    ("job", ["job"]),
    # deploy/: a job's deployment elsewhere (Kubernetes manifests), plain dicts and text
    ("deploy", ["deploy"]),
    # offline, no cluster: the simulator, Sync-Switch's plans, search and straggler policies,
    # RLP's training, the HTML report of a run directory
    ("offline", ["sim", "switch", "rl", "report"]),
    # api/: the control plane's wire contract (api/v1, generated from proto/) and how to
    # speak it: job tokens, gRPC servers, channels and TLS
    ("api", ["api"]),
    # a policy run on ParameterServerStrategy, the workload it trains, straggler injection
    # into its tasks, the Keras callback
    ("engine", ["engine", "inject", "keras"]),
    # the node agent that starts a node's TF tasks for a manager
    ("hooks", ["hooks"]),
    # the control service, job store and the manager's link to a run
    ("manager", ["manager"]),
    # network namespaces as hosts: nodes, links, latency, CPU shares
    ("testbed", ["testbed"]),
    # cli/: the command line: its main (cli/__init__.py assembles the sub-commands), the job
    # runner, each sub-command's module (and the search's trial process)
    ("cli", ["cli"]),
    # the package's __init__: the public API, names from every layer below it (on first use)
    ("public", ["__init__"]),
]


def modules() -> dict[str, tuple[Path, bool]]:
    """``{module name: (file, is a package __init__)}`` of every module of tfsync."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["tfsync", *path.relative_to(PACKAGE).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
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


def unit_of(module: str) -> str:
    """The part of tfsync that holds ``module``: its folder, or ``__init__`` for the package's own."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


LAYER_OF = {u: i for i, (_, us) in enumerate(LAYERS) for u in us}
GRAPH = import_graph()


def unit_edges() -> dict[tuple[str, str], list[str]]:
    """``{(part, part it imports): ["importer -> imported at file:line", ...]}``."""
    out = {}
    for importer, edges in GRAPH.items():
        for target, where in edges.items():
            a, b = unit_of(importer), unit_of(target)
            if a != b:
                out.setdefault((a, b), []).append(f"{importer} -> {target} at {where}")
    return out


def test_the_graph_sees_imports_in_functions_and_relative_ones():
    assert "tfsync.base.exits" in GRAPH["tfsync.cli.manager"]     # absolute
    assert "tfsync.manager.embedded" in GRAPH["tfsync.cli"]            # inside cmd_run, relative
    assert "tfsync.switch.trials" in GRAPH["tfsync.manager.daemon"]    # inside a method
    assert "tfsync.base.safefile" in GRAPH["tfsync.cli.rl"]       # `from ..base import safefile`
    assert "tfsync.job.config" in GRAPH["tfsync"]                      # the package's __init__


def test_every_part_of_tfsync_is_in_one_layer():
    listed = [u for _, us in LAYERS for u in us]
    assert len(listed) == len(set(listed)), "a part is listed twice in LAYERS"
    missing = sorted({unit_of(m) for m in GRAPH} - set(listed))
    assert not missing, f"parts of tfsync in no layer: {missing}; add each to the LAYERS entry it belongs to"
    assert set(listed) <= {unit_of(m) for m in GRAPH}, "LAYERS names a part that does not exist"


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


def test_sub_commands_do_not_import_the_command_line():
    # tfsync.cli assembles, nothing imports it (but ``python -m tfsync.cli``, its __main__)
    assert not [m for m, edges in GRAPH.items() if "tfsync.cli" in edges and m != "tfsync.cli.__main__"]


def test_no_module_cites_a_document_that_is_not_in_the_repository():
    """A reader of the code must find what it cites: a ``NAME.md`` named in a module is a
    file of the repository (the design notes it needs are in docs/ or docstrings)."""
    import re

    present = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts}
    missing = [(str(path.relative_to(ROOT)), name) for path in PACKAGE.rglob("*.py")
               for name in re.findall(r"\b[A-Za-z_]+\.md\b", path.read_text()) if name not in present]
    assert not missing, missing


# classes that are control flow, not failures a user is told of
NOT_FAILURES = {"StopRequested", "Restart", "NoObservation"}


def test_every_failure_derives_from_one_base_with_its_exit_code():
    """One error contract: each exception class tfsync defines derives from
    ``tfsync.base.exits.TfsyncError`` (directly or through another of them), so the command line
    has one handler that turns it into one line and its exit code."""
    bases = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id.endswith(("Error",
                                                      "Exception", "BadInput")) for b in node.bases):
                bases[node.name] = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]

    def derives(name, seen=()):
        return name in ("TfsyncError", "BadInput") or any(
            b in bases and b not in seen and derives(b, seen + (name,)) for b in bases.get(name, []))

    loose = sorted(n for n in bases if n not in NOT_FAILURES | {"TfsyncError", "BadInput"} and not derives(n))
    assert not loose, loose


def test_an_exit_code_comes_from_the_base_a_class_derives_from():
    """``exit_code`` is set in ``tfsync.base.exits`` only (TfsyncError: 1, BadInput: 2): a
    failure of bad input derives from BadInput rather than setting 2 by hand, in its class
    or on an instance."""
    by_hand = []
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "base" / "exits.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for t in targets:
                name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
                if name == "exit_code":
                    by_hand.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not by_hand, by_hand

"""The public API: the names ``tfsync`` exports are the only ones the documentation and the
examples use, each documented on the API page, and ``import tfsync`` stays light."""

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tfsync
from tfsync.job.errors import ConfigError

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
# pages a user reads to use tfsync (the internals and benchmark pages name internal modules on purpose)
USER_PAGES = [ROOT / "README.md", ROOT / "docs" / "index.md", ROOT / "docs" / "api.md",
              *sorted((ROOT / "docs" / "guide").glob("*.md"))]
EXAMPLES = sorted((ROOT / "examples").rglob("*.py"))
MODULES = {"tfsync", "tfsync.keras"}   # `import tfsync.keras` first quiets TensorFlow's start-up lines
# `tfsync.<name>` in text: not a file (`tfsync.toml`), a job file's reference to a function
# (`"tfsync.examples.images:mnist"`) or a module a command runs (`python -m tfsync.engine.server`)
NAMED = re.compile(r"(?<![\w/.-])(?<!-m )tfsync\.([A-Za-z_][\w.]*)(?![\w.]*:)")
FILES = ("toml", "json", "lock", "md")


def home(name: str):
    """The object a public name stands for, fetched from the module that holds it."""
    where = tfsync._PUBLIC[name]
    module, attr = where if isinstance(where, tuple) else (where, name)
    return getattr(importlib.import_module(f"tfsync.{module}"), attr)


def test_every_public_name_is_the_object_its_module_holds():
    assert "run" in tfsync.__all__ and callable(tfsync.run)
    for name in tfsync._PUBLIC:
        assert getattr(tfsync, name) is home(name), name
    assert set(tfsync.__all__) <= set(dir(tfsync))
    with pytest.raises(AttributeError, match="no attribute 'Loop'"):
        tfsync.Loop


def test_run_refuses_overrides_it_cannot_apply_before_it_starts_anything(tmp_path):
    """``tfsync.run``: an override of a loaded JobConfig, or one the job file does not
    have, is one ConfigError naming it, before any task starts."""
    job = ROOT / "examples" / "regression" / "job.toml"
    with pytest.raises(ConfigError, match="^overrides: a JobConfig is already loaded"):
        tfsync.run(tfsync.load_job(job), ["train.epochs=1"])
    with pytest.raises(ConfigError, match=r"train.epoch: unknown key \(did you mean epochs\?\)") as e:
        tfsync.run(job, "train.epoch=1")   # (one override, not a list of them: taken as one)
    assert e.value.field == "train.epoch"


def test_run_refuses_a_run_directory_another_run_holds(tmp_path):
    """As ``tfsync run``: the run directory is claimed before anything starts, so a second
    run there is refused in one line and the first one's outputs stay where they are."""
    from tfsync.base.rundir import RunDirInUse, RunLock

    held = tmp_path / "run"
    held.mkdir(mode=0o700)
    (held / "summary.json").write_text("{}")
    with RunLock(str(held), "tfsync run"):
        with pytest.raises(RunDirInUse, match="is in use by"):
            tfsync.run(ROOT / "examples" / "regression" / "job.toml", [f'job.run_dir="{held}"'])
    assert (held / "summary.json").read_text() == "{}" and not (held / "previous").exists()


def test_import_tfsync_imports_neither_numpy_nor_tensorflow():
    code = "import sys, tfsync; print(sorted(m for m in ('numpy', 'tensorflow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_api_page_documents_every_public_name_and_no_other():
    directives = re.findall(r"^::: (\S+)$", (ROOT / "docs" / "api.md").read_text(), re.M)
    expected = {"tfsync.run"}
    for name, where in tfsync._PUBLIC.items():
        module, attr = where if isinstance(where, tuple) else (where, name)
        expected.add(f"tfsync.{module}.{attr}")
    assert sorted(directives) == sorted(expected)


def used_in_code(source: str, where: str) -> list[str]:
    """The tfsync names a piece of Python uses that are not public: modules it imports,
    names it imports from them, ``tfsync.<attribute>`` it reads."""
    bad = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.split(".")[0] == "tfsync" and a.name not in MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tfsync":
            bad += [f"{node.module}.{a.name}" for a in node.names
                    if node.module not in MODULES or a.name not in tfsync.__all__]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "tfsync":
            if node.attr not in tfsync.__all__ and node.attr != "keras":
                bad.append(f"tfsync.{node.attr}")
    return bad


def used_in_text(text: str) -> list[str]:
    return [f"tfsync.{m}" for m in NAMED.findall(text)
            if m.split(".")[0] not in tfsync.__all__ and m != "keras" and m.split(".")[-1] not in FILES]


def test_the_pages_and_examples_use_only_public_names():
    bad = {}
    for page in USER_PAGES:
        text = page.read_text()
        if page.name == "api.md":   # its directives name where each public name is defined
            text = re.sub(r"^::: .*$", "", text, flags=re.M)
        blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
        prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
        found = used_in_text(prose) + [n for b in blocks for n in used_in_code(b, str(page))]
        if found:
            bad[page.relative_to(ROOT).as_posix()] = found
    for path in EXAMPLES:
        found = used_in_code(path.read_text(), str(path)) + used_in_text(path.read_text())
        if found:
            bad[path.relative_to(ROOT).as_posix()] = found
    assert not bad, bad


def test_the_check_sees_internal_names():
    """The checks above are not blind: each kind of internal use is caught."""
    assert used_in_code("from tfsync.engine.engine import Engine", "x") == ["tfsync.engine.engine.Engine"]
    assert used_in_code("import tfsync.policy", "x") == ["tfsync.policy"]
    assert used_in_code("import tfsync\ntfsync.policy.BSP()", "x") == ["tfsync.policy"]
    assert used_in_code("from tfsync import Engine, Loop", "x") == ["tfsync.Loop"]
    assert used_in_code("import tfsync.keras\nfrom tfsync import Engine\ntfsync.SyncSwitch", "x") == []
    assert used_in_text("wraps it (`tfsync.engine.workload.as_in_fit`)") == ["tfsync.engine.workload.as_in_fit"]
    assert used_in_text('`tfsync.as_in_fit`, "tfsync.examples.images:mnist", tfsync.toml, '
                        "`python -m tfsync.engine.server`") == []

"""The Python blocks of the documentation, run as a user would paste them (the Keras
guide's block runs in test_keras_callback.py)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def block(page: str) -> str:
    """The first ```python block of ``docs/<page>``."""
    return re.search(r"^```python\n(.*?)^```", (DOCS / page).read_text(), re.S | re.M).group(1)


@pytest.mark.cluster
def test_the_own_model_guides_python_api_block_trains_through_three_phases(tmp_path):
    """docs/guide/own-model.md: a model and data of the user's own through BSP with uneven
    batches, SSP after a hot switch and ASP after a restart, on real task processes; it
    learns (a sum of features' sign: chance is 0.5) and each phase ran."""
    env = {k: v for k, v in os.environ.items() if k != "TFSYNC_VERBOSE"}
    r = subprocess.run([sys.executable, "-c", block("guide/own-model.md")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, "\n".join(x for x in r.stderr.splitlines() if "E0000" not in x)[-3000:]
    accuracy = float(re.search(r"test accuracy (\S+)", r.stdout).group(1))
    assert accuracy > 0.8, r.stdout
    import json
    summary = json.loads((tmp_path / "runs" / "demo" / "summary.json").read_text())
    assert [p["protocol"] for p in summary["timeline"]] == ["bsp", "ssp", "asp"]
    assert [s["method"] for s in summary["switches"]] == ["hot", "restart"]


@pytest.mark.unit
def test_the_simulator_pages_block_runs(tmp_path, monkeypatch):
    """docs/internals/simulator.md: the simulator on a NumPy model, PSSP on uneven workers
    with stragglers; it writes its records where the engine would."""
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block("internals/simulator.md"), "simulator.md", "exec"), scope)
    result = scope["result"]
    assert result.time > 0 and result.time_to_accuracy(0.5) is not None
    assert (tmp_path / "runs" / "sim" / "summary.json").exists()
    assert (tmp_path / "runs" / "sim" / "metrics.jsonl").stat().st_size > 0

"""The command line as a user meets it: one-line errors, exit codes, help."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def tfsync(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tfsync.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


@pytest.mark.parametrize("content, field", [
    ("[train]\nbatch_size = -3\n", "train.batch_size"),
    ("[train]\nbatchsize = 3\n", "train.batchsize"),
    ("[[protocol]]\nname = \"zipline\"\n", "protocol[0].name"),
    ("[cluster]\nworkers = \"two\"\n", "cluster.workers"),
])
def test_bad_job_file_gives_one_line_naming_the_field_and_exit_2(tmp_path, content, field):
    job = tmp_path / "job.toml"
    job.write_text(content)
    r = tfsync("run", str(job))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfsync: error:") and field in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_missing_job_file_and_missing_data_are_bad_input(tmp_path):
    r = tfsync("run", str(tmp_path / "nope.toml"))
    assert r.returncode == 2 and "nope.toml" in r.stderr and "Traceback" not in r.stderr
    job = tmp_path / "job.toml"
    job.write_text(f'[data]\npath = "{tmp_path}/missing.npz"\n')
    r = tfsync("run", str(job))
    assert r.returncode == 2 and "missing.npz" in r.stderr and "Traceback" not in r.stderr


def test_help_explains_the_commands():
    from tfsync import __version__
    r = tfsync("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tfsync {__version__}"
    r = tfsync("--help")
    assert r.returncode == 0 and "run" in r.stdout and "ParameterServerStrategy" in r.stdout
    r = tfsync("run", "--help")
    assert r.returncode == 0 and "job file" in r.stdout and "--json" in r.stdout

"""The command line as a user meets it: one-line errors, exit codes, help."""

import subprocess
import sys

import pytest

from helpers import run_here

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


def test_missing_job_file_and_missing_data_are_bad_input(tmp_path, capsys):
    r = tfsync("run", str(tmp_path / "nope.toml"))   # (a process of its own: the command line's exit code)
    assert r.returncode == 2 and "nope.toml" in r.stderr and "Traceback" not in r.stderr
    job = tmp_path / "job.toml"
    job.write_text(f'[data]\npath = "{tmp_path}/missing.npz"\n')
    r = run_here(capsys, "run", str(job))
    assert r.returncode == 2 and "missing.npz" in r.stderr and "Traceback" not in r.stderr


def test_help_explains_the_commands():
    from tfsync import __version__
    r = tfsync("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tfsync {__version__}"
    r = tfsync("--help")
    assert r.returncode == 0 and "run" in r.stdout and "ParameterServerStrategy" in r.stdout
    r = tfsync("run", "--help")
    assert r.returncode == 0 and "job file" in r.stdout and "--json" in r.stdout


def _one_error_line(r):
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfsync: error:") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.parametrize("given, shown", [
    ("train.epochs", '--set "train.epochs": expected KEY=VALUE'),
    ("=2", '--set "=2": empty KEY'),
    ("train.epochs.x=1", '--set "train.epochs.x=1": train.epochs is a float, not a table'),
    ("train.0=1", '--set "train.0=1": train is a table, not an array'),
    ("protocol.7.until=0.3", '--set "protocol.7.until=0.3": protocol has 2 entries'),
])
def test_malformed_set_exits_2_with_one_line_naming_it(tmp_path, given, shown):
    job = tmp_path / "job.toml"
    # cluster.workers = 0 is bad, fixed by the first --set: a command that left out the
    # --set options would stop there too, not train
    job.write_text('[cluster]\nworkers = 0\n[train]\nepochs = 1.0\n[[protocol]]\nname = "bsp"\nuntil = 0.5\n'
                   '[[protocol]]\nname = "asp"\n')
    for command in ("run", "resume", "search"):
        r = tfsync(command, str(job), "--set", "cluster.workers=3", "--set", given, cwd=tmp_path)
        assert r.returncode == 2 and shown in _one_error_line(r), (command, r.stderr)
    assert not (tmp_path / "runs").exists()  # nothing started


def test_set_bad_value_exits_2_naming_the_field(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text("[train]\nepochs = 1.0\nbatch_size = 0\n")  # fixed by --set: never trains if they are lost
    fix = ("--set", "train.batch_size=32")
    r = tfsync("run", str(job), *fix, "--set", "train.epochs=lots", cwd=tmp_path)
    line = _one_error_line(r)
    assert r.returncode == 2 and f"{job}: train.epochs = \"lots\": must be a number" in line, line
    assert line.endswith("(given by --set train.epochs)")
    r = tfsync("run", str(job), *fix, "--set", "protocol=[{name = \"bsp\", until = 0.5}]", cwd=tmp_path)
    assert r.returncode == 2 and "protocol[0].until" in _one_error_line(r)


def test_set_changes_the_job_signature(tmp_path):
    """`tfsync search --show` looks a job up by its signature, without training: the
    overridden job is another recurring job, and the hint repeats the --set."""
    job = tmp_path / "job.toml"
    job.write_text("[train]\nepochs = 1.0\n")
    store = str(tmp_path / "jobs.db")

    def signature(*sets):
        r = tfsync("search", str(job), "--show", "--store", store, *sets, cwd=tmp_path)
        line = _one_error_line(r)
        assert r.returncode == 1 and "no switch point stored" in line, line
        return line.split("signature ")[1].split(";")[0], line

    plain, _ = signature()
    same, _ = signature("--set", "train.checkpoint_every=5", "--set", "job.name=other")  # not in the signature
    changed, line = signature("--set", "train.epochs=2")
    assert plain == same != changed
    assert f"`tfsync search {job} --set=train.epochs=2`" in line


def test_set_with_help_starts_nothing(tmp_path):
    r = tfsync("run", str(tmp_path / "nope.toml"), "--set", "train.epochs=2", "--help", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("usage: tfsync run") and "--set KEY=VALUE" in r.stdout
    assert r.stderr == "" and list(tmp_path.iterdir()) == []


def test_help_lists_the_exit_codes():
    r = tfsync("--help")
    assert r.returncode == 0
    epilog = r.stdout.split("exit codes:\n", 1)[1]
    codes = [line.split()[0] for line in epilog.splitlines() if line.startswith("  ")]
    assert codes == ["0", "1", "2", "130"], epilog
    assert "bad input" in epilog and "interrupted" in epilog and "failed" in epilog


def _subcommands(parser, path=("tfsync",)):
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _subcommands(sub, (*path, name))


def test_every_subcommand_help_names_itself(capsys):
    from tfsync.cli import build_parser
    from tfsync.hooks.node import main as hook_main
    commands = list(_subcommands(build_parser()))
    assert {("tfsync", "run"), ("tfsync", "policy", "train"), ("tfsync", "hook")} <= {c for c, _ in commands}
    for command, parser in commands:
        if command == ("tfsync", "hook"):  # `tfsync hook ...` is handed to tfsync.hooks.node.main whole
            with pytest.raises(SystemExit) as e:
                hook_main(["--help"])
            assert e.value.code == 0
            help_text = capsys.readouterr().out
        else:
            help_text = parser.format_help()
            assert parser.description, command
        assert help_text.startswith(f"usage: {' '.join(command)} "), (command, help_text[:80])
    r = tfsync("policy", "train", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: tfsync policy train ")


def _python(code: str):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_native_crash_is_not_silent_though_native_stderr_goes_to_dev_null():
    """`tfsync` points file descriptor 2 at /dev/null (TF's C++ noise): an abort in native
    code still prints Python's fatal error and every thread's stack on the real stderr."""
    r = _python("from tfsync.base.quiet import native_logs_off; native_logs_off()\n"
                "import os; os.write(2, b'native noise'); os.abort()")
    assert r.returncode == -6
    assert "Fatal Python error: Aborted" in r.stderr and "most recent call first" in r.stderr, r.stderr
    assert "native noise" not in r.stderr


def test_a_finished_command_ends_its_process_with_its_code_exit_handlers_and_output_flushed(tmp_path):
    """`end_process`: exit handlers run (a fork server is stopped there), buffered output is
    written, and the process exits with the command's code at once, while a daemon thread
    still waits in a call (as TF's closure fetchers do)."""
    marker = tmp_path / "atexit-ran"
    r = _python("import atexit, sys, threading\n"
                f"atexit.register(lambda: open({str(marker)!r}, 'w').close())\n"
                "threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
                "sys.stdout.write('unflushed line')\n"
                "from tfsync.base.quiet import end_process; end_process(3)\n"
                "print('not reached')")
    assert r.returncode == 3 and r.stdout == "unflushed line" and marker.exists(), (r.returncode, r.stdout, r.stderr)
    r = _python("from tfsync.base.quiet import end_process; end_process(None)")   # as sys.exit(None): success
    assert r.returncode == 0, r.stderr

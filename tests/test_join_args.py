"""`tfsync hook --join` and `tfsync run --manager-listen` refuse what they cannot honour
in one line, before anything starts (no TF, no task)."""

import pytest

from helpers import tfsync
from tfsync.api import auth

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("args, said", [
    (["--job", "j1"], "--job is for --join MANAGER"),
    (["--join", "127.0.0.1:7000"], "--join needs --manager-token-file"),
    (["--join", "nowhere", "--manager-token-file", "t"], "is not HOST:PORT"),
    (["--join", "127.0.0.1:7000", "--manager-token-file", "t", "--join-workers", "0"], "--join-workers 0"),
])
def test_hook_join_options_are_checked_before_the_hook_starts(tmp_path, args, said):
    token = tmp_path / "hooks.token"
    auth.write_token(token)
    r = tfsync("hook", "--token-file", str(token), *args)
    assert r.returncode == 2 and said in r.stderr and "listening" not in r.stdout, (r.stdout, r.stderr)


def test_a_hook_listening_everywhere_cannot_say_where_to_reach_it(tmp_path):
    token = tmp_path / "hooks.token"
    auth.write_token(token)
    r = tfsync("hook", "--token-file", str(token), "--listen", "0.0.0.0:0", "--allow-remote",
               "--join", "10.0.0.1:7000", "--manager-token-file", str(token))
    assert r.returncode == 2 and "listen on the address the job's coordinator reaches" in r.stderr, r.stderr


@pytest.mark.parametrize("args, said", [
    (["--manager-listen", "10.0.0.1:0"], "--manager-listen: refusing to listen on '10.0.0.1:0': not a loopback"),
    (["--manager-token-file", "t"], "--manager-token-file and --allow-remote are for --manager-listen"),
    (["--manager-listen", "127.0.0.1:0", "--no-manager"], "not with --no-manager"),
])
def test_run_manager_options_are_refused_before_the_run_directory_is_touched(tmp_path, args, said):
    job = tmp_path / "job.toml"
    job.write_text(f'[job]\nname = "x"\nrun_dir = "{tmp_path / "run"}"\n[model]\nname = "linear"\n[[protocol]]\nname = "bsp"\n')
    r = tfsync("run", str(job), *args)
    assert r.returncode == 2 and said in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("cls, code, quits", [
    ("InvalidArgument", "INVALID_ARGUMENT", True), ("NotFound", "NOT_FOUND", True),
    ("TokenRefused", "UNAUTHENTICATED", True), ("Unsupported", "UNIMPLEMENTED", True),
    ("Refused", "FAILED_PRECONDITION", True),
    ("Refused", "RESOURCE_EXHAUSTED", False), ("Refused", "ABORTED", False), ("CallFailed", "INTERNAL", False)])
def test_a_join_is_refused_for_the_managers_own_no_and_not_for_a_passing_overload(cls, code, quits):
    """What the manager or the job answered (its token, the job, the request, its state)
    ends the hook's join; what gRPC itself may say under load (RESOURCE_EXHAUSTED, ABORTED)
    or an unnamed failure leaves it serving, as before the errors had classes."""
    from tfsync.api import client
    from tfsync.hooks.join import refused

    assert refused(getattr(client, cls)(code, "details")) is quits

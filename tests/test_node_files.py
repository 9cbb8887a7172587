"""A node's files are its own: a hook's log folder is one no other user could make first
or change, its logs 0600, gone when the hook exits; a run directory of another user's, or
in a folder every user may write, is refused before anything is written. Checked as the
other user would try: the folders are made by uid 65533 (setpriv; no passwd entry
needed), as a local user would plant them."""

import os
import stat
import subprocess
import sys

import pytest

from tfsync.api import auth
from tfsync.base import rundir

pytestmark = pytest.mark.unit

OTHER = 65533
ROOT_REASON = "needs root, to act as another user" if os.geteuid() != 0 else None


def planted(path, mode=0o777):
    """A folder made by another user, open to all, as an attacker would leave it."""
    path.mkdir()
    os.chown(path, OTHER, OTHER)
    os.chmod(path, mode)
    return path


def hook(tmp_path, *args):
    token = tmp_path / "token"
    if not token.exists():
        auth.write_token(token)
    return subprocess.Popen([sys.executable, "-m", "tfsync.cli", "hook", "--listen", "127.0.0.1:0",
                             "--token-file", str(token), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "TFSYNC_NO_FIREWALL": "1"})


def test_a_hooks_log_folder_of_another_user_is_refused_in_one_line(tmp_path):
    if ROOT_REASON:
        pytest.skip(ROOT_REASON)
    theirs = planted(tmp_path / "logs")
    proc = hook(tmp_path, "--log-dir", str(theirs))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert err.strip().splitlines() == [f"tfsync: error: {theirs} belongs to uid {OTHER}, not to this user (uid 0), "
                                        "who could rename or replace what is written there; tfsync keeps its files "
                                        "in folders of its own user's only: remove it or choose another"]
    assert os.listdir(theirs) == []
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    proc = hook(tmp_path, "--log-dir", str(link))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and f"{link} is a symbolic link" in err


def test_a_hooks_own_log_folder_is_private_unguessable_and_removed_when_it_exits(tmp_path):
    """Two hooks: two new 0700 folders (a name made with the folder, not the pid's), each
    removed when its hook exits."""
    import re
    import signal

    procs, folders = [hook(tmp_path), hook(tmp_path)], []
    try:
        for proc in procs:
            line = proc.stdout.readline()
            folders.append(re.fullmatch(r"tfsync hook listening on port \d+ \(task logs in (\S+)\)\n", line).group(1))
        for folder in folders:
            st = os.lstat(folder)
            assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
            assert os.path.basename(folder).startswith("tfsync-hook-")
        assert len(set(folders)) == 2 and not any(str(p.pid) in f for p in procs for f in folders)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
    assert [os.path.exists(f) for f in folders] == [False, False]


def test_task_logs_are_0600_in_a_0700_folder(tmp_path):
    from tfsync.hooks.tasks import TaskSupervisor
    sup = TaskSupervisor(str(tmp_path / "logs"), task_command=[sys.executable, "-c", "import time; time.sleep(60)"])
    (tmp_path / "logs").mkdir(mode=0o700)
    spec = '{"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}'
    try:
        (task,), _ = sup.start("job", spec, [("ps", 0)], {})
        assert stat.S_IMODE(os.stat(task.log_path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(task.log_path)).st_mode) == 0o700
    finally:
        sup.shutdown()


def test_a_run_directory_of_another_user_is_refused_before_anything_is_written(tmp_path):
    if ROOT_REASON:
        pytest.skip(ROOT_REASON)
    theirs = planted(tmp_path / "run")
    with pytest.raises(rundir.RunDirError, match=rf"job.run_dir: {theirs} belongs to uid {OTHER}") as e:
        with rundir.claim(str(theirs), "tfsync run"):
            pass
    assert e.value.exit_code == 2 and os.listdir(theirs) == []
    assert stat.S_IMODE(os.stat(theirs).st_mode) == 0o777   # not taken over


def test_a_run_directory_inside_a_folder_every_user_may_write_is_refused(tmp_path):
    if ROOT_REASON:
        pytest.skip(ROOT_REASON)
    shared = planted(tmp_path / "shared")
    os.chown(shared, 0, 0)   # root's, but open to all: anyone may rename the run directory
    with pytest.raises(rundir.RunDirError, match=rf"{shared} is writable by every user"):
        with rundir.claim(str(shared / "run"), "tfsync run"):
            pass
    os.chmod(shared, 0o1777)   # the sticky bit of /tmp: entries stay their owners'
    with rundir.claim(str(shared / "run"), "tfsync run") as run_dir:
        assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700

"""A hook that re-executed itself adopts its tasks by process id (tfsync.hooks.adopt): a
task forked by a fork server is not yet its child when it does, and a process id can be
reused; it never counts, nor signals, a process that is not the one it handed over."""

import subprocess

import psutil
import pytest

from tfsync.hooks.adopt import Adopted

pytestmark = pytest.mark.unit


@pytest.fixture
def grandchild():
    """A process that runs and is not this process's child (its parent is a shell)."""
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    pid = int(shell.stdout.readline())
    yield psutil.Process(pid)
    shell.kill()
    psutil.Process(pid).kill()
    shell.wait()


def test_a_running_process_that_is_not_yet_a_child_counts_as_running(grandchild):
    assert grandchild.ppid() != psutil.Process().pid
    assert Adopted(grandchild.pid, grandchild.create_time()).poll() is None


def test_another_process_with_the_same_id_is_not_adopted_and_never_signalled(grandchild):
    other = Adopted(grandchild.pid, grandchild.create_time() - 5)   # the handed-over one started earlier
    assert other.poll() == -1
    other.kill()
    assert grandchild.is_running() and grandchild.status() != psutil.STATUS_ZOMBIE

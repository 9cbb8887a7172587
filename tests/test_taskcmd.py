"""The one builder of a TF task's command line and environment (engine cluster and hook)."""

import os
import sys

import pytest

from tfsync.base import taskcmd

pytestmark = pytest.mark.unit


def test_command_names_the_task_and_its_launcher():
    cmd = taskcmd.task_command('{"ps": ["127.0.0.1:5"]}', "ps", 0)
    assert cmd == [sys.executable, "-m", "tfsync.engine.server", "--cluster", '{"ps": ["127.0.0.1:5"]}',
                   "--job", "ps", "--index", "0", "--parent-pid", str(os.getpid())]
    assert taskcmd.task_command("{}", "worker", 3, program=("/bin/true",))[:2] == ["/bin/true", "--cluster"]


def test_env_has_no_tf_config_no_gpu_and_this_tfsync_first(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"task": {}}')
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = taskcmd.task_env({"OMP_NUM_THREADS": "1"})
    assert "TF_CONFIG" not in env and env["CUDA_VISIBLE_DEVICES"] == "" and env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert env["OMP_NUM_THREADS"] == "1"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(taskcmd.__file__))))
    assert env["PYTHONPATH"] == os.pathsep.join([root, "/elsewhere"])
    assert os.path.isdir(os.path.join(env["PYTHONPATH"].split(os.pathsep)[0], "tfsync"))


def test_a_scoped_variable_is_not_handed_to_tasks_and_is_never_removed(monkeypatch):
    monkeypatch.delenv("TFSYNC_TEST_SCOPED", raising=False)
    with taskcmd.scoped_env("TFSYNC_TEST_SCOPED", "true", "default"):
        with taskcmd.scoped_env("TFSYNC_TEST_SCOPED", "true", "default"):   # overlapping uses
            assert os.environ["TFSYNC_TEST_SCOPED"] == "true"
            assert "TFSYNC_TEST_SCOPED" not in taskcmd.task_env()   # the value from before: none
        assert os.environ["TFSYNC_TEST_SCOPED"] == "true"
    assert os.environ["TFSYNC_TEST_SCOPED"] == "default"   # other threads may read it: not removed
    with taskcmd.scoped_env("TFSYNC_TEST_SCOPED", "true", "other"):
        assert taskcmd.task_env()["TFSYNC_TEST_SCOPED"] == "default"
    assert os.environ["TFSYNC_TEST_SCOPED"] == "default"

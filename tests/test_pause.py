"""The pause injector slows a real process by the given factor during its episode only,
follows a restarted pid, and always leaves the process running."""

import subprocess
import sys
import time

import psutil
import pytest

from tfsync.inject.pause import Episode, PauseSchedule
from timing import runnable_share

pytestmark = pytest.mark.unit

COUNTER = "import sys, time\nn = 0\nwhile True:\n    n += 1\n    if n % 20000 == 0:\n" \
          "        print(n, flush=True)\n"


@pytest.mark.timing
def test_pause_slows_by_the_factor_then_releases():
    """Shares of wall time the process was runnable, compared with each other: on a busy
    machine (or one whose CPU quota throttles this container) no share is near 1, but the
    slowed one stays a quarter of the unslowed ones around it."""
    proc = subprocess.Popen([sys.executable, "-c", COUNTER], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        free = runnable_share(proc.pid, 1.0)
        sched = PauseSchedule([Episode(0, 4.0, 0.0, 4.0)], pid_of=lambda w: proc.pid, period_s=0.1)
        with sched:
            deadline = time.monotonic() + 15  # the pausing process starts slowly on a loaded machine
            while "begin" not in [what for _, what, _ in sched.log] and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.1)
            slowed = runnable_share(proc.pid, 1.5)  # well inside the 4 s episode
            deadline = time.monotonic() + 15
            while "end" not in [what for _, what, _ in sched.log] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED
            after = runnable_share(proc.pid, 1.0)
        unslowed = (free + after) / 2
        assert after > 2 * slowed, (free, slowed, after)  # released
        assert slowed == pytest.approx(unslowed / 4.0, rel=0.35), (free, slowed, after)
        assert [what for _, what, _ in sched.log] == ["begin", "end"]
        assert [(e["what"], e["worker"], e["slowdown"]) for e in sched.entries()] == [("begin", 0, 4.0), ("end", 0, 4.0)]
    finally:
        proc.kill()
        proc.wait()


def test_stop_continues_the_process_and_a_gone_pid_is_skipped():
    proc = subprocess.Popen([sys.executable, "-c", COUNTER], stdout=subprocess.DEVNULL)
    pids = {0: proc.pid, 1: 2 ** 22 + 12345}  # worker 1: no such process
    try:
        sched = PauseSchedule([Episode(0, 100.0, 0.0, 30.0), Episode(1, 3.0, 0.0, 30.0)],
                              pid_of=pids.get, period_s=0.2).start()
        time.sleep(0.55)
        sched.stop()
        time.sleep(0.05)
        assert psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED
    finally:
        proc.kill()
        proc.wait()


def test_episode_checks():
    with pytest.raises(ValueError, match="slowdown"):
        Episode(0, 0.5, 0.0, 1.0)
    with pytest.raises(ValueError, match="duration"):
        Episode(0, 2.0, 0.0, 0.0)


def test_the_pausing_process_continues_its_target_when_its_parent_goes():
    """The stop/continue loop lives in a child process (a coordinator thread can be kept
    from sending SIGCONT by the GIL); if the coordinator dies, the target runs again."""
    import json
    proc = subprocess.Popen([sys.executable, "-c", COUNTER], stdout=subprocess.DEVNULL)
    pauser = subprocess.Popen([sys.executable, "-m", "tfsync.inject.pause"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        spec = {"episodes": [{"worker": 0, "slowdown": 1000.0, "start_s": 0.0, "duration_s": 60.0}],
                "period_s": 0.2, "pids": {"0": proc.pid}}
        pauser.stdin.write(json.dumps(spec) + "\n")
        pauser.stdin.flush()
        assert json.loads(pauser.stdout.readline())[1:] == ["begin", 0]
        time.sleep(0.3)
        pauser.stdin.close()  # the parent is gone
        pauser.wait(5)
        time.sleep(0.1)
        assert psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED
    finally:
        pauser.kill()
        proc.kill()
        proc.wait()

"""Where a job's tasks go on node hooks: the job file's cluster.hooks checks, and the
specs HookNodes makes (round-robin over hooks, PS first; fresh ports every generation)."""

import pytest

from tfsync.engine.hook_cluster import HookNodes, is_loopback
from tfsync.job.config import JobConfig
from tfsync.job.errors import ConfigError

pytestmark = pytest.mark.unit


def _error(cluster) -> str:
    with pytest.raises(ConfigError) as e:
        JobConfig.from_dict({"cluster": cluster}, source="job.toml")
    return str(e.value)


def test_job_file_hooks_need_a_token_and_remote_ones_ports():
    assert "cluster.token_file" in _error({"hooks": ["127.0.0.1:7070"]})
    assert "cluster.task_ports" in _error({"hooks": ["10.0.0.2:7070"], "token_file": "t"})
    assert "host:port" in _error({"hooks": ["10.0.0.2"], "token_file": "t"})
    assert "distinct" in _error({"hooks": ["a:1", "a:1"], "token_file": "t"})
    assert "first <= last" in _error({"hooks": ["a:1"], "token_file": "t", "task_ports": [200, 100]})
    cfg = JobConfig.from_dict({"cluster": {"hooks": ["10.0.0.2:7070", "10.0.0.3:7070"], "token_file": "t",
                                           "task_ports": [20000, 20009]}})
    assert cfg.cluster.hooks == ("10.0.0.2:7070", "10.0.0.3:7070") and cfg.cluster.task_ports == (20000, 20009)
    assert JobConfig.from_dict(cfg.to_dict()) == cfg  # what `tfsync submit` sends


def test_tasks_round_robin_on_the_hooks_hosts_with_fresh_ports_per_generation():
    nodes = HookNodes([("10.0.0.2:7070", "t"), ("10.0.0.3:7070", "t")], ports=(20000, 20005))
    spec, assignment = nodes.spec(workers=3, ps=1)
    assert spec["ps"] == ["10.0.0.2:20000"]
    assert spec["worker"] == ["10.0.0.3:20000", "10.0.0.2:20001", "10.0.0.3:20001"]
    assert assignment == {("ps", 0): 0, ("worker", 0): 1, ("worker", 1): 0, ("worker", 2): 1}
    again, _ = nodes.spec(workers=3, ps=1)  # the next generation never reuses a port at once
    assert set(again["ps"] + again["worker"]).isdisjoint(spec["ps"] + spec["worker"])
    third, _ = nodes.spec(workers=3, ps=1)  # the range wraps around
    assert third["ps"] == ["10.0.0.2:20004"] and nodes.spec(workers=3, ps=1)[0]["ps"] == ["10.0.0.2:20000"]
    with pytest.raises(ValueError, match="not on this machine"):
        HookNodes([("10.0.0.2:7070", "t")])
    with pytest.raises(ValueError, match="fewer than"):
        HookNodes([("10.0.0.2:7070", "t")], ports=(1, 2)).spec(workers=2, ps=1)


def test_loopback_hooks_get_free_ports_here():
    nodes = HookNodes([("127.0.0.1:7070", "t")])
    spec, _ = nodes.spec(workers=2, ps=1)
    ports = [int(a.rsplit(":", 1)[1]) for a in spec["ps"] + spec["worker"]]
    assert len(set(ports)) == 3 and all(a.startswith("127.0.0.1:") for a in spec["ps"] + spec["worker"])
    assert is_loopback("localhost") and is_loopback("[::1]") and not is_loopback("10.0.0.2")


def test_pinned_tasks_stay_on_their_node_while_it_answers_and_move_when_it_does_not():
    from tfsync.engine.launcher import place
    tasks = [("ps", 0), ("worker", 0), ("worker", 1), ("worker", 2)]
    assert place(tasks, [0, 1, 2]) == {("ps", 0): 0, ("worker", 0): 1, ("worker", 1): 2, ("worker", 2): 0}
    pinned = {("ps", 0): 2, ("worker", 1): 2}
    assert place(tasks, [0, 1, 2], pinned) == {("ps", 0): 2, ("worker", 0): 0, ("worker", 1): 2, ("worker", 2): 1}
    # node 2 is gone: its pinned tasks and every other go round-robin over nodes 0 and 1
    assert place(tasks, [0, 1], pinned) == {("ps", 0): 0, ("worker", 0): 1, ("worker", 1): 0, ("worker", 2): 1}
    nodes = HookNodes([("10.0.0.2:7070", "t"), ("10.0.0.3:7070", "t"), ("10.0.0.4:7070", "t")], ports=(20000, 20099),
                      pinned=pinned)
    spec, assignment = nodes.spec(workers=3, ps=1, live=[0, 2])
    assert spec["ps"] == ["10.0.0.4:20000"] and assignment[("worker", 1)] == 2
    assert set(assignment.values()) == {0, 2}


def test_job_file_placement_names_one_hook_per_task():
    hooks = {"hooks": ["10.0.0.2:7070", "10.0.0.3:7070"], "token_file": "t", "task_ports": [20000, 20009]}
    cfg = JobConfig.from_dict({"cluster": {**hooks, "workers": 2, "place_ps": ["10.0.0.3:7070"],
                                           "place_workers": ["10.0.0.2:7070", "10.0.0.2:7070"]}})
    assert cfg.cluster.place_ps == ("10.0.0.3:7070",) and JobConfig.from_dict(cfg.to_dict()) == cfg
    assert "1 hooks for 2 tasks" in _error({**hooks, "workers": 2, "place_workers": ["10.0.0.2:7070"]})
    assert "not one of cluster.hooks" in _error({**hooks, "place_ps": ["10.0.0.9:7070"]})


def test_a_hooks_sample_gives_its_live_workers_readings_as_the_engines_own():
    from tfsync.api.v1 import common_pb2
    from tfsync.engine.hook_cluster import workers_of
    from tfsync.base.procstats import worker_reading

    def proc(job, index, pid, cpu, alive=True):
        return common_pb2.ProcessSample(task=common_pb2.TaskRef(job=job, index=index), pid=pid, alive=alive,
                                        cpu_percent=cpu, rss_bytes=2 << 30)

    sample = common_pb2.ResourceSample(node="n2", time=50.0, cpu_percent=75.0, cpu_count=2,
                                       memory_total_bytes=16 << 30, processes=[
                                           proc("ps", 0, 10, 90.0), proc("worker", 1, 11, 50.0),
                                           proc("worker", 2, 12, 0.0, alive=False)])
    got = workers_of(sample)
    # node 75 % of 2 cores busy, the worker 50 % of one: others keep half of the node's CPUs busy
    assert got == {1: {"cpu": 50.0, "mem": 12.5, "proc_cpu": 50.0, "set_cpu": 75.0, "pid": 11, "node": "n2",
                       "time": 50.0}}
    assert got[1] == worker_reading(150.0, 2, 50.0, 12.5, 11, 50.0, node="n2")


def test_both_cluster_kinds_have_what_the_engine_needs():
    """LocalCluster and HookCluster are the two implementations of engine.cluster.Cluster."""
    import inspect

    from tfsync.engine.cluster import Cluster, LocalCluster
    from tfsync.engine.hook_cluster import HookCluster

    needed = [name for name, _ in inspect.getmembers(Cluster, inspect.isfunction) if not name.startswith("_")]
    assert set(needed) == {"launch", "wait_ready", "dead_tasks", "task_pid", "worker_pids", "stop"}
    for kind in (LocalCluster, HookCluster):
        for name in needed:
            ours, theirs = inspect.signature(getattr(kind, name)), inspect.signature(getattr(Cluster, name))
            extra = list(ours.parameters.values())[len(theirs.parameters):]   # optional ones only
            assert list(ours.parameters)[:len(theirs.parameters)] == list(theirs.parameters), (kind.__name__, name)
            assert all(p.default is not inspect.Parameter.empty for p in extra), (kind.__name__, name)



def test_a_joining_hook_is_checked_with_the_jobs_token_and_a_refused_one_leaves_nothing(tmp_path):
    """Real hooks (gRPC servers in this process, no task started): the job's token is
    taken, another is refused naming it, a duplicate or a remote hook beside local ones is
    refused before any call, and remove_hook forgets what a generation noted of it."""
    from tfsync.api import auth
    from tfsync.base.ports import free_ports
    from tfsync.hooks import node

    token, other = auth.new_token(), auth.new_token()
    servers = [node.serve(token=t, log_dir=str(tmp_path / f"logs{i}"), node=f"n{i}") for i, t in
               enumerate((token, token, other))]
    first, joining, wrong = (f"127.0.0.1:{port}" for _, port in servers)
    try:
        nodes = HookNodes([(first, token)])
        with pytest.raises(ValueError, match=f"hook {wrong} refused the job's hook token"):
            nodes.add_hook(wrong)
        with pytest.raises(ValueError, match="does not answer from here"):
            nodes.add_hook(f"127.0.0.1:{free_ports(1)[0]}")
        with pytest.raises(ValueError, match="is on another machine, the job's hooks are on this one"):
            nodes.add_hook("10.0.0.9:7070")
        assert nodes.hooks == [(first, token)]
        nodes.add_hook(joining)
        assert nodes.has_hook(joining) and nodes.hooks[-1] == (joining, token)
        with pytest.raises(ValueError, match="already one of the job's nodes"):
            nodes.add_hook(joining)
        nodes.left_out.add(1)   # as a generation that found it silent
        nodes.remove_hook(joining)
        assert nodes.hooks == [(first, token)] and nodes.left_out == set() and nodes.left_out_hooks() == []
    finally:
        for server, _ in servers:
            server.stop()


def test_a_hook_that_cancels_health_as_it_shuts_down_gets_no_tasks():
    """A hook given SIGTERM stops its server, and the calls still open then end CANCELLED:
    such a hook is not taken as answering (it was, and a new generation's tasks went to a
    hook that was going away)."""
    from concurrent import futures

    import grpc

    from tfsync.api.v1 import node_hook_pb2_grpc
    from tfsync.base.ports import free_ports

    class ShuttingDown(node_hook_pb2_grpc.NodeHookServicer):
        def Health(self, request, context):
            context.abort(grpc.StatusCode.CANCELLED, "the server is shutting down")

    port = free_ports(1)[0]
    server = grpc.server(futures.ThreadPoolExecutor(1))
    node_hook_pb2_grpc.add_NodeHookServicer_to_server(ShuttingDown(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        assert not HookNodes([(f"127.0.0.1:{port}", "t")])._answers(0, timeout=5.0, say=False)
    finally:
        server.stop(None)

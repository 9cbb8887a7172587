"""One command check: a bad switch or bad batch sizes get the same one line whether they
are sent with `tfsync switch` / `tfsync batch-sizes`, to the manager's gRPC API, or to the
engine's Python API (a Controller's Command): all three ask tfsync.policy.checks."""

import json
import math

import grpc
import pytest

from helpers import tfsync
from tfsync.api import auth, transport
from tfsync.api.v1 import manager_pb2, manager_pb2_grpc
from tfsync.engine.commands import Command, check
from tfsync.manager.service import ManagerService
from tfsync.manager.store import Store

pytestmark = pytest.mark.unit

WORKERS = 2
# (CLI arguments, the request's protocol, options and lr_scale, the words the one line has)
BAD_SWITCHES = [
    (["--to", "nope"], "nope", {}, None, "unknown protocol 'nope'; valid: bsp, asp, ssp"),
    (["--to", "ssp", "--staleness", "-1"], "ssp", {"staleness": -1}, None, "staleness = -1"),
    (["--to", "bsp", "-o", "staleness=2"], "bsp", {"staleness": 2}, None, "protocol 'bsp' has no option 'staleness'"),
    (["--to", "asp", "--lr-scale", "5000"], "asp", {}, 5000.0, "lr_scale 5000.0; expected a finite number > 0"),
    (["--to", "fluentps", "-o", "probability=2.5"], "fluentps", {"probability": 2.5}, None, "probability = 2.5"),
    # a true/false option travels as a number: only 0 and 1 are one
    (["--to", "fluentps", "-o", "average=nan"], "fluentps", {"average": math.nan}, None, "average = nan"),
    (["--to", "fluentps", "-o", "average=2"], "fluentps", {"average": 2.0}, None, "average = 2.0"),
]


@pytest.fixture
def job(tmp_path):
    """A manager serving one job of WORKERS workers (no coordinator: commands are refused or
    queued), and a run directory whose control files point at it, as `tfsync run` writes them."""
    store = Store(str(tmp_path / "jobs.db"))
    service = ManagerService(store, command_wait_s=0.01)
    service.register("job1", "live").workers = WORKERS
    token = auth.new_token()
    server, port = transport.make_server("127.0.0.1:0", token=token, max_workers=4)
    manager_pb2_grpc.add_ManagerServicer_to_server(service, server)
    server.start()
    run_dir = tmp_path / "run"
    (run_dir / "control").mkdir(parents=True)
    (run_dir / "control" / "manager.json").write_text(json.dumps({"address": f"127.0.0.1:{port}", "job_id": "job1"}))
    auth.write_token(run_dir / "control" / "token", token)
    channel = transport.make_channel(f"127.0.0.1:{port}", token=token)
    try:
        yield manager_pb2_grpc.ManagerStub(channel), run_dir
    finally:
        channel.close()
        server.stop(grace=None).wait(5)
        store.close()


def _cli(run_dir, *args) -> str:
    r = tfsync(*args[:1], str(run_dir), *args[1:])
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr)
    return lines[0].removeprefix("tfsync: error: INVALID_ARGUMENT: ")


def _api(call, request) -> str:
    with pytest.raises(grpc.RpcError) as e:
        call(request, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return e.value.details()


def _engine(command: Command) -> str:
    with pytest.raises(ValueError) as e:
        check(command, WORKERS)
    return str(e.value)


def test_a_bad_switch_gets_the_same_line_from_the_cli_the_manager_api_and_the_engine_api(job):
    stub, run_dir = job
    for args, protocol, options, lr_scale, words in BAD_SWITCHES:
        by_cli = _cli(run_dir, "switch", *args)
        by_api = _api(stub.Switch, manager_pb2.SwitchRequest(
            job_id="job1", protocol=protocol, options={**options, **({"lr_scale": lr_scale} if lr_scale else {})}))
        by_engine = _engine(Command("c1", "switch", protocol=protocol, options=options, lr_scale=lr_scale))
        assert by_cli == by_api == by_engine, (args, by_cli, by_api, by_engine)
        assert words in by_engine and "\n" not in by_engine, (args, by_engine)


def test_bad_batch_sizes_get_the_same_line_from_the_cli_the_manager_api_and_the_engine_api(job):
    stub, run_dir = job
    for sizes in ([8], [8, 0], [8, 8, 8]):
        by_cli = _cli(run_dir, "batch-sizes", *map(str, sizes))
        by_api = _api(stub.SetBatchSizes, manager_pb2.SetBatchSizesRequest(job_id="job1", batch_sizes=sizes))
        by_engine = _engine(Command("c1", "batch_sizes", batch_sizes=tuple(sizes)))
        assert by_cli == by_api == by_engine == f"batch sizes {sizes}: expected 2 integers >= 1, one per worker"


def test_a_running_policy_sets_batch_sizes_itself_and_refuses_what_it_cannot_honour():
    from tfsync.engine.phase import Phase
    from tfsync.policy import BSP, LBBSP

    phase = Phase(BSP())
    phase.set_batch_sizes([12, 8], max_batch=64)
    assert phase.policy.sizer.per_worker == (12, 8) and phase.changed == {"batch_sizes": [12, 8]}
    with pytest.raises(ValueError, match="batch size 80 exceeds the input pipeline's 64"):
        phase.set_batch_sizes([80, 8], max_batch=64)
    with pytest.raises(ValueError, match="lbbsp sizes its own batches"):
        Phase(LBBSP(batch_size=8)).set_batch_sizes([12, 8], max_batch=64)
    assert phase.policy.sizer.per_worker == (12, 8)   # a refused command changed nothing

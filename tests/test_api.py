"""The checked-in generated API code is exactly what proto/generate.py makes from the
.proto files, and the services have the RPCs the manager and hooks rely on."""

import importlib.util
import os

import pytest

from tfsync.api.v1 import common_pb2, manager_pb2, node_hook_pb2

pytestmark = pytest.mark.unit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _generator():
    spec = importlib.util.spec_from_file_location("proto_generate", os.path.join(REPO, "proto", "generate.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_up_to_date(tmp_path):
    pytest.importorskip("grpc_tools", reason="regenerating needs grpcio-tools: pip install -e '.[test]'")
    gen = _generator()
    fresh = gen.generate(str(tmp_path))
    checked_in = gen.generated_files(REPO)
    assert fresh == checked_in and len(fresh) == 6, "generated file set differs: run python proto/generate.py"
    for rel in fresh:
        with open(tmp_path / rel, "rb") as a, open(os.path.join(REPO, rel), "rb") as b:
            assert a.read() == b.read(), f"{rel} is stale or edited by hand: run python proto/generate.py"


def test_services_and_versioned_package():
    manager = manager_pb2.DESCRIPTOR.services_by_name["Manager"]
    hook = node_hook_pb2.DESCRIPTOR.services_by_name["NodeHook"]
    assert manager.full_name == "tfsync.api.v1.Manager" and hook.full_name == "tfsync.api.v1.NodeHook"
    streams = {m.name: (m.client_streaming, m.server_streaming) for m in manager.methods}
    assert streams == {
        "SubmitJob": (False, False), "GetStatus": (False, False), "StreamMetrics": (False, True),
        "Switch": (False, False), "SetBatchSizes": (False, False), "Checkpoint": (False, False),
        "Stop": (False, False), "Scale": (False, False), "Join": (False, False), "Resume": (False, False),
        "ReportResources": (False, False),
        "StreamReportResources": (True, False), "Attach": (True, True)}
    assert {m.name: (m.client_streaming, m.server_streaming) for m in hook.methods} == {
        "StartTasks": (False, False), "StopTasks": (False, False), "RestartTask": (False, False),
        "StreamResources": (False, True), "Health": (False, False), "StageFile": (True, False),
        "FreePorts": (False, False)}


def test_messages_round_trip_and_unset_enums_read_unspecified():
    cmd = manager_pb2.Command(command_id="c1", job_id="j", switch=manager_pb2.SwitchRequest(
        protocol="ssp", method=manager_pb2.SWITCH_METHOD_HOT, options={"staleness": 3}))
    back = manager_pb2.Command.FromString(cmd.SerializeToString())
    assert back.WhichOneof("kind") == "switch" and back.switch.options["staleness"] == 3
    assert common_pb2.TaskStatus().state == common_pb2.TASK_STATE_UNSPECIFIED
    assert manager_pb2.JobStatus().state == manager_pb2.JOB_STATE_UNSPECIFIED
    req = node_hook_pb2.StreamResourcesRequest()
    assert not req.HasField("interval_s")  # unset means the default interval, not 0

"""Fuzzing the manager and node-hook RPCs and the job-file parser with random and
boundary values for every field (standard ``random``, fixed seeds, no TensorFlow).

Every call must end with a proper gRPC status (never UNKNOWN or INTERNAL), the servers
must keep serving, and nothing may be written outside the directories they were given;
a refused StartTasks leaves no log file. Every bad job dict or file must raise
ConfigError with one line naming the field.
"""

import hashlib
import json
import math
import os
import random
import string
import tempfile
import threading

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor as FD

from tfsync.api import auth, transport
from tfsync.api.v1 import common_pb2, manager_pb2, manager_pb2_grpc, node_hook_pb2, node_hook_pb2_grpc
from tfsync.base.ports import free_ports
from tfsync.hooks import node
from tfsync.hooks import tasks as hook_tasks
from tfsync.hooks.tasks import ENV_ALLOWLIST
from tfsync.job.config import JobConfig, load_job
from tfsync.job.errors import ConfigError
from tfsync.job.fields import CHECKS
from tfsync.job.schema import SECTIONS
from tfsync.manager.daemon import StandaloneService
from tfsync.manager.store import Store
from tfsync.manager.store_types import EVENT_KINDS
from tfsync.policy import catalogue

pytestmark = pytest.mark.unit

OK_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.ALREADY_EXISTS,
            grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.RESOURCE_EXHAUSTED}
CALLS = int(os.environ.get("TFSYNC_FUZZ_CALLS", "150"))  # requests per unary RPC
MAX_STATUS_LEN = 1000  # a status message is one short line, however long the bad value

# ---- random and boundary values ---------------------------------------------------------

INT_RANGES = {FD.TYPE_INT32: (-2**31, 2**31 - 1), FD.TYPE_INT64: (-2**63, 2**63 - 1),
              FD.TYPE_UINT64: (0, 2**64 - 1), FD.TYPE_UINT32: (0, 2**32 - 1)}
DOUBLES = [0.0, -0.0, 1.0, -1.0, 0.5, 0.049, 0.05, 1e9, -1e9, 1e308, -1e308, 5e-324, math.nan, math.inf,
           -math.inf, 600.0, 601.0]


def rand_string(rng: random.Random) -> str:
    pick = rng.randrange(12)
    if pick == 0:
        return ""
    if pick == 1:
        return "x" * rng.choice([63, 64, 65, 255, 256, 4096, 70_000, 1 << 20])
    if pick == 2:
        return rng.choice(["\x00", "a\x00b", "\n", " ", "a\nb", "é☃\U0001F600", "\ud7ff", "%s%n", "'\"\\"])
    if pick == 3:
        return rng.choice(["../../etc/passwd", "/tmp/x", "..", ".", "a/b", "~", "$HOME", "-rf", "--help"])
    if pick == 4:
        return rng.choice(["{", "[]", "null", "{}", "1e999", "NaN", "[" * 100_000, '{"a": ' * 5000])
    if pick == 5:
        return "".join(rng.choice(string.printable) for _ in range(rng.randrange(1, 40)))
    if pick == 6:
        return "".join(chr(rng.randrange(1, 0xD7FF)) for _ in range(rng.randrange(1, 20)))
    return "".join(rng.choice(string.ascii_letters + string.digits + "._-") for _ in range(rng.randrange(1, 12)))


def rand_int(rng: random.Random, kind: int) -> int:
    lo, hi = INT_RANGES[kind]
    return rng.choice([0, 1, -1, 2, 3, 16, lo, hi, lo + 1, hi - 1, 10**9, rng.randint(lo, hi), rng.randint(-5, 100)])


def clip(v: int, kind: int) -> int:
    lo, hi = INT_RANGES[kind]
    return min(max(v, lo), hi)


class Fuzzer:
    """Random messages built from their descriptors; ``hints[field name]()`` gives
    plausible values (half of the time), so that checks past the first are reached."""

    def __init__(self, rng: random.Random, hints: dict):
        self.rng, self.hints = rng, hints

    def scalar(self, f, hinted: bool = True):
        rng = self.rng
        hint = self.hints.get(f.name) if hinted else None
        if hint is not None and rng.random() < 0.6:
            return hint()
        if f.type == FD.TYPE_STRING:
            return rand_string(rng)
        if f.type == FD.TYPE_BYTES:
            return rand_string(rng).encode("utf-8", "surrogatepass")
        if f.type == FD.TYPE_BOOL:
            return rng.random() < 0.5
        if f.type in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
            return rng.choice(DOUBLES + [rng.uniform(-1e6, 1e6)])
        if f.type == FD.TYPE_ENUM:  # proto3 enums are open: any int32 goes
            return rng.choice([v.number for v in f.enum_type.values] + [-1, 99, 2**31 - 1, -2**31])
        return clip(rand_int(rng, f.type), f.type)

    def fill(self, msg, depth: int = 0):
        """Every field of ``msg`` random (some left unset)."""
        for f in msg.DESCRIPTOR.fields:
            if self.rng.random() < 0.2:
                continue  # left unset: the default
            if f.containing_oneof is not None and msg.WhichOneof(f.containing_oneof.name) and self.rng.random() < 0.8:
                continue
            self.set_field(msg, f, depth)
        return msg

    def set_field(self, msg, f, depth: int = 0) -> None:
        rng = self.rng
        value = getattr(msg, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            value.clear()
            key_f, val_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            for _ in range(rng.choice([0, 1, 2, 5])):
                k = self.scalar(key_f)
                if val_f.message_type is None:
                    value[k] = self.scalar(val_f)
        elif f.is_repeated:
            del value[:]
            hint = self.hints.get(f.name)
            if hint is not None and rng.random() < 0.6:
                items = hint()
                if f.message_type is not None:
                    for item in items:
                        value.add().CopyFrom(item)
                else:
                    value.extend(items)
                return
            for _ in range(rng.choice([0, 1, 2, 3, 50])):
                if f.message_type is not None:
                    if depth < 4:
                        self.fill(value.add(), depth + 1)
                else:
                    value.append(self.scalar(f, hinted=False))
        elif f.message_type is not None:
            if depth < 4:
                value.Clear()
                value.SetInParent()
                self.fill(value, depth + 1)
        else:
            setattr(msg, f.name, self.scalar(f))

    def mutate(self, msg, depth: int = 0):
        """``msg`` with one or two of its fields (nested ones too) made random."""
        for _ in range(self.rng.choice([1, 1, 2]) if msg.DESCRIPTOR.fields else 0):
            f = self.rng.choice(msg.DESCRIPTOR.fields)
            inner = getattr(msg, f.name) if f.message_type is not None and not f.is_repeated else None
            if inner is not None and msg.HasField(f.name) and self.rng.random() < 0.5 and depth < 4:
                self.mutate(inner, depth + 1)
            else:
                self.set_field(msg, f, depth)
        return msg

    def request(self, cls, valid=None):
        """A random ``cls``, or half of the time (with ``valid``, a function returning a good
        one) a good one with one or two fields spoiled, or none."""
        if valid is None or self.rng.random() < 0.4:
            return self.fill(cls())
        good = valid()
        return good if self.rng.random() < 0.15 else self.mutate(good)


# ---- calling every RPC of a service -------------------------------------------------------

class Watch:
    """Uncaught exceptions of the servers' threads (a reader thread that died, say)."""

    def __init__(self, monkeypatch):
        self.thread_errors = []
        monkeypatch.setattr(threading, "excepthook", lambda args: self.thread_errors.append(
            f"{args.thread.name}: {args.exc_type.__name__}: {args.exc_value}"))


def call(stub, method, request, timeout: float = 5.0, stream_timeout: float = 0.3):
    """(status code, details) of one call of ``method`` (its descriptor) with ``request``
    (a list of messages for a client stream). A server stream is read for
    ``stream_timeout`` s: one that still streams then ends with DEADLINE_EXCEEDED."""
    fn = getattr(stub, method.name)
    try:
        if method.server_streaming:
            args = iter(request) if method.client_streaming else request
            for _ in fn(args, timeout=stream_timeout):
                pass
        else:
            fn(iter(request) if method.client_streaming else request, timeout=timeout)
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def status_problem(code, details: str, streaming: bool) -> str | None:
    """What is wrong with a call's outcome, or None."""
    allowed = OK_CODES | ({grpc.StatusCode.DEADLINE_EXCEEDED} if streaming else set())
    if code not in allowed:
        return f"{code.name}: {details[:200]!r}"
    if "\n" in details or len(details) > MAX_STATUS_LEN:
        return f"{code.name} not one short line: {details[:200]!r}"
    if code == grpc.StatusCode.INVALID_ARGUMENT and not details:
        return "INVALID_ARGUMENT without a message"
    return None


def report(problems: list[str]) -> str:
    """The problems, at most three of each kind (RPC and what went wrong)."""
    kinds: dict = {}
    for p in problems:
        kinds.setdefault(" ".join(p.split()[:1] + p.split()[2:4]), []).append(p)
    return f"{len(problems)} calls ended badly:\n" + "\n".join(p for ps in kinds.values() for p in ps[:3])


def files_under(root) -> set:
    out = set()
    for folder, _, names in os.walk(root):
        out.update(os.path.join(folder, n) for n in names)
    return out


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A working directory, temp dir and TFSYNC_HOME of the test's own; each must stay empty."""
    dirs = {name: tmp_path / name for name in ("cwd", "tmp", "home")}
    for d in dirs.values():
        d.mkdir()
    monkeypatch.chdir(dirs["cwd"])
    monkeypatch.setattr(tempfile, "tempdir", str(dirs["tmp"]))
    monkeypatch.setenv("TFSYNC_HOME", str(dirs["home"]))
    yield tmp_path
    for name, d in dirs.items():
        assert not files_under(d) and not os.listdir(d), f"written outside the servers' directories, in {name}: " \
                                                         f"{sorted(os.listdir(d))[:5]}"


# ---- job dicts: valid ones, and each field spoiled -------------------------------------------

def base_jobs(tmp_dir: str) -> list[dict]:
    plain = {
        "job": {"name": "fuzz", "run_dir": "runs/fuzz", "seed": 1},
        "cluster": {"workers": 2, "ps": 1, "host": "127.0.0.1"},
        "data": {"name": "mnist"},
        "model": {"name": "linear"},
        "train": {"batch_size": 16, "learning_rate": 0.05, "momentum": 0.9, "optimizer": "sgd", "epochs": 1.0,
                  "checkpoint_every": 0, "eval_every": 0, "eval_samples": 0, "timeout_s": 60.0},
        "protocol": [{"name": "bsp", "until": 0.5}, {"name": "asp"}],
        "switch": {"method": "hot", "lr": "linear", "batch": "local", "momentum": "keep", "point": "job",
                   "stragglers": "greedy", "straggler_window_s": 2.0, "straggler_k": 3, "readmit_after_s": 10.0},
        "inject": [{"worker": 1, "slowdown": 2.0, "start_s": 0.0, "duration_s": 5.0}],
    }
    users = {
        "job": {"name": "own", "run_dir": os.path.join(tmp_dir, "run")},
        "cluster": {"workers": 3, "hooks": ["127.0.0.1:7001", "10.0.0.2:7001"], "token_file": "token",
                    "task_ports": [20000, 20100]},
        "data": {"fn": "mydata.py:load", "args": {"n": 10, "nested": {"a": [1, 2.5, "x"]}}},
        "model": {"fn": "pkg.models:build", "args": {"units": 8}},
        "train": {"batch_size": 8, "learning_rate": {"schedule": "ExponentialDecay", "decay_steps": 10},
                  "optimizer": "adam", "optimizer_args": {"clipnorm": 1.0}, "loss": "MeanSquaredError",
                  "loss_args": {"reduction": "none"}},
        "protocol": [{"name": "ssp", "until": 0.3, "staleness": 2, "batch_sizes": [4, 8, 8]},
                     {"name": "pssp", "until": 0.6, "probability": "dynamic", "alpha": 0.5},
                     {"name": "lbbsp", "predictor": "ema", "lo": 2, "min_gain": 0.1}],
    }
    return [plain, users, {}]


def garbage(rng: random.Random, depth: int = 0):
    pick = rng.randrange(10 if depth < 3 else 8)
    if pick == 0:
        return rng.choice([None, True, False, b"bytes", (1, 2), {1, 2}, 1j])
    if pick in (1, 2):
        return rng.choice([0, 1, -1, 2, 65535, 65536, 2**31, 2**32, 2**63, -2**63 - 1, 10**9, 10**30, -10**30,
                           10**400, 10**5000, rng.randint(-10**6, 10**6)])
    if pick in (3, 4):
        return rng.choice([math.nan, math.inf, -math.inf, -0.0, 0.0, 1e308, -1e308, 5e-324, 0.5, 1.0, 2.5, 1e9,
                           rng.uniform(-10, 10)])
    if pick in (5, 6):
        return rng.choice(["", " ", "x" * 100_000, "\x00", "a\x00b", "a\nb", "é☃", "../../etc/passwd", "/",
                           "mnist", "bsp", "hot", "127.0.0.1:99999", "a:b", "x:y:z", "os:system", "a" * 300 + ".py:f",
                           rand_string(rng)])
    if pick == 7:
        return rng.choice([[], {}, [[[[]]]], {"": {}}, {1: 2}, {None: 1}]) if rng.random() < 0.5 else \
            _deep(rng.choice([50, 2000, 20_000]), rng.random() < 0.5)
    if pick == 8:
        return [garbage(rng, depth + 1) for _ in range(rng.choice([1, 2, 3, 10]))]
    return {rng.choice(["a", "name", "until", "", "x" * 300, "staleness", "worker"]): garbage(rng, depth + 1)
            for _ in range(rng.choice([1, 2, 3]))}


def _deep(n: int, as_dict: bool):
    v = 1
    for _ in range(n):
        v = {"a": v} if as_dict else [v]
    return v


def paths(d, prefix=()):
    """Every path into a nested dict/list (4 levels at most), containers included."""
    out = [prefix] if prefix else []
    items = () if len(prefix) >= 4 else d.items() if isinstance(d, dict) else \
        enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        out.extend(paths(v, (*prefix, k)))
    return out


KEY_NAMES = [f.split(".")[1] for f in CHECKS] + list(catalogue.option_names()) + \
            ["batch_sizes", "until", "name", "unknown", "", "Name", "workerz"]


def spoil(rng: random.Random, job: dict) -> tuple[dict, str]:
    """A deep copy of ``job`` with one to three random changes; returns it and what changed."""
    job = json.loads(json.dumps(job))
    done = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        where = [p for p in paths(job)] + [()]
        path = rng.choice(where)
        parent = job
        for k in path[:-1]:
            parent = parent[k]
        target = parent[path[-1]] if path else job
        op = rng.randrange(5)
        if op == 0 and path:  # replace a value with garbage
            parent[path[-1]] = garbage(rng)
        elif op == 1 and path and isinstance(parent, dict):  # drop a key
            del parent[path[-1]]
        elif op == 2 and isinstance(target, dict):  # a key it may or may not know
            target[rng.choice(KEY_NAMES + list(SECTIONS) + ["protocol", "inject"])] = garbage(rng)
        elif op == 3 and isinstance(target, dict):  # a known key, garbage value
            key = rng.choice(KEY_NAMES)
            target[key] = garbage(rng)
        else:  # a whole section
            sec = rng.choice(list(SECTIONS) + ["protocol", "inject", "nope"])
            job[sec] = garbage(rng)
            path = (sec,)
        done.append(".".join(map(str, path)) or "<top>")
    return job, ", ".join(done)


def check_config_error(e: ConfigError, source: str, what: str) -> None:
    text = str(e)
    assert "\n" not in text and len(text) <= MAX_STATUS_LEN, f"{what}: not one short line: {text[:300]!r}"
    assert text.startswith(f"{source}: "), f"{what}: {text[:200]!r}"
    # names a field: a dotted path, a [section], or the whole config
    named = e.field or "[" in text or "job config" in text
    assert named, f"{what}: names no field: {text[:300]!r}"


def parse(d, what: str):
    try:
        cfg = JobConfig.from_dict(d, source="fuzz.toml")
    except ConfigError as e:
        check_config_error(e, "fuzz.toml", what)
        return None
    except Exception as e:  # noqa: BLE001 - the point of the test
        pytest.fail(f"{what}: {type(e).__name__} instead of ConfigError: {str(e)[:300]}")
    text = json.dumps(cfg.to_dict(), sort_keys=True)  # a valid one round-trips through JSON (the manager's form)
    assert json.dumps(JobConfig.from_json(text).to_dict(), sort_keys=True) == text, what
    return cfg


def test_fuzzed_job_dicts_raise_config_error_naming_the_field(tmp_path):
    rng = random.Random(14)
    bases = base_jobs(str(tmp_path))
    for base in bases:
        assert parse(base, "base") is not None
    accepted = 0
    for i in range(1500):
        job, what = spoil(rng, rng.choice(bases))
        accepted += parse(job, f"case {i} ({what})") is not None
    deep = {"data": {"fn": "m:f", "args": {"a": _deep(5000, True)}}}
    for i, top in enumerate([None, [], "x", 1, math.nan, {"job": None}, {1: {}}, {"job": {1: 2}}, {"": {}}, deep,
                             _deep(5000, True), {"train": {"learning_rate": {"schedule": "CosineDecay",
                                                                             "x": _deep(3000, False)}}}]):
        parse(top, f"top-level case {i}")
    assert 0 < accepted < 1500  # both kinds were reached


BOUNDARY = [  # (section, key, value) the parser must refuse, naming section.key
    ("job", "seed", 10**30), ("job", "seed", 2**32), ("job", "run_dir", "a\x00b"), ("job", "run_dir", "d/" * 3000),
    ("train", "epochs", 1e308), ("train", "epochs", 10**400), ("train", "timeout_s", 1e300),
    ("train", "checkpoint_every", 10**30), ("train", "eval_samples", 2**63), ("switch", "readmit_after_s", 1e300),
    ("switch", "straggler_window_s", 1e300), ("cluster", "host", "h" * 5000), ("cluster", "hooks", ["127.0.0.1:99999"]),
    ("cluster", "hooks", ["127.0.0.1:0"]), ("data", "args", {"a": _deep(100, True)}), ("data", "args", {"b": b"x"}),
    ("data", "args", {"n": 10**30}), ("model", "fn", "a\x00b.py:f"), ("train", "learning_rate", 10**400),
    ("train", "learning_rate", {"schedule": "CosineDecay", "decay_steps": _deep(100, False)}),
    ("inject", "start_s", 1e300),
]


@pytest.mark.parametrize("section, key, value", BOUNDARY, ids=lambda v: str(v)[:20])
def test_boundary_values_are_refused_naming_the_field(tmp_path, section, key, value):
    plain, users, _ = base_jobs(str(tmp_path))
    job = json.loads(json.dumps(users if section in ("data", "model", "cluster") else plain))
    if section == "inject":
        job["inject"][0][key] = value
    else:
        job[section][key] = value
    with pytest.raises(ConfigError) as e:
        JobConfig.from_dict(job, source="fuzz.toml")
    check_config_error(e.value, "fuzz.toml", f"{section}.{key}")
    assert f"{section}{'[0]' if section == 'inject' else ''}.{key}" in str(e.value), str(e.value)


def test_fuzzed_job_files_raise_config_error(tmp_path):
    rng = random.Random(1414)
    bases = base_jobs(str(tmp_path))
    texts = [
        "[job]\nseed = 99999999999999999999999999999\n", "[job]\nseed = inf\n", "[train]\nepochs = nan\n",
        "[train]\nepochs = 1e400\n", "[train]\ntimeout_s = -inf\n", "[cluster]\nworkers = 1_000_000_000_000\n",
        "a = " + "[" * 5000 + "]" * 5000 + "\n", "a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n",
        "[job]\nrun_dir = \"a\\u0000b\"\n", "[job]\nrun_dir = \"" + "d/" * 3000 + "\"\n",
        "\ufeff[job]\nname = \"x\"\n", "[[protocol]]\nname = \"bsp\"\nuntil = 1e-400\n", "",
        "[job]\n" + "x = 1\n" * 10, "[cluster]\nhooks = [\"127.0.0.1:99999\"]\ntoken_file = \"t\"\n",
    ]
    for i, text in enumerate(texts):
        path = tmp_path / f"t{i}.toml"
        path.write_text(text, encoding="utf-8")
        _load(path, f"toml {text[:40]!r}")
    (tmp_path / "bin.toml").write_bytes(bytes(rng.randrange(256) for _ in range(500)))
    _load(tmp_path / "bin.toml", "binary")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    _load(tmp_path / "deep.json", "deep json")
    (tmp_path / "deepobj.json").write_text('{"job": ' * 100_000 + "1" + "}" * 100_000)
    _load(tmp_path / "deepobj.json", "deep json object")
    for bad_path in (tmp_path, tmp_path / "missing.toml", str(tmp_path / "a\x00b.toml"), tmp_path / ("x" * 5000)):
        _load(bad_path, f"path {str(bad_path)[-30:]!r}")
    for i in range(300):  # spoiled job dicts as JSON files (json writes NaN, Infinity, huge ints)
        job, what = spoil(rng, rng.choice(bases))
        try:
            text = json.dumps(job, default=str)
        except (ValueError, RecursionError):
            continue
        path = tmp_path / f"j{i}.json"
        path.write_text(text)
        _load(path, f"json case {i} ({what})")
    for i in range(100):  # TOML text with random damage
        text = '[job]\nname = "t"\nseed = 3\n[train]\nbatch_size = 8\nepochs = 0.5\n[[protocol]]\nname = "bsp"\n'
        chars = list(text)
        for _ in range(rng.randrange(1, 4)):
            chars.insert(rng.randrange(len(chars) + 1), rng.choice(["\x00", "[", "]", "=", '"', "\n", "inf",
                                                                    "nan", "9" * 30, "é", "{", "."]))
        path = tmp_path / f"m{i}.toml"
        path.write_text("".join(chars), encoding="utf-8")
        _load(path, f"damaged toml {i}")


def _load(path, what: str):
    try:
        return load_job(path)
    except ConfigError as e:
        text = str(e)
        assert "\n" not in text and len(text) <= MAX_STATUS_LEN + 5200, f"{what}: {text[:300]!r}"
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"{what}: {type(e).__name__} instead of ConfigError: {str(e)[:300]}")


# ---- the manager --------------------------------------------------------------------------

class NoCoordinators:
    """Coordinators that start nothing (no process, no file): the fuzz starts no jobs."""

    def __init__(self):
        self.started = []

    def start(self, job, run, resume=False):
        self.started.append((job.id, run.id, resume))


@pytest.fixture
def manager(sandbox, monkeypatch):
    root = sandbox / "manager"
    root.mkdir()
    store = Store(str(root / "jobs.db"))
    service = StandaloneService(store)
    service.command_wait_s = 0.01
    service.coordinators = NoCoordinators()
    job = store.create_job("live", "sig", {"job": {"name": "live"}}, run_dir=str(root / "run"))
    run = store.start_run(job.id)
    live = service.register(job.id, "live")
    live.run_id, live.workers = run.id, 2
    service.register("job-done", "done").workers = 2
    service.end("job-done")
    token = auth.new_token()
    server, port = transport.make_server("127.0.0.1:0", token=token, max_workers=8)
    manager_pb2_grpc.add_ManagerServicer_to_server(service, server)
    server.start()
    channel = transport.make_channel(f"127.0.0.1:{port}", token=token)
    wrong = transport.make_channel(f"127.0.0.1:{port}", token=auth.new_token())
    try:
        yield service, manager_pb2_grpc.ManagerStub(channel), manager_pb2_grpc.ManagerStub(wrong), job.id, root
    finally:
        channel.close()
        wrong.close()
        server.stop(grace=None).wait(5)
        store.close()


def manager_hints(rng: random.Random, service, live_id: str, tmp_dir: str) -> dict:
    bases = base_jobs(tmp_dir)

    def config_json():
        r = rng.random()
        if r < 0.3:
            job = json.loads(json.dumps(rng.choice(bases[:2])))
        elif r < 0.8:
            job, _ = spoil(rng, rng.choice(bases))
        else:
            return rand_string(rng)
        job.setdefault("job", {})
        if isinstance(job["job"], dict) and rng.random() < 0.8:
            job["job"]["run_dir"] = os.path.join(tmp_dir, "runs", "r")
        try:
            return json.dumps(job, default=str)
        except (ValueError, RecursionError):
            return "{}"

    sizes = [1, 2, 16, 64, 0, -1, 10**9, 2**31 - 1, -2**31]
    return {
        "job_id": lambda: rng.choice([live_id, live_id, "job-done", "job-done", "", "nope"] + list(service.jobs)[:5]),
        "request_id": lambda: rng.choice(["r1", "r2", "r3", "", "x" * 300]),
        "protocol": lambda: rng.choice(list(catalogue.names()) + ["", "BSP", "zipline", "x" * 1000]),
        "batch_sizes": lambda: [rng.choice(sizes) for _ in range(rng.choice([2, 2, 2, 1, 3, 0, 1000]))],
        "config_json": config_json,
        "node": lambda: rng.choice(["node-a", "node-b", "", "x" * 5000]),
        "kind": lambda: rng.choice(list(EVENT_KINDS) + ["", "other"]),
        "detail_json": lambda: rng.choice(["{}", '{"worker": 1}', "[1]", "not json", "[" * 100_000, "1e999"]),
        "workers": lambda: rng.choice([2, 2, 1, 0, -1, 10_000, 2**31 - 1]),
        "worker": lambda: rng.choice([0, 1, 2, -1, 2**31 - 1]),
        "run_id": lambda: rng.choice([service.jobs[live_id].run_id or 1, 0, -1, 999, 2**63 - 1]),
    }


OPTION_KEYS = list(catalogue.option_names()) + ["lr_scale", "", "x" * 300, "__class__", "sizer", "batch_size"]


def fuzz_switch(rng: random.Random, req):
    """Switch options: known and unknown names, boundary numbers."""
    req.options.clear()
    for _ in range(rng.choice([0, 1, 2])):
        req.options[rng.choice(OPTION_KEYS)] = rng.choice(DOUBLES + [2.0, 3.0, 10**30, 2**63, 0.3])
    return req


def manager_valid(rng: random.Random, service, live_id: str, tmp_dir: str) -> dict:
    """Good requests of each Manager RPC (lists for client streams), to spoil a field of."""
    m, now = manager_pb2, 1.7e9
    plain = base_jobs(tmp_dir)[0]
    plain["job"]["run_dir"] = os.path.join(tmp_dir, "runs", "good")
    live_run = service.jobs[live_id].run_id

    def sample():
        return m.ReportResourcesRequest(sample=common_pb2.ResourceSample(
            node="node-a", time=now, cpu_percent=12.5, memory_used_bytes=1 << 30, memory_total_bytes=1 << 32,
            memory_percent=25.0, processes=[common_pb2.ProcessSample(job_id=live_id, pid=10, alive=True,
                                                                     cpu_percent=99.0, rss_bytes=1 << 20)]))

    def attach():
        return [m.CoordinatorMessage(hello=m.AttachHello(job_id=live_id, run_id=live_run, workers=2, protocol="bsp")),
                m.CoordinatorMessage(step=m.StepRecord(job_id=live_id, run_id=live_run, worker=rng.choice([0, 1]),
                                                       step=rng.randrange(1, 100), start=now, end=now + 0.1,
                                                       samples=16, loss=0.5, batch_size=16, protocol="bsp")),
                m.CoordinatorMessage(event=m.RunEvent(kind="checkpoint", time=now, detail_json='{"step": 3}')),
                m.CoordinatorMessage(result=m.CommandResult(command_id="c1", ok=True, message="done", step=3))]

    return {
        "SubmitJob": lambda: m.SubmitJobRequest(request_id=f"s{rng.randrange(10**6)}", config_json=json.dumps(plain)),
        "GetStatus": lambda: m.GetStatusRequest(job_id=live_id),
        "StreamMetrics": lambda: m.StreamMetricsRequest(job_id="job-done", from_step=rng.choice([0, 1, 10])),
        "Switch": lambda: m.SwitchRequest(request_id=f"w{rng.randrange(10**6)}", job_id=live_id, protocol="ssp",
                                          method=m.SWITCH_METHOD_HOT, options={"staleness": 2}),
        "SetBatchSizes": lambda: m.SetBatchSizesRequest(job_id=live_id, batch_sizes=[16, 16]),
        "Checkpoint": lambda: m.CheckpointRequest(job_id=live_id),
        "Scale": lambda: m.ScaleRequest(job_id=live_id, workers=rng.choice([1, 3])),
        "Join": lambda: m.JoinRequest(job_id=rng.choice([live_id, ""]), hook_address="127.0.0.1:7070",
                                      workers=rng.choice([0, 1, 2])),
        "Stop": lambda: m.StopRequest(job_id=live_id, checkpoint=True),
        "Resume": lambda: m.ResumeRequest(job_id=rng.choice(list(service.jobs))),
        "ReportResources": sample,
        "StreamReportResources": lambda: [sample() for _ in range(3)],
        "Attach": attach,
    }


def test_fuzzed_manager_calls_get_proper_statuses(manager, monkeypatch, caplog):
    service, stub, wrong, live_id, root = manager
    watch = Watch(monkeypatch)
    rng = random.Random(7)
    tmp_dir = str(root.parent / "tmp" / "x")
    fuzz = Fuzzer(rng, manager_hints(rng, service, live_id, tmp_dir))
    valid = manager_valid(rng, service, live_id, tmp_dir)
    methods = manager_pb2.DESCRIPTOR.services_by_name["Manager"].methods
    seen, problems = {}, []
    for method in methods:
        cls = getattr(manager_pb2, method.input_type.name)
        n = CALLS if not method.server_streaming else CALLS // 5  # a stream takes up to 0.3 s
        for i in range(n):
            if method.client_streaming:
                if rng.random() < 0.6:
                    request = valid[method.name]()
                    if rng.random() < 0.85:
                        fuzz.mutate(rng.choice(request))
                else:
                    request = [fuzz.request(cls) for _ in range(rng.choice([0, 1, 2, 5]))]
            else:
                request = fuzz.request(cls, valid[method.name])
                if method.name == "Switch" and rng.random() < 0.4:
                    fuzz_switch(rng, request)
            code, details = call(stub, method, request)
            problem = status_problem(code, details, method.server_streaming)
            if method.name == "Attach" and not problem:  # whatever it said, the job's status is still served
                try:
                    stub.GetStatus(manager_pb2.GetStatusRequest(job_id=live_id), timeout=5)
                except grpc.RpcError as e:
                    problem = f"then GetStatus: {e.code().name}: {(e.details() or '')[:200]}"
            if problem:
                problems.append(f"Manager.{method.name} #{i}: {problem}")
            seen.setdefault(method.name, set()).add(code)
        # a wrong token is refused, and a good call is still answered
        code, _ = call(wrong, method, [] if method.client_streaming else cls())
        assert code == grpc.StatusCode.UNAUTHENTICATED, f"{method.name} with a wrong token: {code}"
        assert stub.GetStatus(manager_pb2.GetStatusRequest(job_id=live_id), timeout=5).job_id == live_id
    try:
        service.board.flush()  # the resource samples taken are storable
    except Exception as e:  # noqa: BLE001
        problems.append(f"ResourceBoard.flush: {type(e).__name__}: {str(e)[:200]}")
    problems += [f"thread {t}" for t in watch.thread_errors]
    assert not problems, report(problems)
    errors = [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not errors, errors[:3]
    both = {name for name, codes in seen.items() if {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT} <= codes}
    assert both >= {"SubmitJob", "Switch", "SetBatchSizes", "ReportResources", "Attach"}, seen
    status = stub.GetStatus(manager_pb2.GetStatusRequest(job_id=live_id), timeout=5)
    assert status.step >= 0 and len(status.batch_sizes) == 2
    # only the store (and SQLite's side files) in the manager's directory
    assert {os.path.basename(p) for p in files_under(root)} <= {"jobs.db", "jobs.db-wal", "jobs.db-shm"}


# ---- the hook -----------------------------------------------------------------------------

def loopback_only(host):
    """A resolver that asks no name server (the fuzzed specs' names stay on this machine)."""
    if host != "localhost":
        raise OSError(f"{host} is not resolved in this test")
    return {"127.0.0.1", "::1"}


@pytest.fixture
def hook(sandbox, monkeypatch):
    monkeypatch.setattr(hook_tasks, "resolve", loopback_only)   # the hook's firewall resolves the spec's names
    logs = sandbox / "hook-logs"
    token = auth.new_token()
    # the task program ignores its arguments and exits: no TF process, ever
    server, port = node.serve(token=token, log_dir=str(logs), node="node-a", task_command=("/bin/true",))
    channel = transport.make_channel(f"127.0.0.1:{port}", token=token)
    wrong = transport.make_channel(f"127.0.0.1:{port}", token=auth.new_token())
    try:
        yield node_hook_pb2_grpc.NodeHookStub(channel), node_hook_pb2_grpc.NodeHookStub(wrong), logs
    finally:
        channel.close()
        wrong.close()
        server.stop(grace=None)


def hook_hints(rng: random.Random, ports: list[int]) -> dict:

    def spec():
        r = rng.random()
        hosts = ["127.0.0.1", "localhost", "[::1]", "::1", "[zz]", "a:b", "...", "-", "x" * 300, "1.2.3.4.5"]
        if r < 0.5:
            ps = [f"127.0.0.1:{ports[0]}"]
            workers = [f"{rng.choice(hosts[:3]) if rng.random() < 0.8 else rng.choice(hosts)}:{p}" for p in ports[1:]]
            return json.dumps({"chief": [f"127.0.0.1:{ports[3]}"], "ps": ps, "worker": workers})
        if r < 0.65:  # large, valid: 1 MB of addresses
            n = rng.choice([10, 1000, 60_000])
            return json.dumps({"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{1 + i % 65000}"
                                                                           for i in range(n)]})
        if r < 0.8:
            return json.dumps({rng.choice(["ps", "worker", "", "x"]): [rng.choice([
                "127.0.0.1:0", "127.0.0.1:65536", "h:1", ":1", "127.0.0.1:-1", 5, None, "a b:1"])]})
        return rand_string(rng)

    def tasks():
        return [common_pb2.TaskRef(job=rng.choice(["ps", "worker", "chief", "evaluator", "", "x" * 1000]),
                                   index=rng.choice([0, 1, 2, -1, 2**31 - 1])) for _ in range(rng.choice([0, 1, 2, 3]))]

    return {
        "job_id": lambda: rng.choice(["job-1", "job-1", "job-2", "", "../etc", "x" * 65, "a/b", "x" * 5000]),
        "cluster_spec_json": spec,
        "tasks": tasks,
        "job": lambda: rng.choice(["ps", "worker", "chief", "x" * 5000]),
        "index": lambda: rng.choice([0, 1, -1, 2**31 - 1]),
        "key": lambda: rng.choice(sorted(ENV_ALLOWLIST) + ["LD_PRELOAD", "PATH", "", "A=B", "x" * 5000]),
        "value": lambda: rng.choice(["1", "", "x" * 257, "a\x00b", "0,1"]),
        "netns": lambda: rng.choice(["", "", "", "tfsync-1-1", "tfsync-99999999-1", "../x", "x" * 5000]),
        "wait_ready_s": lambda: rng.choice([0.0, 0.0, 0.1, -1.0, math.nan, math.inf, 1e300, 600.0, 601.0]),
        "interval_s": lambda: rng.choice([0.05, 0.1, 0.01, 0.0, -1.0, math.nan, math.inf, 1e300, 1e9, 3600.0]),
        "max_samples": lambda: rng.choice([1, 2, 0, -1, 2**31 - 1]),
        "expected_pid": lambda: rng.choice([0, 1, -1, os.getpid(), 2**31 - 1]),
    }


def hook_valid(rng: random.Random, ports: list[int]) -> dict:
    """Good requests of each NodeHook RPC, to spoil a field of."""
    h, ref = node_hook_pb2, common_pb2.TaskRef
    spec = json.dumps({"chief": [f"127.0.0.1:{ports[3]}"], "ps": [f"127.0.0.1:{ports[0]}"],
                       "worker": [f"127.0.0.1:{ports[1]}", f"localhost:{ports[2]}"]})

    def task():
        return rng.choice([ref(job="ps", index=0), ref(job="worker", index=0), ref(job="worker", index=1)])

    return {
        "StartTasks": lambda: h.StartTasksRequest(job_id="job-1", cluster_spec_json=spec, tasks=[task()],
                                                  env={"OMP_NUM_THREADS": "1"}),
        "StopTasks": lambda: h.StopTasksRequest(job_id="job-1", tasks=rng.choice([[], [task()]])),
        "RestartTask": lambda: h.RestartTaskRequest(job_id="job-1", task=task()),
        "StreamResources": lambda: h.StreamResourcesRequest(interval_s=0.05, max_samples=1,
                                                            job_id=rng.choice(["", "job-1"])),
        "Health": lambda: h.HealthRequest(),
        "FreePorts": lambda: h.FreePortsRequest(first=ports[0], last=ports[0] + 50, count=rng.choice([1, 2, 5])),
        "StageFile": lambda: [h.FileChunk(stage_id="job-1", name="data/x.bin", size=3,
                                          sha256=hashlib.sha256(b"abc").hexdigest()), h.FileChunk(data=b"abc")],
    }


def test_fuzzed_hook_calls_get_proper_statuses_and_refused_ones_leave_nothing(hook, monkeypatch, caplog):
    stub, wrong, logs = hook
    watch = Watch(monkeypatch)
    rng = random.Random(11)
    ports = free_ports(4)
    fuzz = Fuzzer(rng, hook_hints(rng, ports))
    valid = hook_valid(rng, ports)
    methods = node_hook_pb2.DESCRIPTOR.services_by_name["NodeHook"].methods
    seen, problems = {}, []
    for method in methods:
        cls = getattr(node_hook_pb2, method.input_type.name)
        n = CALLS if not method.server_streaming else CALLS // 4
        for i in range(n):
            if method.client_streaming:
                request = valid[method.name]()
                if rng.random() < 0.85:
                    fuzz.mutate(rng.choice(request))
            else:
                request = fuzz.request(cls, valid[method.name])
            before = files_under(logs) if logs.exists() else set()
            code, details = call(stub, method, request)
            what = f"NodeHook.{method.name} #{i}"
            problem = status_problem(code, details, method.server_streaming)
            if problem:
                problems.append(f"{what}: {problem}")
            after = files_under(logs) if logs.exists() else set()
            if code != grpc.StatusCode.OK and after != before:
                problems.append(f"{what} was refused ({details[:100]!r}) but left {sorted(after - before)[:2]}")
            seen.setdefault(method.name, set()).add(code)
        code, _ = call(wrong, method, [] if method.client_streaming else cls())
        assert code == grpc.StatusCode.UNAUTHENTICATED, f"{method.name} with a wrong token: {code}"
        assert stub.Health(node_hook_pb2.HealthRequest(), timeout=5).node == "node-a"
    problems += [f"thread {t}" for t in watch.thread_errors]
    assert not problems, report(problems)
    both = {name for name, codes in seen.items() if {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT} <= codes}
    assert both >= {"StartTasks", "StopTasks", "RestartTask", "StreamResources"}, seen
    errors = [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not errors, errors[:3]
    # task logs only, each in its job's folder, and staged files in their stage
    for path in files_under(logs):
        rel = os.path.relpath(path, logs).split(os.sep)
        assert (len(rel) == 2 and rel[1].endswith(".log")) or rel[0] == "stage", path


# ---- the cases the fuzz found, one by one --------------------------------------------------

def _rpc_error(fn, *args, **kw) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        fn(*args, **kw)
    return e.value


def _start_request(spec: dict | str, job: str = "ps", **kw):
    return node_hook_pb2.StartTasksRequest(
        job_id="job-1", cluster_spec_json=spec if isinstance(spec, str) else json.dumps(spec),
        tasks=[common_pb2.TaskRef(job=job, index=0)], **kw)


def test_a_1mb_cluster_spec_is_refused_and_leaves_no_log_file(hook):
    stub, _, logs = hook
    ports = free_ports(2)
    spec = {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{1 + i % 65000}" for i in range(60_000)]}
    e = _rpc_error(stub.StartTasks, _start_request(spec), timeout=10)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "cluster spec is" in e.details(), e.details()
    assert len(e.details()) < 300 and (not logs.exists() or not files_under(logs))
    ok = stub.StartTasks(_start_request({"ps": [f"127.0.0.1:{ports[0]}"]}), timeout=10)  # still serving
    assert ok.tasks[0].log_path.startswith(str(logs))


def test_a_task_program_that_cannot_start_leaves_no_log_file(sandbox):
    logs = sandbox / "hook-logs"
    token = auth.new_token()
    server, port = node.serve(token=token, log_dir=str(logs), node="node-a",
                              task_command=(str(sandbox / "no-such-program"),))
    try:
        with transport.make_channel(f"127.0.0.1:{port}", token=token) as channel:
            stub = node_hook_pb2_grpc.NodeHookStub(channel)
            e = _rpc_error(stub.StartTasks, _start_request({"ps": ["127.0.0.1:1"]}), timeout=10)
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, (e.code(), e.details())
            assert "could not start" in e.details() and "\n" not in e.details()
            assert not logs.exists() or not files_under(logs)
            assert stub.Health(node_hook_pb2.HealthRequest(), timeout=5).tasks == []
    finally:
        server.stop(grace=None)


@pytest.mark.parametrize("address", ["a:b:1234", "...:1234", "-:1234", "[zz]:1234", "x" * 300 + ":1234"])
def test_a_host_that_is_no_host_is_refused_before_anything_runs(sandbox, address):
    logs = sandbox / "hook-logs"
    token = auth.new_token()
    # a task that stays up (Health then asks whether its port is open)
    server, port = node.serve(token=token, log_dir=str(logs), node="node-a", task_command=("/bin/sh", "-c", "sleep 20"))
    try:
        with transport.make_channel(f"127.0.0.1:{port}", token=token) as channel:
            stub = node_hook_pb2_grpc.NodeHookStub(channel)
            spec = {"ps": ["127.0.0.1:1"], "worker": [address]}
            e = _rpc_error(stub.StartTasks, _start_request(spec, job="worker"), timeout=10)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "not host:port" in e.details(), e.details()
            assert not logs.exists() or not files_under(logs)
            assert stub.Health(node_hook_pb2.HealthRequest(), timeout=5).tasks == []
    finally:
        server.stop(grace=None)


def test_port_open_is_false_for_a_host_that_does_not_resolve():
    from tfsync.hooks.tasks import port_open
    assert not port_open("...:80") and not port_open("a:b:80") and not port_open("[zz]:80")


@pytest.mark.parametrize("field, value, words", [
    ("wait_ready_s", math.inf, "wait_ready_s"), ("wait_ready_s", math.nan, "wait_ready_s"),
    ("wait_ready_s", -1.0, "wait_ready_s"), ("netns", "x" * 5000, "network namespace"),
])
def test_bad_start_fields_are_refused_before_anything_runs(hook, field, value, words):
    stub, _, logs = hook
    e = _rpc_error(stub.StartTasks, _start_request({"ps": [f"127.0.0.1:{free_ports(1)[0]}"]}, **{field: value}),
                   timeout=10)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and words in e.details() and len(e.details()) < 300
    assert not logs.exists() or not files_under(logs)


@pytest.mark.parametrize("interval", [1e300, math.inf, 1e9])
def test_stream_resources_refuses_an_interval_too_long_to_wait(hook, interval):
    stub, _, _ = hook
    e = _rpc_error(lambda: list(stub.StreamResources(node_hook_pb2.StreamResourcesRequest(interval_s=interval),
                                                     timeout=5)))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "interval_s" in e.details()


def _attach(stub, *messages, timeout=5.0):
    return list(stub.Attach(iter([manager_pb2.CoordinatorMessage(**m) for m in messages]), timeout=timeout))


def test_attach_refuses_bad_numbers_and_the_job_stays_served(manager, monkeypatch):
    service, stub, _, live_id, _ = manager
    watch = Watch(monkeypatch)
    m, run = manager_pb2, service.jobs[live_id].run_id
    hello = {"hello": m.AttachHello(job_id=live_id, run_id=run, workers=2, protocol="bsp")}
    bad_hellos = [(m.AttachHello(job_id=live_id, run_id=run, workers=2**31 - 1), "hello.workers"),
                  (m.AttachHello(job_id=live_id, run_id=run, workers=-1), "hello.workers"),
                  (m.AttachHello(job_id=live_id, run_id=run + 999, workers=2), "hello.run_id"),
                  (m.AttachHello(job_id=live_id, run_id=run, workers=2, step=-5), "hello.step")]
    for bad, words in bad_hellos:
        e = _rpc_error(_attach, stub, {"hello": bad})
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and words in e.details(), e.details()
    good = m.StepRecord(worker=1, step=3, start=1.7e9, end=1.7e9 + 1, samples=16, batch_size=16, protocol="bsp")
    bad_steps = [("end", math.nan), ("start", math.inf), ("worker", 2), ("worker", -1), ("step", -1),
                 ("batch_size", -16), ("protocol", "x" * 5000)]
    for name, value in bad_steps:
        step = m.StepRecord()
        step.CopyFrom(good)
        setattr(step, name, value)
        e = _rpc_error(_attach, stub, hello, {"step": step})
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and f"step.{name}" in e.details(), e.details()
    for ev in (m.RunEvent(kind="checkpoint", time=math.nan), m.RunEvent(kind="switch", time=-1.0),
               m.RunEvent(kind="switch", time=1.7e9, detail_json="[" * 100_000)):
        e = _rpc_error(_attach, stub, hello, {"event": ev})
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "event." in e.details(), e.details()
    _attach(stub, hello, {"event": m.RunEvent(kind="switch", time=1.7e9, detail_json="[" * 5000)})  # kept as text
    _attach(stub, hello, {"step": good}, {"event": m.RunEvent(kind="checkpoint", time=1.7e9, detail_json="[1]")})
    status = stub.GetStatus(m.GetStatusRequest(job_id=live_id), timeout=5)
    assert status.step == 3 and list(status.batch_sizes) == [0, 16]
    service._flush(service.jobs[live_id])
    assert [s.step for s in service.store.steps(run)] == [3]
    assert service.store.events(run)[-1].detail == {"value": [1]}
    assert not watch.thread_errors, watch.thread_errors


@pytest.mark.parametrize("field, value", [("cpu_percent", math.nan), ("time", math.inf), ("memory_percent", -1.0),
                                          ("node", "x" * 5000)])
def test_resource_samples_that_cannot_be_stored_are_refused(manager, field, value):
    service, stub, _, _, _ = manager
    sample = common_pb2.ResourceSample(node="node-a", time=1.7e9, cpu_percent=5.0, memory_percent=5.0)
    setattr(sample, field, value)
    e = _rpc_error(stub.ReportResources, manager_pb2.ReportResourcesRequest(sample=sample), timeout=5)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and field in e.details(), e.details()
    service.board.flush()


@pytest.mark.parametrize("options, words", [({"staleness": 1e300}, "staleness"), ({"depth": 1e300}, "depth"),
                                            ({"lr_scale": 1e300}, "lr_scale"), ({"x" * 5000: 1.0}, "xxx")])
def test_switch_options_out_of_bounds_are_refused(manager, options, words):
    _, stub, _, live_id, _ = manager
    e = _rpc_error(stub.Switch, manager_pb2.SwitchRequest(job_id=live_id, protocol="ssp", options=options), timeout=5)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and words in e.details() and len(e.details()) < 400


@pytest.mark.parametrize("config_json", ["[" * 100_000, '{"job": ' * 100_000, "1" * 5000, "nope"])
def test_submit_job_refuses_json_it_cannot_read(manager, config_json):
    service, stub, _, _, _ = manager
    e = _rpc_error(stub.SubmitJob, manager_pb2.SubmitJobRequest(config_json=config_json), timeout=10)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details().startswith("config_json: "), e.details()
    assert not service.coordinators.started


# ---- token files and command-line numbers (issue 31, item 9) ---------------------------------

def token_contents(rng: random.Random) -> list[bytes]:
    """Token-file contents: empty, blank, non-ASCII, binary, control characters, huge, and good ones."""
    fixed = [b"", b"\n", b" \t\n", "tök€n\n".encode(), b"\xff\xfe\x00", b"a\x00b", b"two words\n", b"a\nb\n",
             b"\x1b[31mred", b"x" * 4096, b"x" * 4097, b"x" * (10 << 20),
             auth.new_token().encode() + b"\n"]
    rand = [rng.randbytes(rng.randrange(1, 300)) for _ in range(40)]
    printable = [rand_string(rng).encode("utf-8", "surrogatepass") for _ in range(40)]
    return fixed + rand + printable


def test_fuzzed_token_files_are_read_or_refused_in_one_line(tmp_path):
    path = tmp_path / "token"
    for i, content in enumerate(token_contents(random.Random(5))):
        path.write_bytes(content)
        path.chmod(0o600)
        try:
            token = auth.read_token(path)
        except auth.TokenFileError as e:
            text = str(e)
            assert "\n" not in text and len(text) <= MAX_STATUS_LEN and str(path) in text, f"#{i}: {text[:300]!r}"
            continue
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"#{i} {content[:40]!r}: {type(e).__name__} instead of TokenFileError: {str(e)[:200]}")
        assert token == content.strip().decode("ascii") and len(token) <= 4096, f"#{i}: {content[:40]!r}"
        assert all(0x21 <= b <= 0x7E for b in token.encode()), f"#{i}: {content[:40]!r} is no token"


def test_command_line_numbers_beyond_the_api_range_are_one_line_naming_them(tmp_path, capsys):
    """Batch sizes are int32 and steps int64 in the API: a number past them, or below the
    least, is refused in one line by the command line, before any call; a batch size the API
    carries but no worker can take, by the manager, in the line the engine would give."""
    from helpers import job_manager, tfsync_here

    rng = random.Random(11)
    numbers = [0, 1, -1, 16, 2**31 - 1, 2**31, -2**31, 2**63 - 1, 2**63, -2**63 - 1, 2**64, 10**30, -10**30,
               99999999999] + [rng.randint(-2**70, 2**70) for _ in range(6)]
    problems = []
    with job_manager(tmp_path) as (_, _, runs):
        for n in numbers:
            # a batch size the API carries but no worker can take (< 1) is the manager's to refuse
            for argv, lo, hi, name in ((["batch-sizes", str(runs["live"]), str(n), "16"], -2**31, 2**31 - 1,
                                        "batch size"),
                                       (["metrics", str(runs["done"]), "--from-step", str(n)], 0, 2**63 - 1,
                                        "--from-step")):
                try:
                    code, _, err = tfsync_here(capsys, *argv)   # through the command line's one error handler
                except Exception as e:  # noqa: BLE001
                    code, err = f"{type(e).__name__}: {str(e)[:100]}", capsys.readouterr().err
                lines = err.splitlines()
                if argv[0] == "batch-sizes" and lo <= n < 1:
                    if not (code == 2 and lines == [f"tfsync: error: INVALID_ARGUMENT: batch sizes [{n}, 16]: "
                                                    "expected 2 integers >= 1, one per worker"]):
                        problems.append(f"{argv[0]} {n}: {code}, {err[:200]!r}")
                elif lo <= n <= hi and (code != 0 or err):
                    problems.append(f"{argv[0]} {n}: {code}, {err[:200]!r}")
                elif not lo <= n <= hi and not (code == 2 and len(lines) == 1 and
                                                 lines[0].startswith(f"tfsync: error: {name} {n}: ")):
                    problems.append(f"{argv[0]} {n}: {code}, {err[:200]!r}")
    assert not problems, f"{len(problems)} numbers: " + "; ".join(problems[:4])


def test_a_request_id_reused_for_another_command_is_refused_and_a_retry_is_not(manager):
    """A reused request_id used to return the first command's answer and drop the second."""
    service, stub, _, live_id, root = manager
    m = manager_pb2
    first = stub.Stop(m.StopRequest(request_id="r1", job_id=live_id, checkpoint=True), timeout=5)
    again = stub.Stop(m.StopRequest(request_id="r1", job_id=live_id, checkpoint=True), timeout=5)
    assert again.duplicate and again.command_id == first.command_id
    for other in (lambda: stub.Checkpoint(m.CheckpointRequest(request_id="r1", job_id=live_id), timeout=5),
                  lambda: stub.Stop(m.StopRequest(request_id="r1", job_id=live_id, checkpoint=False), timeout=5)):
        e = _rpc_error(other)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "request_id 'r1' was used for another command" \
            in e.details(), e.details()
    assert service.jobs[live_id].commands.qsize() == 1   # the one Stop, issued once
    plain = base_jobs(str(root))[0]
    plain["job"]["run_dir"] = str(root / "runs" / "a")
    submit = m.SubmitJobRequest(request_id="s1", config_json=json.dumps(plain))
    job_id = stub.SubmitJob(submit, timeout=10).job_id
    assert stub.SubmitJob(submit, timeout=10).job_id == job_id
    plain["train"]["epochs"] = 2.0
    e = _rpc_error(stub.SubmitJob, m.SubmitJobRequest(request_id="s1", config_json=json.dumps(plain)), timeout=10)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and f"another submission (job {job_id})" in e.details()
    assert len(service.coordinators.started) == 1

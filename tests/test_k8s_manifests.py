"""`tfsync k8s` (tfsync.deploy.k8s, tfsync.deploy.manifests, tfsync.cli.k8s): the
manifests of a job validate against the Kubernetes API's schema (kubernetes-validate's
copy of it, offline), and say what matters: the chief runs `tfsync run` with its manager
on the port it declares, each joining node pod joins at the chief's Service name, the
tokens are only files of a mounted Secret, every pod has probes and GRPC_FAIL_FAST, the
Jobs' failure policy holds tfsync's exit codes, TF_CONFIG pods get what `tfsync tfconfig`
writes, and what the pods could not honour is refused in one line. No cluster, no TF."""

import importlib.metadata
import json
import os
import re
import stat
import subprocess

import pytest
from packaging.requirements import Requirement

from tfsync.base import exits
from tfsync.deploy import k8s
from tfsync.deploy.manifests import manifests
from tfsync.deploy.yamltext import dump_all
from tfsync.cli import build_parser, main
from tfsync.cli.k8s import DEFAULT_IMAGE, k8s_job

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = """\
[job]
name = "Reg_Job.1"
run_dir = "runs/here"

[cluster]
workers = 2
ps = 1
max_workers = 4

[model]
fn = "model.py:build"

[data]
fn = "lib/data.py:load"

[train]
loss = "MeanSquaredError"
batch_size = 16

[[protocol]]
name = "bsp"
"""
VERSIONS = ("1.30", None)   # the oldest Kubernetes we claim, and the newest the validator knows (None)


def job_file(tmp_path, text=JOB):
    folder = tmp_path / "proj"
    (folder / "lib").mkdir(parents=True)
    (folder / "job.toml").write_text(text)
    (folder / "model.py").write_text("def build(units=8):\n    raise NotImplementedError\n")
    (folder / "lib" / "data.py").write_text("def load():\n    raise NotImplementedError\n")
    (folder / "lib" / "helper.py").write_text("HELP = 1\n")
    return folder / "job.toml"


def build(path, *options):
    job = k8s_job(build_parser().parse_args(["k8s", str(path), *options]))
    return job, manifests(job)


def one(docs, kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def pod_specs(docs):
    """(object, pod spec) of every Job and StatefulSet."""
    return [(d, d["spec"]["template"]["spec"]) for d in docs if d["kind"] in ("Job", "StatefulSet")]


def containers(docs, init=True):
    return [c for _, spec in pod_specs(docs) for c in [*(spec.get("initContainers", []) if init else []),
                                                        *spec["containers"]]]


def options(args, name):
    """The values of ``name`` in an argument list."""
    return [args[i + 1] for i, a in enumerate(args) if a == name]


def chief_sets(docs, name):
    """The chief's `--set` overrides as {key: TOML text}."""
    args = one(docs, "Job", f"{name}-chief")["spec"]["template"]["spec"]["containers"][0]["args"]
    return dict(text.split("=", 1) for text in options(args, "--set"))


# -- the schema ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mode_options", [
    [],
    ["--storage", "10Gi", "--storage-class", "fast", "--no-secret", "--cpu-limit", "2", "--nodes", "2"],
    ["--mode", "tfconfig", "--storage", "10Gi", "--workers", "3", "--ps", "2"],
])
def test_every_manifest_the_command_writes_validates_against_the_kubernetes_api_schema(tmp_path, mode_options):
    validator = pytest.importorskip("kubernetes_validate", reason="the schema check needs the 'test' extra's "
                                    "kubernetes-validate (pip install kubernetes-validate)")
    import yaml

    out = tmp_path / "out"
    assert main(["k8s", str(job_file(tmp_path)), "--out", str(out), *mode_options]) == 0
    files = sorted(out.iterdir())
    docs = [yaml.safe_load(f.read_text()) for f in files]
    assert {d["kind"] for d in docs} >= {"ConfigMap", "NetworkPolicy", "Service", "Job"}
    for version in VERSIONS:
        for f, doc in zip(files, docs):
            try:   # strict: no field the API does not know
                validator.validate(doc, version or validator.latest_version(), strict=True)
            except validator.ValidationError as e:
                pytest.fail(f"{f.name} against Kubernetes {version}: {'.'.join(map(str, e.path))}: {e.message}")
    for d in docs:   # what the API server checks beyond the schema
        names = [d["metadata"]["name"]] + [spec.get("hostname") for _, spec in pod_specs([d]) if spec.get("hostname")]
        assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", n) and len(n) <= 63 for n in names), names
        if d["kind"] == "StatefulSet":
            assert len(d["metadata"]["name"]) <= 52   # its pods' controller-revision-hash label
        if d["kind"] == "Job":   # a podFailurePolicy needs restartPolicy Never
            assert d["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == (0o600 if "-secret-" in f.name else 0o644), f.name


def test_the_yaml_reads_back_as_the_objects_it_was_written_from(tmp_path):
    yaml = pytest.importorskip("yaml", reason="PyYAML comes with the 'test' extra's kubernetes-validate")
    _, docs = build(job_file(tmp_path), "--namespace", "on")
    tricky = {"no": "no", "0400": "0400", "n": ["1e3", "0.0.0.0:7000", "", " lead", "trail ", "a: b", "#x", "null"],
              "text": "line\n\n  indented\nlast", "ends": "x\n\n\n", "odd": "\x85\u2028\t\"\\\x01\U0001f600",
              "deep": [[1, [2, {"a": []}]], {}], "bools": [True, False, None, 0, -3]}
    assert list(yaml.safe_load_all(dump_all([*docs, tricky]))) == [*docs, tricky]


# -- what the pods run --------------------------------------------------------------------------
def test_the_chief_runs_tfsync_run_with_its_manager_on_the_port_it_declares(tmp_path):
    given = 'data.args.tag="$(GRPC_FAIL_FAST) $$HOME"'
    job, docs = build(job_file(tmp_path), "--manager-port", "7100", "--set", given)
    assert job.name == "reg-job-1"   # job.name made a DNS label
    spec = one(docs, "Job", "reg-job-1-chief")["spec"]["template"]["spec"]
    chief = spec["containers"][0]
    assert chief["command"][:3] == ["/bin/sh", "-c", k8s.CHIEF_SCRIPT] and 'exec tfsync run "$@"' in chief["command"][2]
    run = build_parser().parse_args(["run", *chief["args"]])   # arguments `tfsync run` takes
    assert run.manager_listen == "0.0.0.0:7100" and run.allow_remote
    assert run.job == f"{k8s.JOB_DIR}/job.toml" and run.run_dir == f"{k8s.RUNS}/reg-job-1" == chief["command"][4]
    assert {"name": "manager", "containerPort": 7100} in chief["ports"]
    service = one(docs, "Service", "reg-job-1-chief")
    assert service["spec"]["ports"][0]["port"] == 7100 and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= one(docs, "Job", "reg-job-1-chief")["spec"]["template"][
        "metadata"]["labels"].items()
    assert "TF_CONFIG" not in {e["name"] for e in chief["env"]}
    env = {e["name"]: e.get("value", "") for e in chief["env"]}   # the user's --set arrives as given
    assert [kubelet_expand(a, env) for a in options(chief["args"], "--set")][-1] == given
    waits = [c for c in spec["initContainers"] if c["name"] == "wait"]   # for the nodes, with a limit
    assert waits and waits[0]["command"][3:5] == ["wait", str(k8s.START_WAIT_S)]


def test_the_chief_script_resumes_where_a_checkpoint_is_kept_and_runs_otherwise(tmp_path):
    bin_dir, run_dir, seen = tmp_path / "bin", tmp_path / "run", tmp_path / "seen"
    bin_dir.mkdir()
    (bin_dir / "tfsync").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {seen}\n')
    (bin_dir / "tfsync").chmod(0o755)

    def chief():
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        subprocess.run(["/bin/sh", "-c", k8s.CHIEF_SCRIPT, "tfsync-chief", str(run_dir), "job.toml", "--set",
                        'a="x y"'], env=env, check=True, timeout=30)
        return seen.read_text().splitlines()

    assert chief() == ["run", "job.toml", "--set", 'a="x y"']
    (run_dir / "checkpoints").mkdir(parents=True)
    assert chief()[0] == "run"   # an empty folder holds no checkpoint
    (run_dir / "checkpoints" / "ckpt-200").mkdir()
    assert chief() == ["resume", "job.toml", "--set", 'a="x y"']


def test_the_nodes_are_the_chiefs_hooks_and_the_joining_ones_join_at_its_service_name(tmp_path):
    job, docs = build(job_file(tmp_path), "--namespace", "team-a", "--nodes", "2")
    ns = "team-a"
    listed, joining = one(docs, "StatefulSet", "reg-job-1-node"), one(docs, "StatefulSet", "reg-job-1-join")
    chief_service = one(docs, "Service", "reg-job-1-chief")
    hooks = json.loads(chief_sets(docs, "reg-job-1")["cluster.hooks"])
    for sts in (listed, joining):
        service = one(docs, "Service", sts["spec"]["serviceName"])
        assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
        assert service["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
        assert sts["spec"]["selector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    port = listed["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert hooks == [f"reg-job-1-node-{i}.{listed['spec']['serviceName']}.{ns}.svc:{port}"
                     for i in range(listed["spec"]["replicas"])] and len(hooks) == 2
    assert "--join" not in listed["spec"]["template"]["spec"]["containers"][0]["args"]
    hook = joining["spec"]["template"]["spec"]["containers"][0]
    assert joining["spec"]["replicas"] == 0 and hook["args"][0] == "hook"
    assert options(hook["args"], "--join") == [f"{chief_service['metadata']['name']}.{ns}.svc:"
                                               f"{chief_service['spec']['ports'][0]['port']}"]
    advertised = options(hook["args"], "--advertise")[0]
    env = {e["name"]: e for e in hook["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # what the kubelet makes of $(VAR) in a command: the joining pod advertises its own DNS name
    assert kubelet_expand(advertised, {"POD_NAME": "reg-job-1-join-3"}) == \
        f"reg-job-1-join-3.{joining['spec']['serviceName']}.{ns}.svc:{port}"
    _, tf_docs = build(job_file(tmp_path / "tf"), "--mode", "tfconfig", "--storage", "1Gi")
    for c in containers(docs + tf_docs):   # and nothing else in a command is the kubelet's to change
        for text in [*c.get("command", []), *c.get("args", [])]:
            assert kubelet_expand(text, {"POD_NAME": "p"}) == text.replace("$(POD_NAME)", "p"), text


def kubelet_expand(text, env):
    """The kubelet's $(VAR) expansion of a container's command and args ($$ is a $; an
    unknown or unclosed reference stays as it is)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            end = text.find(")", i + 2) if text[i + 1] == "(" else -1
            if end != -1:
                name = text[i + 2:end]
                out.append(env.get(name, f"$({name})"))
                i = end + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


def test_the_tokens_are_only_files_of_a_mounted_secret(tmp_path):
    job, docs = build(job_file(tmp_path))
    secret = one(docs, "Secret", "reg-job-1-tokens")
    tokens = [t.strip() for t in secret["stringData"].values()]
    assert sorted(secret["stringData"]) == [k8s.HOOKS_TOKEN, k8s.MANAGER_TOKEN] and all(len(t) >= 43 for t in tokens)
    everything = json.dumps([d for d in docs if d["kind"] != "Secret"])
    assert not any(t in everything for t in tokens)   # in no env, argument, ConfigMap or label
    assert "secretKeyRef" not in everything
    for _, spec in pod_specs(docs):
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["secret"]["secret"]["defaultMode"] == 0o400
        assert volumes["tokens"]["emptyDir"]["medium"] == "Memory"
        copy, = [c for c in spec["initContainers"] if c["name"] == "tokens"]
        assert copy["command"][:3] == ["install", "-m", "0400"] and copy["command"][-1] == k8s.TOKEN_DIR + "/"
        for c in spec["containers"]:
            assert {"name": "tokens", "mountPath": k8s.TOKEN_DIR, "readOnly": True} in c["volumeMounts"]
            assert "secret" not in {m["name"] for m in c["volumeMounts"]}   # the Secret: in the init container only
            files = [*options(c["args"], "--token-file"), *options(c["args"], "--manager-token-file")]
            assert files and all(f.startswith(k8s.TOKEN_DIR + "/") for f in files)
    assert json.loads(chief_sets(docs, "reg-job-1")["cluster.token_file"]).startswith(k8s.TOKEN_DIR + "/")
    listed = one(docs, "StatefulSet", "reg-job-1-node")["spec"]["template"]["spec"]
    assert [i["key"] for i in listed["volumes"][0]["secret"]["items"]] == [k8s.HOOKS_TOKEN]   # not the manager's
    _, without = build(job_file(tmp_path / "b"), "--no-secret")
    assert "Secret" not in {d["kind"] for d in without}


def test_every_pod_has_probes_on_a_port_it_declares_and_grpc_fail_fast(tmp_path):
    for mode in (["--mode", "hooks"], ["--mode", "tfconfig", "--storage", "1Gi"]):
        _, docs = build(job_file(tmp_path / mode[1]), *mode)
        for c in containers(docs, init=False):
            names = {p["name"] for p in c["ports"]}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert c[probe]["tcpSocket"]["port"] in names, (c["name"], probe)
            assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 60
            assert {"name": "GRPC_FAIL_FAST", "value": "use_caller"} in c["env"]


def test_the_jobs_failure_policy_holds_tfsyncs_exit_codes(tmp_path):
    failing = {code for code, _ in exits.EXIT_CODES if code != exits.EXIT_DONE}
    for mode in (["--mode", "hooks"], ["--mode", "tfconfig", "--storage", "1Gi"]):
        _, docs = build(job_file(tmp_path / mode[1]), *mode)
        jobs = [d for d in docs if d["kind"] == "Job"]
        assert jobs
        for d in jobs:
            main_name = d["spec"]["template"]["spec"]["containers"][0]["name"]
            rules = {r["action"]: r for r in d["spec"]["podFailurePolicy"]["rules"]}
            assert rules["FailJob"]["onExitCodes"] == {"containerName": main_name, "operator": "In",
                                                       "values": [exits.EXIT_BAD_INPUT]}
            assert set(rules["Count"]["onExitCodes"]["values"]) == {exits.EXIT_FAILED, exits.EXIT_INTERRUPTED}
            assert rules["Count"]["onExitCodes"]["containerName"] == main_name
            assert rules["Ignore"]["onPodConditions"][0]["type"] == "DisruptionTarget"
            assert set(rules["FailJob"]["onExitCodes"]["values"]) | set(rules["Count"]["onExitCodes"]["values"]) \
                == failing   # every code tfsync ends with, once
            assert d["spec"]["backoffLimit"] == k8s.RETRIES
            assert d["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_tf_config_pods_get_what_tfsync_tfconfig_writes_at_their_own_dns_names(tmp_path, capsys):
    from tfsync.base import tfconfig

    path = job_file(tmp_path)
    job, docs = build(path, "--mode", "tfconfig", "--storage", "5Gi", "--namespace", "ml")
    spec = k8s.task_spec(job)
    assert main(["tfconfig", str(path), "--chief", spec["chief"][0], "--ps", ",".join(spec["ps"]),
                 "--workers", ",".join(spec["worker"]), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    service = one(docs, "Service", "reg-job-1-tasks")
    jobs = [d for d in docs if d["kind"] == "Job"]
    assert len(jobs) == 1 + job.ps + job.workers
    for d in jobs:
        pod = d["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        task = tfconfig.read({"TF_CONFIG": env["TF_CONFIG"]})
        assert env["TF_CONFIG"] == printed[f"{task.task_type}:{task.task_index}"]
        assert f"{pod['hostname']}.{pod['subdomain']}.ml.svc:{k8s.TF_PORT}" == spec[task.task_type][task.task_index]
        assert pod["subdomain"] == service["metadata"]["name"]
        assert service["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
        command = pod["containers"][0]["command"]
        if task.task_type == "worker":   # in the chief's run directory, where its records are
            assert command[:3] == ["/bin/sh", "-c", k8s.WORKER_SCRIPT] and command[4] == f"{k8s.RUNS}/reg-job-1"
        if task.task_type == "ps":
            assert command == ["python", "-m", "tfsync.engine.server"]
    chief = one(docs, "Job", "reg-job-1-chief")["spec"]["template"]["spec"]
    assert json.loads(chief_sets(docs, "reg-job-1")["cluster.hooks"]) == []   # TF_CONFIG names the tasks
    assert chief["initContainers"][0]["command"][5:] == spec["ps"]   # it waits for the PS, not the workers


def test_a_worker_waits_for_the_chiefs_run_directory_then_runs_in_it_or_says_why_not(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    done = subprocess.run(["/bin/sh", "-c", k8s.WORKER_SCRIPT, "w", str(run_dir), "5", "/bin/pwd"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == str(run_dir)
    late = subprocess.run(["/bin/sh", "-c", k8s.WORKER_SCRIPT, "w", str(tmp_path / "none"), "0", "/bin/pwd"],
                          capture_output=True, text=True, timeout=30)
    assert late.returncode == exits.EXIT_FAILED and "did not appear in 0 s" in late.stderr


def test_the_job_file_and_the_code_it_names_travel_in_a_configmap(tmp_path):
    path = job_file(tmp_path)
    job, docs = build(path, "--include", str(path.parent / "lib" / "helper.py"))
    data = one(docs, "ConfigMap", "reg-job-1-job")["data"]
    chief = one(docs, "Job", "reg-job-1-chief")["spec"]["template"]["spec"]
    volume, = [v for v in chief["volumes"] if v["name"] == "job"]
    placed = {item["path"]: data[item["key"]] for item in volume["configMap"]["items"]}
    assert placed == {"job.toml": JOB, "model.py": (path.parent / "model.py").read_text(),
                      "lib/data.py": (path.parent / "lib" / "data.py").read_text(), "lib/helper.py": "HELP = 1\n"}
    assert {"name": "job", "mountPath": k8s.JOB_DIR, "readOnly": True} in chief["containers"][0]["volumeMounts"]
    assert chief["containers"][0]["args"][0] == f"{k8s.JOB_DIR}/job.toml"
    nodes = one(docs, "StatefulSet", "reg-job-1-node")["spec"]["template"]["spec"]
    assert "job" not in {v["name"] for v in nodes["volumes"]}   # the user's code runs in the chief only


@pytest.mark.parametrize("options, edit, named", [
    ([], ("max_workers = 4\n", "min_workers = 3\n"), "cluster.min_workers"),   # the job file's own check
    (["--min-workers", "3", "--max-workers", "2"], None, "--min-workers 3: more than --max-workers 2"),
    (["--workers", "5"], None, "--workers 5: outside"),                          # the file's max_workers = 4
    (["--set", "cluster.workers=3"], None, "--set cluster.workers: tfsync k8s sets it in the chief's job; "
                                           "give --workers"),
    ([], ('fn = "lib/data.py:load"', 'path = "/home/me/mnist.npz"'), "data.path = '/home/me/mnist.npz': a path on "
                                                                     "this machine"),
    ([], ('fn = "model.py:build"', 'fn = "../elsewhere.py:build"'), "model.fn = "),
    (["--include", "/etc/hostname"], None, "--include /etc/hostname: /etc/hostname is outside the job file's folder"),
    (["--mode", "tfconfig"], ('[data]\nfn = "lib/data.py:load"\n', ""), "--storage: --mode tfconfig's workers read"),
    (["--mode", "tfconfig", "--storage", "1Gi", "--min-workers", "1"], None, "--min-workers: for --mode hooks"),
    (["--mode", "tfconfig", "--storage", "1Gi", "--set", "switch.method=restart"], None, "switch.method"),
    (["--mode", "tfconfig", "--storage", "1Gi", "--no-secret"], None, "--no-secret: for --mode hooks"),
    (["--cpu", "2", "--cpu-limit", "1"], None, "--cpu 2: more than --cpu-limit 1"),
    (["--memory", "lots"], None, "--memory 'lots': not a Kubernetes quantity"),
    (["--storage", "10GB"], None, "--storage '10GB': not a Kubernetes quantity"),
    (["--storage-class", "fast"], None, "--storage-class: for the volume"),
    (["--name", "Not_A_Label"], None, "--name 'Not_A_Label': expected a DNS label"),
    (["--namespace", "a" * 64], None, "--namespace"),
    (["--manager-port", str(k8s.HOOK_PORT)], None, "--manager-port 7070"),
    (["--image", "has space"], None, "--image 'has space'"),
    (["--nodes", "0"], None, "--nodes 0: expected at least 1"),
])
def test_what_the_pods_could_not_honour_is_refused_in_one_line_naming_it(tmp_path, capsys, options, edit, named):
    path = job_file(tmp_path, JOB.replace(*edit) if edit else JOB)
    out = tmp_path / "out"
    assert main(["k8s", str(path), "--out", str(out), *options]) == exits.EXIT_BAD_INPUT
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfsync: error: ") and named in lines[0], captured.err
    assert not out.exists() and not captured.out   # nothing written


def test_an_out_folder_that_holds_files_already_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.yaml").write_text("kind: Secret\n")
    assert main(["k8s", str(job_file(tmp_path)), "--out", str(out)]) == exits.EXIT_BAD_INPUT
    assert "--out" in capsys.readouterr().err and os.listdir(out) == ["old.yaml"]


def test_the_counts_and_the_nodes_go_to_the_chiefs_job(tmp_path):
    job, docs = build(job_file(tmp_path), "--workers", "3", "--ps", "2", "--min-workers", "2", "--max-workers", "6")
    sets = chief_sets(docs, "reg-job-1")
    assert {k: sets[k] for k in ("cluster.workers", "cluster.ps", "cluster.min_workers", "cluster.max_workers")} == \
        {"cluster.workers": "3", "cluster.ps": "2", "cluster.min_workers": "2", "cluster.max_workers": "6"}
    assert one(docs, "StatefulSet", "reg-job-1-node")["spec"]["replicas"] == 5   # one task per node pod
    assert set(sets) - {"cluster.task_ports"} <= set(k8s.OWNED)   # each refused in a user's --set


def test_the_chief_waits_for_its_nodes_at_most_its_limit():
    now = [0.0]
    answering = {"a:1"}

    def tick(seconds):
        now[0] += seconds
        if now[0] >= 3:
            answering.add("b:2")

    assert k8s.wait_for(["a:1", "b:2"], 10, is_open=answering.__contains__, clock=lambda: now[0], sleep=tick) == []
    assert now[0] == 3
    assert k8s.wait_for(["c:3"], 5, is_open=answering.__contains__, clock=lambda: now[0], sleep=tick) == ["c:3"]
    assert k8s.main(["wait", "0", "127.0.0.1:1"]) == 0   # never fails the pod: the chief says what is missing


def test_the_dockerfile_builds_the_image_the_manifests_name_pinned_and_as_their_user():
    import tfsync

    text = open(os.path.join(ROOT, "Dockerfile")).read()
    base = re.search(r"^ARG BASE=(\S+)$", text, re.M).group(1)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), base   # a patch release
    assert re.search(r"^FROM \$\{BASE\}$", text, re.M)
    # every requirement of setup.py pinned (==) within its bounds, and the pins used at each install
    assert text.count("pip install --constraint /etc/tfsync-constraints.txt") == 2
    assert "COPY image-constraints.txt /etc/tfsync-constraints.txt" in text
    lines = [ln for ln in open(os.path.join(ROOT, "image-constraints.txt")).read().splitlines()
             if ln and not ln.startswith("#")]
    pins = dict(ln.split("==") for ln in lines)
    assert len(pins) == len(lines) and all(re.fullmatch(r"[a-z0-9-]+", n) for n in pins), lines
    requires = [Requirement(r) for r in importlib.metadata.distribution("tfsync").requires if "extra ==" not in r]
    assert len(requires) >= 10
    for r in requires:
        name = re.sub(r"[-_.]+", "-", r.name).lower()
        assert name in pins and r.specifier.contains(pins[name]), (str(r), pins.get(name))
    assert re.search(rf"^USER {k8s.UID}:{k8s.UID}$", text, re.M) and f"--uid {k8s.UID}" in text
    assert k8s.RUNS in text and DEFAULT_IMAGE == f"tfsync:{tfsync.__version__}"
    assert f"docker build -t {DEFAULT_IMAGE} ." in text

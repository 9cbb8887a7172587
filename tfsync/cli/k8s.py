"""``tfsync k8s JOB``: the Kubernetes manifests of a job, on stdout or one file per object
in ``--out DIR`` (``kubectl apply -f DIR``). What the objects are and why:
``tfsync.deploy.k8s``; this module reads the job file, decides what travels to the pods,
and refuses in one line what the pods could not honour.

What travels: the job file and the code files it names by path (``model.fn =
"model.py:build"``, ``--include`` for their helpers), in a ConfigMap, each at its place
relative to the job file. A path the job file gives that is this machine's (``data.path``,
code outside the job file's folder, TLS files) is refused, naming the field: name the
pod's own path with ``--set`` instead, which goes to the chief's ``tfsync run`` as it is.
"""

from __future__ import annotations

import os
import re
import sys

from ..base.version import VERSION
from ..deploy import k8s
from ..base.exits import BadInput

DEFAULT_IMAGE = f"tfsync:{VERSION}"   # what the repository's Dockerfile builds: docker build -t tfsync:VERSION .

def add_commands(sub) -> None:
    p = sub.add_parser("k8s", help="write the Kubernetes manifests of a job (kubectl apply -f)",
                       description="Write the Kubernetes objects that run JOB: the chief as a Job running `tfsync "
                                   "run` with its manager on --manager-port; node pods (StatefulSets) running "
                                   "`tfsync hook`, those of <name>-join joining the running job (kubectl scale "
                                   "statefulset/<name>-join --replicas=N); headless Services, a NetworkPolicy, the "
                                   "tokens as a Secret, the job file and its code files as a ConfigMap. With --mode "
                                   "tfconfig, one Job per task, each with its TF_CONFIG. The image is the "
                                   "repository's Dockerfile's (docker build -t IMAGE .).")
    p.add_argument("job", help="path to the job file (TOML)")
    p.add_argument("--mode", choices=k8s.MODES, default="hooks",
                   help="hooks: node pods run tfsync hooks (restart switch, recovery, tfsync scale, joins); "
                        "tfconfig: each PS and worker is a pod started with its TF_CONFIG (default: hooks)")
    p.add_argument("--out", metavar="DIR", help="write one file per object in DIR, a new or empty folder "
                                                "(default: all of them on stdout)")
    p.add_argument("--name", help="prefix of the objects' names (default: job.name, made a DNS label)")
    p.add_argument("--namespace", default="default", help="the namespace (default: default)")
    p.add_argument("--image", default=DEFAULT_IMAGE, help=f"the image (default {DEFAULT_IMAGE}, what "
                                                             "the repository's Dockerfile builds)")
    p.add_argument("--workers", type=int, help="workers at the start (default: cluster.workers)")
    p.add_argument("--ps", type=int, help="parameter servers (default: cluster.ps)")
    p.add_argument("--min-workers", type=int, help="hooks mode: the fewest workers a scale or a loss leaves "
                                                   "(default: cluster.min_workers)")
    p.add_argument("--max-workers", type=int, help="hooks mode: the most workers a scale or joins reach "
                                                   "(default: cluster.max_workers)")
    p.add_argument("--nodes", type=int, help="hooks mode: node pods the job starts on (default: PS + workers, one "
                                             "task each)")
    p.add_argument("--manager-port", type=int, default=k8s.MANAGER_PORT,
                   help=f"the port of the chief's manager (default {k8s.MANAGER_PORT})")
    d = k8s.Resources()
    p.add_argument("--cpu", default=d.cpu, help=f"each pod's CPU request (default {d.cpu})")
    p.add_argument("--cpu-limit", help="each pod's CPU limit (default: none)")
    p.add_argument("--memory", default=d.memory, help=f"each pod's memory request (default {d.memory})")
    p.add_argument("--memory-limit", default=d.memory_limit,
                   help=f"each pod's memory limit (default {d.memory_limit}; none: no limit)")
    p.add_argument("--storage", metavar="SIZE", help="a volume of SIZE (e.g. 10Gi) for the run directory, so a "
                   "retried chief resumes from its checkpoint (default: the pod's own disk, gone with it); "
                   "--mode tfconfig needs one its workers share (ReadWriteMany)")
    p.add_argument("--storage-class", help="the volume's storage class (default: the cluster's)")
    p.add_argument("--include", action="append", default=[], metavar="FILE",
                   help="also carry FILE, inside the job file's folder (a helper module of your code)")
    p.add_argument("--no-secret", action="store_true",
                   help="leave the Secret out: make <name>-tokens yourself, with keys hooks.token and "
                        "manager.token (default: one with new tokens)")
    from ..job.overrides import OVERRIDE_HELP
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=OVERRIDE_HELP + "; given to the chief's `tfsync run` as it is, so paths are the pod's")
    p.set_defaults(func=cmd_k8s)


def cmd_k8s(args) -> int:
    from ..deploy.manifests import manifests
    from ..deploy.yamltext import dump_all

    job = k8s_job(args)
    documents = manifests(job)
    if not args.out:
        sys.stdout.write(f"# tfsync k8s {args.job} --mode {args.mode}: kubectl apply -f FILE\n" + dump_all(documents))
        if job.tokens:
            print(f"tfsync k8s: the Secret {job.name}-tokens holds new tokens: keep this output as you keep them",
                  file=sys.stderr)
        return 0
    paths = write_out(args.out, documents)
    print(f"wrote {len(paths)} objects to {args.out}" + (" (the Secret, with new tokens, mode 0600)" if job.tokens
                                                         else "") + f"; start the job: kubectl apply -f {args.out}")
    return 0


def k8s_job(args) -> k8s.K8sJob:
    """The job as its pods will see it, from the parsed arguments; BadInput (one line,
    naming the option or the job file's field) for what the pods could not honour."""
    from ..api import auth
    from ..job.config import load_job
    from ..job.overrides import parse_override

    user_fields = [parse_override(text).field for text in args.set]
    owned = next((f for f in user_fields if f in k8s.OWNED), None)
    if owned:
        raise BadInput(f"--set {owned}: tfsync k8s sets it in the chief's job; give {k8s.OWNED[owned]}")
    written = load_job(args.job)                      # the file as written: its paths are this machine's
    cfg = load_job(args.job, overrides=args.set)      # with the user's --set: the counts
    hooks = args.mode == "hooks"
    if not hooks and args.no_secret:
        raise BadInput("--no-secret: for --mode hooks (a TF_CONFIG job has no tokens: its manager makes its own)")
    job = k8s.K8sJob(
        name=args.name or _label(cfg.job.name), namespace=args.namespace, image=args.image, mode=args.mode,
        files=carried(args.job, written, user_fields, args.include),
        workers=cfg.cluster.workers if args.workers is None else args.workers,
        ps=cfg.cluster.ps if args.ps is None else args.ps,
        nodes=args.nodes, min_workers=_bound(args.min_workers, cfg.cluster.min_workers, hooks),
        max_workers=_bound(args.max_workers, cfg.cluster.max_workers, hooks), manager_port=args.manager_port,
        task_ports=cfg.cluster.task_ports or k8s.TASK_PORTS,
        resources=k8s.Resources(args.cpu, args.memory, args.cpu_limit,
                                None if args.memory_limit == "none" else args.memory_limit),
        storage=args.storage, storage_class=args.storage_class, overrides=tuple(args.set),
        tokens=None if args.no_secret or not hooks else {k8s.HOOKS_TOKEN: auth.new_token(),
                                                         k8s.MANAGER_TOKEN: auth.new_token()})
    if not hooks:
        if cfg.switch.method == "restart":
            raise BadInput('switch.method = "restart": a restart switch needs new tasks, and TF_CONFIG\'s are the '
                           'platform\'s; use --mode hooks, or --set switch.method=hot')
        if not job.storage and not cfg.data.fn:
            raise BadInput("--storage: --mode tfconfig's workers read the training records the chief writes in "
                           "its run directory; give --storage SIZE, a ReadWriteMany volume they share "
                           "(--storage-class: a class that has them), or a data.fn returning a per-worker tf.data "
                           "factory, or use --mode hooks (the chief sends the records to the nodes)")
    load_job(args.job, overrides=[*k8s.chief_overrides(job), *args.set])   # the chief's job must load as it will
    return job


def _label(name: str) -> str:
    """``job.name`` as a DNS label: lower case, other characters as '-'."""
    return re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")[:k8s.MAX_NAME].strip("-") or "tfsync"


def _bound(option: int | None, in_file: int | None, hooks: bool) -> int | None:
    """A worker bound: the option, else (hooks mode) the job file's."""
    return option if option is not None or not hooks else in_file


def _overridden(field: str, user_fields: list[str]) -> bool:
    return any(field == f or field.startswith((f + ".", f + "[")) or f.startswith((field + ".", field + "["))
               for f in user_fields)


def carried(job_path: str, cfg, user_fields: list[str], include: list[str]) -> tuple[tuple[str, bytes], ...]:
    """The files the chief's pod gets: the job file, then the code files it names by path
    and ``include``, each as (path relative to the job file's folder, content). A path
    the pods would not have is refused, naming its field or option."""
    from ..base import safefile

    folder = os.path.dirname(os.path.abspath(job_path))
    c = cfg.cluster
    for field, value, why in (
            ("data.path", cfg.data.path, "a path on this machine, which the pods do not have: put the data in the "
             "image or a volume and give its path in the pod with --set data.path=PATH"),
            ("cluster.tls_ca", c.tls_ca, "the pods' hooks serve plaintext behind the job's NetworkPolicy; tfsync k8s "
             "does not carry TLS files (drop it, or --set cluster.tls_ca=... naming a file of the image)"),
            ("cluster.place_ps", c.place_ps, "names this machine's hooks; the pods' are "
             f"<name>-node-<i>.<name>-nodes.<namespace>.svc:{k8s.HOOK_PORT} (--set it with those)"),
            ("cluster.place_workers", c.place_workers, "names this machine's hooks; the pods' are "
             f"<name>-node-<i>.<name>-nodes.<namespace>.svc:{k8s.HOOK_PORT} (--set it with those)")):
        if value and not _overridden(field, user_fields):
            raise BadInput(f"{job_path}: {field} = {value!r}: {why}")
    wanted = []   # (what names it, absolute path)
    for field, ref in code_refs(cfg):
        if not _overridden(field.split("[")[0], user_fields):
            wanted.append((f"{field} = {ref!r}", ref.rsplit(":", 1)[0]))
    wanted += [(f"--include {path}", os.path.abspath(path)) for path in include]
    files, seen = [(os.path.basename(job_path), safefile.read_regular(job_path, k8s.MAX_CONFIGMAP, "job file"))], set()
    for what, path in wanted:
        relative = os.path.relpath(path, folder)
        if relative.startswith(".."):
            raise BadInput(f"{what}: {path} is outside the job file's folder {folder}; the pod keeps the files' "
                           "places relative to the job file: move it there, or install it in the image and name it "
                           "as a module (\"package.module:function\")")
        if not os.path.isfile(path):
            raise BadInput(f"{what}: {path} is not a file here, so it cannot be carried to the pod")
        if relative not in seen:
            seen.add(relative)
            files.append((relative.replace(os.sep, "/"), safefile.read_regular(path, k8s.MAX_CONFIGMAP, "code file")))
    return tuple(files)


def code_refs(cfg) -> list[tuple[str, str]]:
    """(field, ``"file.py:function"``) of each user function the job names by file."""
    from ..base.usercode import is_file_ref

    t = cfg.train
    refs = [("model.fn", cfg.model.fn), ("data.fn", cfg.data.fn), ("train.optimizer", t.optimizer),
            ("train.loss", t.loss)]
    if isinstance(t.learning_rate, dict):
        refs.append(("train.learning_rate.schedule", t.learning_rate.get("schedule")))
    for i, m in enumerate(t.metrics or ()):
        refs.append((f"train.metrics[{i}]", m if isinstance(m, str) else m.get("metric")))
    return [(field, ref) for field, ref in refs if isinstance(ref, str) and is_file_ref(ref)]


def write_out(folder: str, documents: list[dict]) -> list[str]:
    """Each object in ``folder/NN-kind-name.yaml``, in apply order; the Secret 0600."""
    from ..base import safefile
    from ..deploy.yamltext import dump_all

    if os.path.exists(folder) and (not os.path.isdir(folder) or os.listdir(folder)):
        raise BadInput(f"--out {folder}: {'not a folder' if not os.path.isdir(folder) else 'not empty'}; give a new "
                       "or empty folder (kubectl apply -f applies every file in it)")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    paths = []
    for i, doc in enumerate(documents):
        path = os.path.join(folder, f"{i:02d}-{doc['kind'].lower()}-{doc['metadata']['name']}.yaml")
        safefile.write(path, dump_all([doc]), mode=0o600 if doc["kind"] == "Secret" else 0o644)
        paths.append(path)
    return paths

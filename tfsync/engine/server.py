"""Entry point of one TF task process (a PS or a worker): ``python -m tfsync.engine.server``.

The process runs a ``tf.distribute.Server`` until it is killed, and exits by itself when
its parent (the launcher) dies, so a crashed coordinator never leaves orphans. ``ps`` shows
it as ``tfsync-ps0``, ``tfsync-worker1``, ... Started by
a platform (a Kubernetes TFJob, a Slurm script) with no arguments, it serves the task that
TF_CONFIG names (tfsync.base.tfconfig).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tfsync.base import taskcmd
from tfsync.base.taskcmd import exit_with_parent


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Run one TF task (ps or worker) of a tfsync cluster: the one "
                                "the arguments name, or without them the one TF_CONFIG names.")
    p.add_argument("--cluster", help="cluster spec as JSON: {job: [host:port, ...]}")
    p.add_argument("--job", choices=("ps", "worker"))
    p.add_argument("--index", type=int)
    p.add_argument("--parent-pid", type=int, action="append", default=[],
                   help="exit when its parent is not this process (given twice: neither of them)")
    args = p.parse_args(argv)
    if args.cluster is None:
        from tfsync.base import tfconfig
        try:
            tf_config = tfconfig.read()
        except tfconfig.TFConfigError as e:
            p.exit(2, f"tfsync task: {e}\n")
        if tf_config is None or tf_config.task_type not in ("ps", "worker"):
            p.exit(2, "tfsync task: give --cluster, --job and --index, or set TF_CONFIG to a ps or worker task\n")
        args.cluster, args.job, args.index = json.dumps(tf_config.spec), tf_config.task_type, tf_config.task_index
    elif args.job is None or args.index is None:
        p.exit(2, "tfsync task: --cluster needs --job and --index\n")
    if args.parent_pid:
        exit_with_parent(args.parent_pid)
    taskcmd.prctl(taskcmd.PR_SET_NAME, taskcmd.process_name(args.job, args.index).encode())

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    spec = json.loads(args.cluster)
    workers = len(spec.get("worker", ()))
    config = tf.compat.v1.ConfigProto()
    # a worker needs inter-op threads >= num_workers + 1 or a coordinator can hang on small
    # machines (as TF's own create_in_process_cluster sets); gated steps block one thread
    # each while they wait.
    config.inter_op_parallelism_threads = max(4, workers + 2)
    server = tf.distribute.Server(
        tf.train.ClusterSpec(spec), job_name=args.job, task_index=args.index,
        protocol="grpc", config=config, start=True,
    )
    print(f"tfsync task {args.job}:{args.index} serving at {server.target}", flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())

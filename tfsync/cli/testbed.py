"""`tfsync testbed up|down|status|set|exec`: separate hosts on one machine (``tfsync/testbed/bed.py``)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from ..base.exits import EXIT_BAD_INPUT, fail

_MS = re.compile(r"(\d+(?:\.\d+)?)(ms|s)?")


def latency(text: str) -> float:
    """"10ms", "0.5s" or "10" (ms) -> milliseconds."""
    m = _MS.fullmatch(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"latency {text!r}: give milliseconds such as 10ms or 0.03s")
    return float(m.group(1)) * (1000.0 if m.group(2) == "s" else 1.0)


def percent(text: str) -> float:
    """"1%", "0.5" -> percent."""
    try:
        return float(text.strip().rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"loss {text!r}: give a percentage such as 1% or 0.5") from None


def cpus(text: str) -> float | str:
    """"0.33" -> 0.33 CPUs; "none" (no cap) is kept as it is."""
    if text == "none":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"cpu {text!r}: give CPUs such as 0.5, or none") from None


def add_commands(sub) -> None:
    tb = sub.add_parser(
        "testbed", help="separate hosts on this machine (network namespaces) with an emulated network",
        description="A test cluster of separate hosts on one machine: each node is a Linux network namespace "
                    "with its own address on a bridge (198.18.0.0/15, never routed out) running a tfsync "
                    "hook, plus a node 'c' for the coordinator. Every connection between nodes passes a "
                    "latency relay (with jitter); bandwidth is shaped with tbf and packets dropped at "
                    "random with nftables (loss). Each node sees an empty /tmp of its own "
                    "(no shared run directory). Needs root and iproute2.",
        epilog="example:\n  tfsync testbed up --nodes 3 --latency 10ms --rate 1gbit\n"
               "  tfsync testbed status            # the [cluster] table for a job file\n"
               "  tfsync testbed exec c -- tfsync run job.toml\n"
               "  tfsync testbed set n2 --latency 30ms     # while the job runs\n"
               "  tfsync testbed set n3 --jitter 5ms --loss 1%\n"
               "  tfsync testbed set n3 --cpu 0.33          # a slow machine: a third of one CPU\n"
               "  tfsync testbed down",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    s = tb.add_subparsers(dest="testbed_command", metavar="COMMAND")
    name = argparse.ArgumentParser(add_help=False)
    name.add_argument("--name", default="tfsync", help="the testbed's name (default: tfsync)")
    up = s.add_parser("up", parents=[name], help="make the namespaces, links, relay and hooks",
                      description="Make a testbed: the namespaces (one per node and one for the coordinator, "
                                  "'c'), their links on a bridge, the latency relay and a hook on every node. "
                                  "Prints the [cluster] table to put in a job file.")
    up.add_argument("--nodes", type=int, default=3, help="nodes that run tasks (default 3), beside the coordinator's")
    up.add_argument("--latency", type=latency, default=0.0, help="every node's one-way latency (e.g. 10ms)")
    up.add_argument("--rate", help="every node's bandwidth up and down, as tc writes it (e.g. 100mbit, 1gbit)")
    up.add_argument("--jitter", type=latency, default=0.0,
                    help="every node's jitter: each chunk waits latency +- up to this (e.g. 2ms)")
    up.add_argument("--loss", type=percent, default=0.0,
                    help="every node's packet loss on what it sends, in %% (e.g. 1%%; needs nftables)")
    up.add_argument("--cpu", type=cpus, help="every task node's CPU share, in CPUs (e.g. 0.5; a cgroup quota)")
    up.add_argument("--private", action="append", metavar="DIR",
                    help="a directory each node sees empty (repeatable; default /tmp)")
    s.add_parser("down", parents=[name], help="stop every process and remove every namespace and link",
                 description="Stop every process in the testbed's namespaces (hooks stop their tasks), remove "
                             "the namespaces, their links, and the testbed's state directory.")
    st = s.add_parser("status", parents=[name], help="nodes, addresses, links, and the job file's [cluster] table",
                      description="Each node's addresses, latency, rate, link and hook, the relay, and the "
                                  "[cluster] table for a job file.")
    st.add_argument("--json", action="store_true")
    ch = s.add_parser("set", parents=[name], help="change a node's link while a job runs",
                      description="Change one node's link while a job runs: its one-way latency and jitter "
                                  "(what every chunk it sends waits in the relay), its packet loss (what it "
                                  "sends), its bandwidth (tbf, both ways), its CPU share, or take it down and up "
                                  "again (a partition).")
    ch.add_argument("node", help="n1, n2, ... or c")
    ch.add_argument("--latency", type=latency, help="one-way latency of what it sends (e.g. 30ms)")
    ch.add_argument("--jitter", type=latency, help="each chunk it sends waits latency +- up to this (e.g. 5ms)")
    ch.add_argument("--loss", type=percent, help="percent of the packets it sends dropped (0: none)")
    ch.add_argument("--rate", help="tc rate, or none")
    ch.add_argument("--cpu", type=cpus, help="CPUs its hook and tasks may use together (e.g. 0.33), or none")
    ch.add_argument("--down", action="store_true", help="take the link down (a partition)")
    ch.add_argument("--up", action="store_true", help="bring the link back")
    ex = s.add_parser("exec", parents=[name], help="run a command on a node (e.g. c: the coordinator's)",
                      description="Run a command in a node's network namespace: `tfsync testbed exec c -- tfsync "
                                  "run job.toml` runs a job's coordinator on node c.")
    ex.add_argument("node")
    ex.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    tb.set_defaults(func=cmd_testbed, testbed_parser=tb)


def cmd_testbed(args) -> int:
    from ..testbed.bed import Testbed

    if not args.testbed_command:
        args.testbed_parser.print_help()
        return EXIT_BAD_INPUT
    if args.testbed_command == "up":
        bed = Testbed.up(args.name, args.nodes, args.latency, args.rate, tuple(args.private or ["/tmp"]),
                         log=lambda msg: print(msg, flush=True), jitter_ms=args.jitter, loss_pct=args.loss,
                         cpu=None if args.cpu == "none" else args.cpu)
        print(f"testbed {bed.name} is up; its job file table:\n\n{bed.cluster_toml()}")
        return 0
    bed = Testbed.load(args.name)
    if args.testbed_command == "down":
        bed.down()
        print(f"testbed {bed.name} removed")
    elif args.testbed_command == "status":
        status = bed.status()
        if args.json:
            print(json.dumps(status, indent=1))
        else:
            for n in status["nodes"]:
                hook = "coordinator" if n["pid"] is None else \
                    f"hook {'running' if n['hook_alive'] else 'GONE'} (pid {n['pid']})"
                print(f"{n['name']:>4}  {n['address']:<14} advertised {n['advertised']:<14} "
                      f"latency {_link(n)}  rate {n['rate'] or '-'}  {_cpu(n)}"
                      f"link {'up' if n['up'] else 'DOWN'}  {hook}")
            print(f"relay {'running' if status['relay_alive'] else 'GONE'}\n\n{bed.cluster_toml()}")
    elif args.testbed_command == "set":
        if args.up and args.down:
            return fail("--up and --down: give one", EXIT_BAD_INPUT)
        n = bed.set(args.node, latency_ms=args.latency, rate=args.rate,
                    up=True if args.up else False if args.down else None, jitter_ms=args.jitter,
                    loss_pct=args.loss, cpu=args.cpu)
        print(f"{n.name}: latency {_link(vars(n))}, rate {n.rate or '-'}, {_cpu(vars(n))}, "
              f"link {'up' if n.up else 'down'}")
    elif args.testbed_command == "exec":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not argv:
            return fail("exec: give the command after --", EXIT_BAD_INPUT)
        command = bed.command(args.node, argv)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(sys.stderr.fileno(), 2)   # the real stderr: tfsync.base.quiet points fd 2 at /dev/null
        os.execvp(command[0], command)
    return 0


def _link(n: dict) -> str:
    """"10 ms", "10 +- 2 ms, 1 % loss": a node's latency, jitter and loss."""
    text = f"{n['latency_ms']:g}" + (f" +- {n['jitter_ms']:g}" if n.get("jitter_ms") else "") + " ms"
    return text + (f", {n['loss_pct']:g} % loss" if n.get("loss_pct") else "")


def _cpu(n: dict) -> str:
    return f"cpu {n['cpu']:g}" if n.get("cpu") is not None else "cpu -"

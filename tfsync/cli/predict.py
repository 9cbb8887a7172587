"""``tfsync predict score INPUT``: one-step-ahead RMSE of the speed predictors on a trace or
a recorded series, offline (tfsync.predict.score describes the inputs and the numbers).

    tfsync predict score results/bench_predictors_series.csv --skip 500 --csv out.csv --plot out.png
    tfsync predict score ../shared/data/traces/alibaba2018/machine_usage.csv --gaps hold --workers 2
"""

from __future__ import annotations

import time

from ..base.exits import EXIT_BAD_INPUT, BadInput, fail
from ..predict.score import COLUMNS


def add_commands(sub) -> None:
    p = sub.add_parser("predict", help="score worker-speed predictors offline",
                       description="Worker-speed predictors (LB-BSP) without a cluster.")
    cmds = p.add_subparsers(dest="predict_command", metavar="ACTION", required=True)
    s = cmds.add_parser("score", help="one-step-ahead RMSE of every predictor on a trace or a series",
                        description="One-step-ahead RMSE of each predictor on INPUT: a series CSV (a "
                                    "header naming speed, optionally cpu, mem, worker, step) or a CPU "
                                    "trace (the formats of tfsync.base.traces; one worker per trace). "
                                    "Deterministic: the same input gives the same numbers.")
    s.add_argument("input", metavar="TRACE|SERIES", help="a series CSV (header with 'speed') or a trace file/folder")
    s.add_argument("--predictors", nargs="+", default=["last,ema,arima,narx,rnn,lstm"], metavar="SPEC",
                   help="names, comma- or space-separated, each optionally with options "
                        "(narx:units=4:window=300); default last,ema,arima,narx,rnn,lstm")
    s.add_argument("--skip", type=int, default=500, help="score steps from this index on (default 500)")
    s.add_argument("--warmup", type=int, default=None,
                   help="steps before learned predictors use their model (default theirs, 500)")
    s.add_argument("--csv", metavar="OUT", help=f"write the rows here (columns: {', '.join(COLUMNS)})")
    s.add_argument("--plot", metavar="OUT.png", help="plot predictions and RMSE (needs matplotlib: the 'plots' extra)")
    s.add_argument("--workers", type=int, help="score only the first N workers (traces)")
    t = s.add_argument_group("traces (ignored for a series)")
    t.add_argument("--format", default="auto", help="trace format (default: detected; see tfsync.base.traces)")
    t.add_argument("--step", type=float, help="trace sampling period in s (default: median spacing; required "
                                              "for files without times)")
    t.add_argument("--gaps", default="refuse", choices=("refuse", "hold", "interpolate", "skip"),
                   help="what to do with gaps longer than --max-gap (default refuse)")
    t.add_argument("--max-gap", type=float, help="longest spacing that is not a gap, s (default 10 x step)")
    t.add_argument("--every", type=float, help="trace seconds per step (default: the trace's step)")
    t.add_argument("--steps", type=int, help="at most this many steps per worker")
    t.add_argument("--readings", default="last", choices=("last", "next"),
                   help="cpu reading given with a step: the load it ran under (last, a monitor's) or "
                        "the one the next step runs under (next, an oracle)")
    t.add_argument("--jitter", type=float, default=0.05, help="log-normal noise on step speeds (default 0.05)")
    t.add_argument("--seed", type=int, default=0, help="seed of the jitter (default 0)")
    s.set_defaults(func=cmd_score)


def load_input(args) -> dict:
    """``{worker: {"speed", "cpu", "mem"}}`` from a series or a trace (args as parsed);
    BadInput for an input that cannot be read."""
    import os

    from ..base.traces import load_cpu_traces
    from ..predict.score import is_series, load_series, series_from_trace

    try:
        if not os.path.isdir(args.input) and is_series(args.input):
            series = load_series(args.input)
            traces = None
        else:
            traces = load_cpu_traces(args.input, args.workers, format=args.format, step=args.step,
                                     gaps=args.gaps, max_gap=args.max_gap)
    except OSError as e:   # the file named on the command line: bad input
        raise BadInput(f"cannot read {e.filename or args.input}: {e.strerror or e}") from None
    if traces is not None:
        series = {w: series_from_trace(t, every=args.every, jitter=args.jitter, readings=args.readings,
                                       steps=args.steps, seed=args.seed + w) for w, t in enumerate(traces)}
    if args.workers:
        series = {w: series[w] for w in sorted(series)[:args.workers]}
    if args.steps:
        series = {w: {k: v[:args.steps] for k, v in d.items()} for w, d in series.items()}
    return series


def cmd_score(args) -> int:
    from ..predict.score import score, write_csv, plot

    specs = [x.strip() for arg in args.predictors for x in arg.split(",") if x.strip()]
    if not specs:
        return fail("--predictors: give at least one predictor (last, ema, arima, narx, rnn, lstm)", EXIT_BAD_INPUT)
    for name, value in (("--skip", args.skip), ("--warmup", args.warmup), ("--workers", args.workers),
                        ("--steps", args.steps)):
        if value is not None and value < (0 if name == "--skip" else 1):
            return fail(f"{name} must be >= {0 if name == '--skip' else 1}, got {value}", EXIT_BAD_INPUT)
    series = load_input(args)
    t0 = time.perf_counter()
    rows, preds = score(series, specs, skip=args.skip, warmup=args.warmup,
                        progress=lambda r: print(f"  {r['predictor']:24s} RMSE {r['rmse']:10.4g}  "
                                                 f"({r['nrmse_pct']:.2f} % of the mean) "
                                                 f"{time.perf_counter() - t0:7.1f} s", flush=True))
    steps = {w: len(d["speed"]) for w, d in series.items()}
    print(f"{len(steps)} worker(s), {sum(steps.values())} steps, scored from step {args.skip}")
    width = max(len("predictor"), *(len(s) for s in specs))
    print(f"{'predictor':{width}s} {'RMSE':>10s} {'NRMSE %':>8s} {'/ EMA':>6s} {'fits':>5s} {'fit s':>7s}")
    for r in rows:
        if r["worker"] == "all":
            ratio = f"{r['ratio_to_ema']:.3f}" if r["ratio_to_ema"] != "" else "-"
            print(f"{r['predictor']:{width}s} {r['rmse']:10.4g} {r['nrmse_pct']:8.2f} {ratio:>6s} {str(r['fits']):>5s} "
                  f"{(format(r['fit_s'], '7.2f') if isinstance(r['fit_s'], float) else ''):>7s}")
    if args.csv:
        write_csv(args.csv, rows)
        print(f"wrote {args.csv}")
    if args.plot:
        plot(args.plot, rows, preds, series, args.skip)
        print(f"wrote {args.plot}")
    return 0

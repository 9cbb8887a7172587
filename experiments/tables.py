"""The benchmark pages' tables, written from the CSVs in results/ (issue 57).

A page under docs/ that shows measured figures includes a ``results/<name>.md`` written
here (pymdownx.snippets, see mkdocs.yml), never a table typed in by hand: a caption, the
table, and a line naming the CSV, the command that made it, the run's date (the CSV's
``date`` column where it has one, else the day the CSV was last committed) and the command
that wrote the table. A new run is a new CSV and a new table; the page drops the old one,
which stays in git. ``tests/test_bench_tables.py`` writes every table again and compares it
with the file the page includes, so a table cannot drift from its CSV.

    python experiments/tables.py                            # every table
    python experiments/tables.py bench_control_path_final   # one (or several)
    python experiments/tables.py --list

Each benchmark's own ``--summarise`` writes its tables the same way.
"""

from __future__ import annotations

import argparse
import csv
import functools
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
TUNED = "fit, 32 steps/execution"   # bench_control_path's name for native fit at 32 steps per execution


# -- reading and writing --------------------------------------------------------------------------------------------
def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(value) -> float | None:
    """A CSV cell as a number; an empty cell or nan as None."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return None if v != v else v


def run_date(path: Path) -> str:
    """The dates in the CSV's ``date`` column, else the day it was last committed."""
    rows = read_csv(path)
    if rows and "date" in rows[0]:
        return ", ".join(sorted({r["date"] for r in rows if r["date"]}))
    out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", str(path)], cwd=ROOT,
                         capture_output=True, text=True, check=False).stdout.strip()
    return out or "not committed yet"


def markdown(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Table:
    """One results/<name>.md: ``build`` turns the rows of each of ``csvs`` into its caption
    and table; ``made_by`` is the command that made the CSVs; ``script`` the benchmark whose
    ``--summarise`` writes it (None: ``python experiments/tables.py <name>`` only); with
    ``some``, the CSVs that exist (a scenario per CSV, not all run)."""

    name: str
    csvs: tuple[str, ...]
    made_by: str
    build: Callable[[list[list[dict]]], str]
    script: str | None = None
    some: bool = False

    def summarise_command(self) -> str:
        if self.script:
            return f"python experiments/{self.script} --summarise"
        return f"python experiments/tables.py {self.name}"

    def text(self, results: Path = RESULTS) -> str:
        csvs = [c for c in self.csvs if not self.some or (results / c).exists()]
        paths = [results / c for c in csvs]
        body = self.build([read_csv(p) for p in paths])
        dates = ", ".join(sorted({d for p in paths for d in run_date(p).split(", ")}))
        sources = ", ".join(f"`results/{c}`" for c in csvs)
        return (f"{body}\nFrom {sources} ({dates}), made by `{self.made_by}`; "
                f"this table: `{self.summarise_command()}`.\n")


def write(names, results: Path = RESULTS, out: Path = RESULTS) -> list[Path]:
    written = []
    for name in names:
        path = out / f"{name}.md"
        path.write_text(TABLES[name].text(results))
        written.append(path)
        print(f"wrote {path}")
    return written


def of_script(script: str) -> list[str]:
    """The tables a benchmark's ``--summarise`` writes."""
    return [name for name, t in TABLES.items() if t.script == script]


# -- the control path (bench_control_path.py) -----------------------------------------------------------------------
def control_path(csvs: list[list[dict]]) -> str:
    """Worker steps/s by configuration and latency, x tuned fit, a worker's step time, and
    the round trips a worker step costs from the slope between the two highest latencies."""
    rows = csvs[0]
    latencies = sorted({num(r["latency_ms"]) for r in rows})
    configs = list(dict.fromkeys(r["config"] for r in rows))

    def at(config, lat, key):
        vs = [num(r[key]) for r in rows if r["config"] == config and num(r["latency_ms"]) == lat]
        return statistics.median(vs) if vs else None

    first = rows[0]
    workers = round(num(first["round_ms"]) * num(first["steps_per_s"]) / 1000)
    rtt = {lat: at(configs[0], lat, "rtt_ms") for lat in latencies}
    hi = latencies[-2:]
    header = ["configuration"] + [f"{lat:g} ms (RTT {rtt[lat]:.1f} ms)" for lat in latencies]
    header.append(f"round trips a worker step ({hi[0]:g} -> {hi[1]:g} ms)")
    table = []
    for config in configs:
        cells = [config]
        for lat in latencies:
            sps, tuned = at(config, lat, "steps_per_s"), at(TUNED, lat, "steps_per_s")
            if sps is None:
                cells.append("")
                continue
            x = f"{sps / tuned:.2f}x; " if tuned and config != TUNED else ""
            cells.append(f"{sps:.1f} ({x}{1000 * workers / sps:.0f} ms)")
        t = [at(config, lat, "steps_per_s") for lat in hi]
        slope = (workers * 1000 / t[1] - workers * 1000 / t[0]) / (rtt[hi[1]] - rtt[hi[0]]) if all(t) else None
        cells.append("" if slope is None else f"{slope:.1f}")
        table.append(cells)
    repeats = len({r["repeat"] for r in rows})
    step = statistics.median(num(r["step_ms"]) for r in rows)
    floors = " / ".join(f"{at(configs[0], lat, 'ideal_round_ms'):.0f}" for lat in latencies)
    caption = (f"Worker steps/s over {workers} workers at each one-way latency (the round trip measured), "
               f"{'one run' if repeats == 1 else f'median of {repeats} runs'} each; in brackets: x tuned `fit` "
               f"({TUNED}) and the time each worker takes for a step (a round of {workers} steps). "
               f"A step's compute {step:.1f} ms; a BSP round's floor (two round trips and a step) {floors} ms.")
    return caption + "\n\n" + markdown(header, table)


# -- where a BSP round goes (round_parts.py) ------------------------------------------------------------------------
BSP_PARTS = ("tokens spread", "token to gradient", "last gradient to next token", "round")
PART_NAMES = {"tokens spread": "the round's tokens reach the workers over",
              "token to gradient": "a worker's token to its gradient",
              "last gradient to next token": "the last gradient to the next round's first token",
              "round": "the round"}


def round_parts(csvs: list[list[dict]], labels: str) -> str:
    """A BSP round's parts (median ms, and round trips) for the labels containing ``labels``."""
    rows = [r for r in csvs[0] if labels in r["label"] and r["kind"] == "bsp"]
    columns = list(dict.fromkeys(r["label"] for r in rows))
    table = []
    for part in BSP_PARTS:
        cells = [PART_NAMES[part]]
        for label in columns:
            r = next((r for r in rows if r["label"] == label and r["part"] == part), None)
            cells.append("" if r is None else f"{num(r['ms']):.1f} ms ({num(r['round_trips']):.2f} RTT)")
        table.append(cells)
    header = ["part of a BSP round"] + [label.replace(f", {labels}", "") for label in columns]
    caption = (f"Where a BSP round goes ({labels}), from the workers' own timestamps of kept runs (one clock on "
               "the testbed): medians of the steady part, in ms and in round trips.")
    return caption + "\n\n" + markdown(header, table)


# -- a whole job on the testbed (bench_testbed.py) ------------------------------------------------------------------
PROTOCOL_NAMES = {"fit": "fit", "fit 32/exec": "tuned fit", "bsp": "tfsync BSP", "asp": "tfsync ASP",
                  "sync-switch": "Sync-Switch"}


def whole_job(csvs: list[list[dict]], names: tuple[str, ...] = ()) -> str:
    """Samples/s by latency and protocol (x tuned fit) and the seconds to the target accuracy,
    medians over repeats; with several CSVs, each latency from the last CSV that has it."""
    by_latency: dict[float, tuple[int, list[dict]]] = {}
    for i, rows in enumerate(csvs):
        for lat in {num(r["latency_ms"]) for r in rows}:
            by_latency[lat] = (i, [r for r in rows if num(r["latency_ms"]) == lat])
    protocols = list(dict.fromkeys(p for _, rows in by_latency.values() for p in (r["protocol"] for r in rows)))
    protocols.sort(key=lambda p: list(PROTOCOL_NAMES).index(p) if p in PROTOCOL_NAMES else len(PROTOCOL_NAMES))
    header = ["one-way"] + [PROTOCOL_NAMES.get(p, p) for p in protocols]
    if len(csvs) > 1:
        header.append("run")
    table = []
    for lat in sorted(by_latency):
        source, rows = by_latency[lat]

        def med(p, key):
            vs = [num(r[key]) for r in rows if r["protocol"] == p]
            return statistics.median(vs) if vs and None not in vs else None

        tuned = med("fit 32/exec", "samples_per_s")
        cells = [f"{lat:g} ms"]
        for p in protocols:
            sps = med(p, "samples_per_s")
            if sps is None:
                cells.append("")
                continue
            reached = [num(r["time_to_target_s"]) for r in rows if r["protocol"] == p]
            done = [v for v in reached if v is not None]
            if not done:
                when = "never"
            else:
                when = f"{statistics.median(done):.1f} s" + (f", {len(done)} of {len(reached)}"
                                                              if len(done) < len(reached) else "")
            x = f"{sps / tuned:.2f}x, " if tuned and not p.startswith("fit") else ""
            cells.append(f"{sps:.0f} ({x}{when})")
        if len(csvs) > 1:
            cells.append(names[source])
        table.append(cells)
    repeats = max(len({r["repeat"] for r in rows}) for _, rows in by_latency.values())
    workers = csvs[-1][0]["workers"]
    runs = "one run" if repeats == 1 else f"medians of {repeats} runs"
    caption = (f"Samples/s of a whole job, {workers} workers, {runs} each; in brackets: x tuned `fit` (32 steps per "
               "execution) and the seconds to BSP's final accuracy less half a point (never: not reached; a "
               "median over the runs that reached it).")
    if len(csvs) > 1:
        caption += " Each latency from the last run that measured it (run: its CSV in results/)."
    return caption + "\n\n" + markdown(header, table)


# -- LB-BSP per update on the testbed (bench_testbed_lbbsp.py) ------------------------------------------------------
SLOW = {"cpu": "a third of a CPU", "bandwidth": "a 10 mbit link"}   # the defaults of --slow-cpu and --slow-rate


def lbbsp_per_update(csvs: list[list[dict]]) -> str:
    rows = csvs[0]
    protocols = list(dict.fromkeys(r["protocol"] for r in rows))
    header = ["slow worker"] + [p.replace("fit 32/exec", "fit, 32 steps/execution") for p in protocols]
    table = []
    for slow in dict.fromkeys(r["slow_by"] for r in rows):
        def med(p, key):
            vs = [num(r[key]) for r in rows if r["slow_by"] == slow and r["protocol"] == p]
            vs = [v for v in vs if v is not None]
            return statistics.median(vs) if vs else None

        bsp = med("BSP", "per_update_s")
        cells = [SLOW.get(slow, slow)]
        for p in protocols:
            t, ideal = med(p, "per_update_s"), med(p, "ratio_to_ideal")
            extra = f" ({bsp / t:.2f}x BSP; {ideal:.2f}x ideal)" if p.startswith("LB-BSP") else ""
            cells.append(f"{t:.3f}{extra}")
        table.append(cells)
    repeats = len({r["repeat"] for r in rows})
    caption = ("Seconds per update of X = 2 x B samples, "
               f"{'one run' if repeats == 1 else f'medians of {repeats} runs'}; x BSP: BSP's time over LB-BSP's; "
               "x ideal: over X / sum(v), from each run's own worker speeds.")
    return caption + "\n\n" + markdown(header, table)


# -- one worker step as a call (bench_step_call.py) -----------------------------------------------------------------
STEP_CALLS = {"loop across tasks": "a loop across the worker and the PS",
              "loop across tasks, no cond": "that loop without its `tf.cond`",
              "remote call": "one remote call (today's)"}


def step_call(csvs: list[list[dict]]) -> str:
    rows = csvs[0]
    sizes = list(dict.fromkeys(r["weights_mb"] for r in rows))
    table = []
    for variant in dict.fromkeys(r["variant"] for r in rows):
        cells = [STEP_CALLS.get(variant, variant)]
        for mb in sizes:
            r = next(r for r in rows if r["variant"] == variant and r["weights_mb"] == mb)
            cells.append(f"{num(r['step_ms']):.1f} ms ({num(r['round_trips_per_step']):.2f} RTT)")
        table.append(cells)
    r0 = rows[0]
    caption = (f"A worker's step on one worker and one PS, {num(r0['latency_ms']):g} ms one way (a round trip of "
               f"{num(r0['rtt_ms']):.1f} ms), median over {r0['steps']} steps, by how the step is called and the "
               "size of the weights.")
    return caption + "\n\n" + markdown(["how the step is called"] + [f"{num(mb):g} MB of weights" for mb in sizes],
                                        table)


# -- the coordinator's calls to the PS (bench_coord_call.py) --------------------------------------------------------
CALLS = {"two-part function": "eager call of a function split between the tasks",
         "function on the PS": "eager call of a function run on the PS",
         "remote call": "eager call of a function that makes one `RemoteCall`",
         "coordinator loop": "a standing loop, one `RemoteCall` a turn (today's)"}


def coord_call(csvs: list[list[dict]]) -> str:
    rows = csvs[0]
    table = [[CALLS.get(r["variant"], r["variant"]),
              f"{num(r['drain_from_enqueue_ms']):.0f} ms ({num(r['drain_from_enqueue_rtt']):.2f} RTT)",
              f"{num(r['release_ms']):.0f} ms ({num(r['release_rtt']):.2f} RTT)"] for r in rows]
    r0 = rows[0]
    caption = (f"A control call between the coordinator and the PS, {num(r0['latency_ms']):g} ms one way (a round trip "
               f"of {num(r0['rtt_ms']):.1f} ms), median of {r0['calls']} calls: a record queued on the PS until the "
               "coordinator has it, and a release of 4 tokens until it is answered.")
    return caption + "\n\n" + markdown(["how the call is made", "a record queued on the PS, to the coordinator",
                                        "a release of 4 tokens, answered"], table)


# -- the coordinator at 2-32 workers (bench_coordinator_scale.py) ---------------------------------------------------
SCALE_PROTOCOLS = {"asp": "tfsync ASP", "ssp": "SSP s=3", "bsp": "BSP (PS rounds)", "lbbsp": "LB-BSP (PS rounds)"}


def coordinator_scale(csvs: list[list[dict]]) -> str:
    rows = csvs[0]
    protocols = [p for p in SCALE_PROTOCOLS if p in rows[0]]
    header = ["workers", "`fit`", "`fit`, 32 steps/execution", *(SCALE_PROTOCOLS[p] for p in protocols),
              "a task's memory"]
    table = []
    for r in rows:
        tuned = num(r["fit_32"])
        cells = [r["workers"], f"{num(r['fit']):.0f}", f"{tuned:.0f}"]
        for p in protocols:
            v = num(r[p])
            cells.append("" if v is None else
                         f"{v:.0f} ({v / tuned:.2f}x; {num(r[p + '_coordinator_ms_per_push']):.2f} ms)")
        cells.append(f"{num(r[protocols[0] + '_task_pss_mb']):.0f} MB")
        table.append(cells)
    caption = ("Pushes/s (x `fit` with 32 steps per execution; ms: the coordinator's CPU a push), one run; memory: a "
               "task's proportional set size during the first protocol's run, the fork server's pages shared.")
    return caption + "\n\n" + markdown(header, table)


# -- the tabular MLP on loopback (bench_user_models.py) -------------------------------------------------------------
def user_models(csvs: list[list[dict]], workers: tuple[int, ...]) -> str:
    configs = list(dict.fromkeys(r["configuration"] for rows in csvs for r in rows))
    header = ["configuration"] + [f"{n} workers" for n in workers]
    table = []
    for config in configs:
        cells = [config]
        for rows in csvs:
            r = next((r for r in rows if r["configuration"] == config), None)
            tuned = next((num(t["steps_per_s"]) for t in rows if t["configuration"] == "native " + TUNED), None)
            if r is None:
                cells.append("")
                continue
            sps = num(r["steps_per_s"])
            runs = r["runs"].replace(" ", ", ")
            cells.append(f"{sps:.0f} ({sps / tuned:.2f}x; runs {runs})")
        table.append(cells)
    model = csvs[0][0]["model"]
    caption = (f"Steps/s of the {model} on loopback (x native `fit` with 32 steps per execution; each run's "
               "steps/s), the median of the runs.")
    return caption + "\n\n" + markdown(header, table)


# -- the loss at a switch from BSP to ASP (switch_transient.py) -----------------------------------------------------
VARIANTS = {"keep": "keep momentum and rate (auto's default)", "zero": "momentum buffer emptied",
            "mom_ramp": "momentum ramped from 0", "lr_ramp": "rate ramped from 0.1 eta"}


def switch_transient(csvs: list[list[dict]]) -> str:
    rows = csvs[0]
    seeds = list(dict.fromkeys(r["seed"] for r in rows))
    header = ["at the switch", "before (the last window)", "peak after (pushes after the switch)", "200 pushes after"]
    table = []
    for variant in dict.fromkeys(r["variant"] for r in rows):
        before, peak, later = [], [], []
        for seed in seeds:
            mine = [(int(r["pushes_after_switch"]), num(r["loss"])) for r in rows
                    if r["variant"] == variant and r["seed"] == seed]
            before.append(f"{dict(mine)[-20]:.2f}")
            at, loss = max(((p, v) for p, v in mine if p > 0), key=lambda pv: pv[1])
            peak.append(f"{loss:.2f} ({at})")
            later.append(f"{dict(mine)[200]:.2f}")
        table.append([VARIANTS.get(variant, variant), " / ".join(before), " / ".join(peak), " / ".join(later)])
    caption = (f"Mean training loss over windows of 20 pushes, seeds {' / '.join(seeds)}; a window's pushes are the "
               "20 from the one named (the first window after the switch: pushes 0-19).")
    return caption + "\n\n" + markdown(header, table)


# -- time to accuracy under heterogeneity (bench_heterogeneity.py) --------------------------------------------------
def heterogeneity(csvs: list[list[dict]], model: str, workers: int, latency: float, cpu: float) -> str:
    from heterogeneity_summary import summary_text
    from testbed_bench import typed

    scenarios = {rows[0]["scenario"]: typed(rows) for rows in csvs if rows}
    return summary_text(scenarios, model, workers, latency, cpu)


def heterogeneity_table(model: str, workers: int, latency: float, cpu: float, made_by: str) -> Table:
    from heterogeneity_summary import SCENARIOS

    stem = f"bench_heterogeneity_{model}_{workers}w"
    return Table(stem, tuple(f"{stem}_{s}.csv" for s in SCENARIOS), made_by,
                 functools.partial(heterogeneity, model=model, workers=workers, latency=latency, cpu=cpu),
                 "bench_heterogeneity.py", some=True)


HETEROGENEITY = "sudo python experiments/bench_heterogeneity.py"
TABLES = {t.name: t for t in (
    heterogeneity_table("mlp", 4, 10.0, 0.4, f"{HETEROGENEITY} --scenario SCENARIO --seeds 0,1,2 --epochs 1.0"),
    heterogeneity_table("cnn", 4, 10.0, 0.4, f"{HETEROGENEITY} --model cnn --epochs 6 --scenario SCENARIO "
                                             '--configs "fit 32/exec,BSP,ASP,LB-BSP,auto" --seeds 0,1,2'),
    heterogeneity_table("mlp", 8, 10.0, 0.33, f"{HETEROGENEITY} --workers 8 --cpu 0.33 --epochs 1.5 "
                                              '--scenario SCENARIO --configs "fit 32/exec,BSP,ASP,LB-BSP,auto"'),
    Table("bench_control_path_final", ("bench_control_path_final.csv",),
          'sudo python experiments/bench_control_path.py --workers 4 --latencies 0,10,30 --configs "fit;fit, 32 '
          "steps/execution;tfsync ASP;tfsync SSP s=2;tfsync BSP (coordinator rounds);tfsync BSP (PS rounds);tfsync "
          'LB-BSP (PS rounds)" --out results/bench_control_path_final', control_path, "bench_control_path.py"),
    Table("bench_control_path_8w", ("bench_control_path_8w.csv",),
          'sudo python experiments/bench_control_path.py --workers 8 --configs "fit, 32 steps/execution;tfsync ASP;'
          'tfsync BSP (PS rounds)" --out results/bench_control_path_8w', control_path, "bench_control_path.py"),
    Table("round_parts", ("round_parts.csv",),
          "sudo python experiments/bench_control_path.py --workers 4 --latencies 10,30 --keep DIR, then "
          "python experiments/round_parts.py DIR/run-N --rtt RTT --label LABEL",
          functools.partial(round_parts, labels="rows handed on in the receive loops"), "round_parts.py"),
    Table("bench_testbed_4w_links", ("bench_testbed_4w_links.csv",),
          "sudo python experiments/bench_testbed.py --momentum inverse_n --switch-at 0.625 --repeats 1 "
          "--out results/bench_testbed_4w_links", whole_job, "bench_testbed.py"),
    Table("bench_testbed_8w_latest", ("bench_testbed_8w_30ms.csv", "bench_testbed_8w_links.csv"),
          "sudo python experiments/bench_testbed.py --nodes 8 --workers 8 --epochs 1 --momentum inverse_n "
          "--switch-at 0.875 --repeats 1 --latencies 30 (then --latencies 0,10) --out results/bench_testbed_8w_30ms "
          "(then results/bench_testbed_8w_links)",
          functools.partial(whole_job, names=("bench_testbed_8w_30ms", "bench_testbed_8w_links")), "bench_testbed.py"),
    Table("bench_testbed_lbbsp_links", ("bench_testbed_lbbsp_links.csv",),
          "sudo python experiments/bench_testbed_lbbsp.py --batch-size 2048 --samples 120000 --repeats 1 "
          "--out results/bench_testbed_lbbsp_links", lbbsp_per_update, "bench_testbed_lbbsp.py"),
    Table("bench_step_call", ("bench_step_call.csv",),
          "sudo python experiments/bench_step_call.py --latency 10 --rows 64,10500",
          step_call, "bench_step_call.py"),
    Table("bench_coord_call", ("bench_coord_call.csv",), "sudo python experiments/bench_coord_call.py",
          coord_call, "bench_coord_call.py"),
    Table("bench_coordinator_scale", ("bench_coordinator_scale.csv",),
          "python experiments/bench_coordinator_scale.py --workers 2,4,8,16,32 --steps 1500", coordinator_scale),
    Table("bench_user_models_tabular_256",
          ("bench_user_models_tabular_256_w2.csv", "bench_user_models_tabular_256_w4.csv"),
          'python experiments/bench_user_models.py --models "tabular MLP (regression)" --repeats 2 --workers 2 '
          "(and --workers 4)", functools.partial(user_models, workers=(2, 4))),
    Table("switch_transient", ("switch_transient.csv",), "python experiments/switch_transient.py --seeds 0,1",
          switch_transient, "switch_transient.py"),
)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="tables to write (default: all)")
    p.add_argument("--list", action="store_true", help="name each table, its CSVs and the command that made them")
    args = p.parse_args(argv)
    if args.list:
        for t in TABLES.values():
            print(f"{t.name}: {', '.join(t.csvs)}\n    made by {t.made_by}\n    written by {t.summarise_command()}")
        return 0
    unknown = [n for n in args.names if n not in TABLES]
    if unknown:
        p.error(f"no table {', '.join(unknown)}: one of {', '.join(TABLES)}")
    write(args.names or list(TABLES))
    return 0


if __name__ == "__main__":
    sys.exit(main())

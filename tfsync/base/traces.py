"""CPU-utilisation traces, loaded strictly: nothing is guessed, every choice is an argument.

A :class:`CpuTrace` is one machine's CPU utilisation (percent busy, 0..100) over trace
time t >= 0: sample i holds from ``times[i]`` until the next sample, and the last one
for ``step`` seconds, so the trace covers [0, ``end``), ``end = times[-1] + step``.
``at(t)`` reads it, ``mean(t0, t1)`` averages it. Past the end (or before 0) a trace
loaded with ``wrap=False`` (the default) raises :class:`TraceRangeError`; with
``wrap=True`` it loops (t modulo ``end``).

``load_cpu_traces(path, format="auto", step=None, gaps="refuse", max_gap=None,
wrap=False)``: one trace per machine of a file (or of every ``*.csv`` in a folder).

Formats (``FORMATS``):
- ``alibaba``: Alibaba 2018 ``machine_usage.csv`` rows ``machine_id, time_stamp,
  cpu_util_percent, ...`` (no header, or a header naming those three columns); one
  trace per machine id;
- ``bitbrains``: a Bitbrains GWA-T-12 VM file, ``;``-separated with a header naming
  ``Timestamp [ms]`` (epoch seconds despite the label) and ``CPU usage [%]``;
- ``aggregate``: a data-centre aggregate with a header naming ``cpu_util_percent``
  (percent) or ``avg_cpu`` (a fraction, x 100), and a ``timestamp`` column or none
  (then rows are ``step`` seconds apart and ``step`` must be given);
- ``time_util``: two columns ``time,util`` (seconds, percent), header optional.

Detection (``format="auto"``) reads the first line only: it is a header when none of
its fields is a number. A header picks the format whose columns it names (checked in
the order above; one naming none is refused). Without a header: 2 fields are
``time_util``; 3 or more with a non-numeric first field are ``alibaba``; else refused.

Rows are sorted by time per trace; samples at the same time are averaged; a row whose
CPU field is empty is a missing sample (its time joins a gap). A CPU value outside
[0, 100], a field that is not a number or a row too short is refused.

``step``: the sampling period in seconds; default the median spacing of the samples
(files with times), required for files without times. A gap is a spacing above
``max_gap`` (default ``10 * step``); ``gaps`` says what happens to it:
``refuse`` (default: TraceError naming the line after the gap), ``hold`` (the sample
before the gap holds across it), ``interpolate`` (samples every ``step`` inside it,
linear between its two ends) or ``skip`` (the gap is cut out: later samples move
earlier so it lasts one ``step``). Times then start at 0.

Errors are :class:`TraceError` (a ValueError): one line ``file:line: problem; fix``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

import numpy as np
from .exits import BadInput

GAPS = ("refuse", "hold", "interpolate", "skip")
_CPU_COLUMNS = {"cpu_util_percent": 1.0, "avg_cpu": 100.0}  # aggregate column -> factor to percent


class TraceError(BadInput, ValueError):
    """A trace file (or a trace) cannot be used; ``source``, ``line`` (or None) and
    ``problem`` are kept apart for callers."""

    def __init__(self, source: str, line: int | None, problem: str):
        self.source, self.line, self.problem = source, line, problem
        super().__init__(f"{source}:{line}: {problem}" if line else f"{source}: {problem}")


class TraceRangeError(TraceError):
    """A time outside a non-wrapping trace's span was asked for."""


@dataclass(frozen=True, eq=False)
class CpuTrace:
    """CPU utilisation (percent) of one machine over time; see the module docstring."""

    name: str
    times: np.ndarray
    util: np.ndarray
    step: float | None = None  # seconds the last sample holds; None: the median spacing
    wrap: bool = False  # past the end: loop (True) or TraceRangeError (False)
    _cum: np.ndarray = field(default=None, init=False, repr=False)

    def __post_init__(self):
        times = np.asarray(self.times, dtype=np.float64)
        util = np.asarray(self.util, dtype=np.float64)
        if times.ndim != 1 or times.shape != util.shape or len(times) < 1:
            raise TraceError(self.name, None, f"times and util must be equal-length 1-D arrays, got "
                                              f"shapes {times.shape} and {util.shape}")
        if not (np.all(np.isfinite(times)) and np.all(np.isfinite(util))):
            raise TraceError(self.name, None, "times and util must be finite numbers")
        if len(times) > 1 and not np.all(np.diff(times) > 0):
            raise TraceError(self.name, None, "times must be strictly increasing")
        step = self.step
        if step is None:
            if len(times) < 2:
                raise TraceError(self.name, None, "a one-sample trace needs step= (seconds it holds)")
            step = float(np.median(np.diff(times)))
        if not float(step) > 0:
            raise TraceError(self.name, None, f"step must be > 0 seconds, got {step!r}")
        times = times - times[0]
        widths = np.diff(np.append(times, times[-1] + float(step)))
        set_ = object.__setattr__  # frozen: fields are set once, here
        set_(self, "times", times)
        set_(self, "util", util)
        set_(self, "step", float(step))
        set_(self, "wrap", bool(self.wrap))
        set_(self, "_cum", np.concatenate(([0.0], np.cumsum(util * widths))))

    @property
    def end(self) -> float:
        """Trace seconds covered: [0, end)."""
        return float(self.times[-1] + self.step)

    def _check(self, t: float, upto: bool = False) -> float:
        if self.wrap:
            return t % self.end
        if not (0.0 <= t <= self.end if upto else 0.0 <= t < self.end):
            raise TraceRangeError(self.name, None, f"t = {t:g} s is outside the trace's [0, {self.end:g}) s; "
                                                   "load it with wrap=True to loop it, or run shorter")
        return t

    def at(self, t: float) -> float:
        """Utilisation (percent) at trace time ``t``."""
        t = self._check(float(t))
        i = int(np.searchsorted(self.times, t, side="right")) - 1
        return float(self.util[max(i, 0)])

    def _integral(self, t: float) -> float:
        """Integral of util over [0, t] (t unwrapped when the trace loops)."""
        laps = 0.0
        if self.wrap:
            laps, t = divmod(t, self.end)
        else:
            t = self._check(t, upto=True)
        i = min(max(int(np.searchsorted(self.times, t, side="right")) - 1, 0), len(self.times) - 1)
        return laps * float(self._cum[-1]) + float(self._cum[i]) + float(self.util[i]) * (t - self.times[i])

    def mean(self, t0: float, t1: float) -> float:
        """Mean utilisation over [t0, t1] (``at(t0)`` when t1 <= t0)."""
        if t1 <= t0:
            return self.at(t0)
        return (self._integral(float(t1)) - self._integral(float(t0))) / (t1 - t0)

    def looped(self) -> "CpuTrace":
        """This trace, wrapping around at its end."""
        return replace(self, wrap=True)

    def clipped(self, hi: float) -> "CpuTrace":
        """This trace with utilisation capped at ``hi`` percent."""
        return replace(self, util=np.minimum(self.util, hi))


# -- reading files ---------------------------------------------------------------------------
def _is_number(s: str) -> bool:
    try:
        return math.isfinite(float(s))
    except ValueError:
        return False


def _split(line: str, sep: str) -> list[str]:
    return [f.strip() for f in line.rstrip("\r\n").split(sep)]


@dataclass(frozen=True)
class _Layout:
    """Where a format's fields are: column indices (None: absent) and the CPU factor."""

    sep: str
    header: bool
    time: int | None
    cpu: int
    cpu_name: str
    machine: int | None = None
    factor: float = 1.0


def _index(header: list[str], name: str) -> int | None:
    low = [h.lower() for h in header]
    return low.index(name.lower()) if name.lower() in low else None


def _alibaba(header, sep):
    if header is None:
        return _Layout(sep, False, 1, 2, "cpu_util_percent", machine=0)
    cols = [_index(header, c) for c in ("machine_id", "time_stamp", "cpu_util_percent")]
    return None if None in cols else _Layout(sep, True, cols[1], cols[2], "cpu_util_percent", machine=cols[0])


def _bitbrains(header, sep):
    if header is None or sep != ";":
        return None
    t, c = _index(header, "Timestamp [ms]"), _index(header, "CPU usage [%]")
    return None if t is None or c is None else _Layout(sep, True, t, c, "CPU usage [%]")


def _aggregate(header, sep):
    if header is None or _index(header, "machine_id") is not None:
        return None
    for name, factor in _CPU_COLUMNS.items():
        c = _index(header, name)
        if c is not None:
            return _Layout(sep, True, _index(header, "timestamp"), c, name, factor=factor)
    return None


def _time_util(header, sep):
    if header is None:
        return _Layout(sep, False, 0, 1, "util")
    t, c = _index(header, "time"), _index(header, "util")
    return None if t is None or c is None else _Layout(sep, True, t, c, "util")


FORMATS = {"alibaba": _alibaba, "bitbrains": _bitbrains, "aggregate": _aggregate, "time_util": _time_util}


def detect_format(path: str) -> str:
    """The format ``format="auto"`` picks for ``path`` (the rule in the module docstring)."""
    name, _ = _layout(path, "auto")
    return name


def _first_line(path: str) -> str:
    with open(path, newline="") as f:
        for line in f:
            if line.strip():
                return line
    raise TraceError(path, None, "the file is empty")


def _layout(path: str, fmt: str) -> tuple[str, _Layout]:
    if fmt != "auto" and fmt not in FORMATS:
        raise TraceError(path, None, f"unknown trace format {fmt!r}; valid: auto, {', '.join(FORMATS)}")
    line = _first_line(path)
    sep = ";" if ";" in line else ","
    fields = _split(line, sep)
    header = None if any(_is_number(f) for f in fields) else fields
    if fmt != "auto":
        layout = FORMATS[fmt](header, sep)
        if layout is None:
            raise TraceError(path, 1, f"not a {fmt!r} file: its first line {line.strip()[:80]!r} lacks that "
                                      "format's columns (see tfsync.base.traces)")
        return fmt, layout
    if header is not None:
        for name, make in FORMATS.items():
            layout = make(header, sep)
            if layout is not None and layout.header:
                return name, layout
        raise TraceError(path, 1, f"the header names none of the trace formats' columns ({', '.join(header[:6])}); "
                                  "the formats are described in tfsync.base.traces")
    if len(fields) == 2:
        return "time_util", _time_util(None, sep)
    if len(fields) >= 3 and not _is_number(fields[0]):
        return "alibaba", _alibaba(None, sep)
    raise TraceError(path, 1, f"no header and {len(fields)} fields: not a known trace format; pass format=")


def _read(path: str, layout: _Layout, step: float | None) -> dict[str, list[tuple[float, float, int]]]:
    """{trace name: [(time, util %, line), ...]} in file order."""
    need = max(c for c in (layout.time, layout.cpu, layout.machine) if c is not None) + 1
    out: dict[str, list[tuple[float, float, int]]] = {}
    default = os.path.basename(path)
    row = 0
    with open(path, newline="") as f:
        for n, line in enumerate(f, 1):
            if (n == 1 and layout.header) or not line.strip():
                continue
            fields = _split(line, layout.sep)
            if len(fields) < need:
                raise TraceError(path, n, f"{len(fields)} fields, expected at least {need}")
            if layout.time is None:
                if step is None:
                    raise TraceError(path, None, "has no time column: pass step= (seconds between rows)")
                t = row * float(step)
            else:
                t = number(path, n, fields[layout.time], "time")
            row += 1
            raw = fields[layout.cpu]
            if raw == "":  # a missing sample: its time joins a gap
                continue
            util = number(path, n, raw, layout.cpu_name) * layout.factor
            if not 0.0 <= util <= 100.0:
                raise TraceError(path, n, f"{layout.cpu_name} {raw} is {util:g} %, outside [0, 100]")
            name = fields[layout.machine] if layout.machine is not None else default
            out.setdefault(name, []).append((t, util, n))
    return out


def number(path: str, line: int, raw: str, what: str, error: type | None = None) -> float:
    """``raw`` as a finite float, or ``error`` (a TraceError class) naming file, line and field."""
    error = error or TraceError
    try:
        v = float(raw)
    except ValueError:
        raise error(path, line, f"{what} {raw!r} is not a number") from None
    if not math.isfinite(v):
        raise error(path, line, f"{what} {raw!r} is not a finite number")
    return v


def _build(path: str, name: str, rows, step, gaps: str, max_gap, wrap: bool) -> CpuTrace:
    if len(rows) < 2:
        raise TraceError(path, None, f"trace {name!r} has {len(rows)} sample(s); at least 2 are needed")
    rows = sorted(rows)
    times, utils, lines = [], [], []
    for t, u, n in rows:  # samples at the same time are averaged
        if times and t == times[-1]:
            k = lines[-1][1] + 1
            utils[-1] += (u - utils[-1]) / k
            lines[-1] = (lines[-1][0], k)
        else:
            times.append(t)
            utils.append(u)
            lines.append((n, 1))
    if len(times) < 2:
        raise TraceError(path, None, f"trace {name!r} has one distinct time; at least 2 are needed")
    t, u = np.array(times), np.array(utils)
    step = float(np.median(np.diff(t))) if step is None else float(step)
    if not step > 0:
        raise TraceError(path, None, f"step must be > 0 seconds, got {step!r}")
    limit = 10.0 * step if max_gap is None else float(max_gap)
    d = np.diff(t)
    gap_at = np.flatnonzero(d > limit)
    if len(gap_at) and gaps == "refuse":
        i = int(gap_at[0])
        raise TraceError(path, lines[i + 1][0], f"trace {name!r} has no sample for {d[i]:g} s before this line "
                         f"(max_gap {limit:g} s, {len(gap_at)} such gap(s)); pass gaps='hold', 'interpolate' or "
                         "'skip', or a larger max_gap")
    if len(gap_at) and gaps == "skip":
        shift = np.zeros_like(t)
        for i in gap_at:
            shift[i + 1:] += d[i] - step
        t = t - shift
    elif len(gap_at) and gaps == "interpolate":
        parts_t, parts_u, last = [], [], 0
        for i in gap_at:
            inner = np.arange(t[i] + step, t[i + 1], step)
            parts_t += [t[last:i + 1], inner]
            parts_u += [u[last:i + 1], np.interp(inner, [t[i], t[i + 1]], [u[i], u[i + 1]])]
            last = i + 1
        t, u = np.concatenate(parts_t + [t[last:]]), np.concatenate(parts_u + [u[last:]])
    return CpuTrace(name, t, u, step, wrap)


def load_cpu_traces(path: str, limit: int | None = None, *, format: str = "auto",
                    step: float | None = None, gaps: str = "refuse", max_gap: float | None = None,
                    wrap: bool = False) -> list[CpuTrace]:
    """The traces of ``path`` (a file, or every ``*.csv`` of a folder in numeric-name
    order), at most ``limit``; the options are described in the module docstring."""
    if gaps not in GAPS:
        raise TraceError(path, None, f"gaps={gaps!r} is not a gap policy; valid: {', '.join(GAPS)}")
    if max_gap is not None and not float(max_gap) > 0:
        raise TraceError(path, None, f"max_gap must be > 0 seconds, got {max_gap!r}")
    opts = dict(format=format, step=step, gaps=gaps, max_gap=max_gap, wrap=wrap)
    if os.path.isdir(path):
        files = sorted((f for f in os.listdir(path) if f.endswith(".csv")), key=lambda f: (len(f), f))
        if not files:
            raise TraceError(path, None, "the folder holds no .csv trace")
        traces = []
        for f in files:
            traces += load_cpu_traces(os.path.join(path, f), **opts)
            if limit and len(traces) >= limit:
                break
        return traces[:limit] if limit else traces
    _, layout = _layout(path, format)
    rows = _read(path, layout, step)
    if not rows:
        raise TraceError(path, None, "no CPU sample found")
    traces = [_build(path, name, r, step, gaps, max_gap, wrap) for name, r in rows.items()]
    return traces[:limit] if limit else traces

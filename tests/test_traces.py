"""Strict trace loading (issue 19): formats detected by a stated rule, gaps and the trace's
end handled as documented, bad files refused in one line naming file and line."""

import logging
import time

import numpy as np
import pytest

from tfsync.base.traces import CpuTrace, TraceError, TraceRangeError, detect_format, load_cpu_traces
from tfsync.inject import TraceDriver, load_trace_csv

pytestmark = pytest.mark.unit

ROWS = ["m_1,120,30,50,,,1,1,5", "m_1,0,10,50,,,1,1,5", "m_2,0,40,60,,,1,1,5", "m_1,60,20,50,,,1,1,5",
        "m_2,60,50,60,,,1,1,5"]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_alibaba_rows_with_a_header_line_are_machines_not_an_aggregate(tmp_path):
    head = "machine_id,time_stamp,cpu_util_percent,mem_util_percent,mem_gps,mkpi,net_in,net_out,disk_io_percent\n"
    with_header = write(tmp_path, "usage_h.csv", head + "\n".join(ROWS) + "\n")
    without = write(tmp_path, "usage.csv", "\n".join(ROWS) + "\n")
    assert detect_format(with_header) == detect_format(without) == "alibaba"
    for path in (with_header, without):
        traces = load_cpu_traces(path)
        assert [t.name for t in traces] == ["m_1", "m_2"]
        assert list(traces[0].times) == [0, 60, 120] and list(traces[0].util) == [10, 20, 30]  # sorted
        assert traces[0].step == 60 and traces[0].end == 180
    # an aggregate's header names a CPU column and no machine_id; its rows have no times
    agg = write(tmp_path, "dc_mean_300s.csv", "cpu_util_percent,mem_util_percent\n10,1\n20,1\n30,1\n")
    assert detect_format(agg) == "aggregate"
    with pytest.raises(TraceError, match="has no time column: pass step="):
        load_cpu_traces(agg)  # no step guessed from "300s" in the name
    (t,) = load_cpu_traces(agg, step=30)
    assert list(t.times) == [0, 30, 60] and t.end == 90


def gapped(tmp_path):
    # step 10 s (the median spacing); 170 s without a sample after t = 30 (max_gap 100 s)
    return write(tmp_path, "gapped.csv", "time,util\n0,10\n10,20\n20,30\n30,40\n200,80\n210,90\n")


def test_a_gapped_trace_is_refused_held_interpolated_or_skipped_as_asked(tmp_path):
    path = gapped(tmp_path)
    with pytest.raises(TraceError) as e:
        load_cpu_traces(path)
    assert str(e.value).startswith(f"{path}:6: ") and "170 s" in str(e.value) and "gaps='hold'" in str(e.value)
    (hold,) = load_cpu_traces(path, gaps="hold")
    assert hold.at(35) == hold.at(199) == 40 and hold.at(200) == 80
    (interp,) = load_cpu_traces(path, gaps="interpolate")
    assert interp.at(35) == 40 and interp.at(115) == pytest.approx(40 + (110 - 30) / 170 * 40)
    assert interp.at(205) == 80 and np.all(np.diff(interp.times) <= 10)
    (skip,) = load_cpu_traces(path, gaps="skip")
    assert list(skip.times) == [0, 10, 20, 30, 40, 50] and list(skip.util) == [10, 20, 30, 40, 80, 90]
    (wide,) = load_cpu_traces(path, max_gap=200)  # not a gap at this max_gap
    assert wide.at(100) == 40
    with pytest.raises(TraceError, match="gaps='fill' is not a gap policy; valid: refuse, hold, interpolate, skip"):
        load_cpu_traces(path, gaps="fill")


def test_reading_past_the_end_raises_unless_the_trace_loops(tmp_path):
    (t,) = load_cpu_traces(gapped(tmp_path), gaps="skip")
    assert t.end == 60 and t.at(59.9) == 90
    with pytest.raises(TraceRangeError, match=r"t = 60 s is outside the trace's \[0, 60\) s; load it with wrap=True"):
        t.at(60)
    with pytest.raises(TraceRangeError):
        t.at(-1)
    loop = t.looped()
    assert loop.at(65) == t.at(5) and loop.at(-1) == t.at(59)
    assert t.mean(0, 60) == pytest.approx(np.mean([10, 20, 30, 40, 80, 90]))
    assert t.mean(5, 15) == pytest.approx(15) and loop.mean(55, 65) == pytest.approx(50)
    (same,) = load_cpu_traces(gapped(tmp_path), gaps="skip", wrap=True)
    assert same.wrap and same.at(145) == 30  # 145 mod 60 = 25


@pytest.mark.parametrize("text, line, problem", [
    ("time,util\n0,10\n10,abc\n", 3, "util 'abc' is not a number"),
    ("time,util\n0,10\n10,150\n", 3, "util 150 is 150 %, outside [0, 100]"),
    ("1,0,10\n2,60,20\n", 1, "no header and 3 fields"),
    ("host,load\nx,1\n", 1, "the header names none of the trace formats' columns (host, load)"),
    ("m_1,0,10\nm_1,60\n", 2, "2 fields, expected at least 3"),
    ("time,util\n0,10\n", None, "trace 'bad.csv' has 1 sample(s); at least 2 are needed"),
])
def test_bad_files_are_refused_in_one_line_naming_file_and_line(tmp_path, text, line, problem):
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(TraceError) as e:
        load_cpu_traces(path)
    where = f"{path}:{line}: " if line else f"{path}: "
    assert str(e.value) == where + problem or str(e.value).startswith(where + problem)
    assert "\n" not in str(e.value) and isinstance(e.value, ValueError)
    assert (e.value.source, e.value.line) == (path, line)


def test_a_format_named_explicitly_must_fit_the_file(tmp_path):
    path = gapped(tmp_path)
    with pytest.raises(TraceError, match=r":1: not a 'bitbrains' file"):
        load_cpu_traces(path, format="bitbrains")
    with pytest.raises(TraceError, match="unknown trace format 'csv'; valid: auto, alibaba, bitbrains"):
        load_cpu_traces(path, format="csv")
    with pytest.raises(TraceError, match="index 3 is out of range"):
        load_trace_csv(path, 3, gaps="hold")
    with pytest.raises(TraceError, match="strictly increasing"):
        CpuTrace("t", np.array([0.0, 0.0]), np.array([1.0, 2.0]))


def test_duplicate_times_are_averaged_and_empty_cpu_fields_are_missing_samples(tmp_path):
    path = write(tmp_path, "dup.csv", "m_1,0,10\nm_1,0,30\nm_1,60,\nm_1,120,50\nm_1,180,60\n")
    (t,) = load_cpu_traces(path)
    assert list(t.times) == [0, 120, 180] and list(t.util) == [20, 50, 60]


class FakeBurner:
    def __init__(self):
        self.duty, self.pids, self.duties = 0.0, [1], []

    def set_duty(self, d):
        self.duty = d
        self.duties.append(d)

    def stop(self):
        pass


def test_the_trace_driver_holds_its_last_duty_past_the_end_of_a_trace_that_does_not_loop(tmp_path, caplog):
    (t,) = load_cpu_traces(gapped(tmp_path), gaps="skip")  # 60 trace s
    burner = FakeBurner()
    with caplog.at_level(logging.WARNING, logger="tfsync.inject.trace"):
        driver = TraceDriver(burner, t, time_scale=600.0, interval=0.01).start()  # the end after 0.1 s
        deadline = time.monotonic() + 10
        while driver._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        driver.stop()
    assert not driver._thread.is_alive()
    assert "outside the trace's [0, 60) s" in caplog.text and "holding duty" in caplog.text

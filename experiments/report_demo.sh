#!/bin/bash
# The report in docs/guide/command-line.md of a stopped-and-resumed job: LB-BSP then ASP on 3 workers (MNIST
# MLP), worker 1 slowed 3x for 12 s (an [[inject]] episode, again in the resumed run),
# switched to SSP by `tfsync switch`, stopped by `tfsync stop`, resumed by `tfsync resume`
# (which goes on in SSP until the plan's ASP), then `tfsync report` and a Chromium
# screenshot. About 3 minutes on 2 cores.
#
#   experiments/report_demo.sh [WORK_DIR] [PNG]     (default /tmp/tfsync_demo, results/report_resumed.png)
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:-/tmp/tfsync_demo}
PNG=${2:-$HERE/results/report_resumed.png}
TFSYNC=${TFSYNC:-tfsync}
PY=${PYTHON:-python}
rm -rf "$WORK" && mkdir -p "$WORK"
cat > "$WORK/job.toml" <<TOML
[job]
name = "demo"
run_dir = "$WORK/run"
[cluster]
workers = 3
[data]
name = "mnist"
[model]
name = "mlp"
[train]
batch_size = 64
learning_rate = 0.02
epochs = 4
eval_every = 150
eval_samples = 2000
metrics = ["accuracy", {metric = "SparseTopKCategoricalAccuracy", name = "top3", k = 3}]
checkpoint_every = 150
[[protocol]]
name = "lbbsp"
until = 0.6
lo = 16
[[protocol]]
name = "asp"
[[inject]]
worker = 1
slowdown = 3.0
start_s = 5
duration_s = 12
TOML
J="$WORK/job.toml"
$TFSYNC run "$J" > "$WORK/run1.log" 2>&1 &
RUN=$!
for _ in $(seq 120); do grep -q "cluster up" "$WORK/run1.log" && break; sleep 1; done
sleep 20                                    # the slowdown (5-17 s into training) is over
$TFSYNC switch "$J" --to ssp --staleness 2
sleep 10
$TFSYNC stop "$J"
wait $RUN
$TFSYNC resume "$J" > "$WORK/run2.log" 2>&1
head -2 "$WORK/run2.log"
$TFSYNC report "$WORK/run"
$PY "$HERE/experiments/report_screenshot.py" "$WORK/run/report.html" "$PNG" --height 3300

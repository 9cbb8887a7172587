"""The training loss at a switch from BSP to ASP, in one process, and what a rate or momentum
rule at the switch does to it.

On the 4-worker testbed (one worker at a third of the CPU), auto's switch from LB-BSP to
ASP sent the wide MLP's training loss from 0.55 to 2.34 (chance) within half a second; it
was back by 2 s, and ASP alone from the start shows nothing like it. This replays the
switch without a cluster: BSP rounds (global batch 4 x 64 at 4 x eta, momentum 0.9, the
configuration policy's rates), then ASP pushes of 64 at eta whose gradients are taken at
the weights their worker last read (four workers, one three times slower: a staleness of
about 3, and about 9 for the slow one), on MNIST. Variants, from the first ASP push:

- ``keep``: momentum and rate as the configuration policy has them (auto's default);
- ``zero``: the momentum buffer emptied at the switch;
- ``mom_ramp``: momentum from 0 to 0.9 over ``--ramp`` pushes;
- ``lr_ramp``: the rate from 0.1 eta to eta over ``--ramp`` pushes.

Prints and writes (``results/switch_transient.csv``) the mean training loss over windows
of 20 pushes, from two windows before the switch.

    python experiments/switch_transient.py --seeds 0,1
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from testbed_bench import write_csv  # noqa: E402
VARIANTS = ("keep", "zero", "mom_ramp", "lr_ramp")
WINDOW = 20


def run(variant: str, x, y, seed: int, bsp_rounds: int, asp_pushes: int, ramp: int, lr: float = 0.01,
        momentum: float = 0.9, workers: int = 4, batch: int = 64) -> list[float]:
    import tensorflow as tf

    from wide_mlp import build

    tf.random.set_seed(seed)
    rng = np.random.default_rng(seed)
    model = build()
    weights = model.trainable_variables
    velocity = [tf.zeros_like(v) for v in weights]
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def gradient(bx, by):
        with tf.GradientTape() as tape:
            loss = loss_fn(by, model(bx))
        return loss, tape.gradient(loss, weights)

    def sample(size):
        i = rng.integers(0, len(x), size)
        return x[i], y[i]

    def update(grads, rate, mom):
        for k, v in enumerate(weights):
            velocity[k] = mom * velocity[k] - rate * grads[k]
            v.assign_add(velocity[k])

    losses = []
    for _ in range(bsp_rounds):   # BSP: the mean gradient of n x B at n x eta
        loss, grads = gradient(*sample(workers * batch))
        update(grads, workers * lr, momentum)
        losses.append(float(loss))
    if variant == "zero":
        velocity = [tf.zeros_like(v) for v in weights]
    speeds = [1.0, 1 / 3] + [1.0] * (workers - 2)
    due = [rng.uniform(0.9, 1.1) / s for s in speeds]
    read = [[v.numpy() for v in weights] for _ in speeds]   # the weights each worker last read
    for p in range(asp_pushes):
        w = int(np.argmin(due))
        now = [v.numpy() for v in weights]
        for v, old in zip(weights, read[w]):
            v.assign(old)
        loss, grads = gradient(*sample(batch))
        for v, new in zip(weights, now):
            v.assign(new)
        share = min(1.0, (p + 1) / ramp)
        rate = lr * (0.1 + 0.9 * share) if variant == "lr_ramp" else lr
        update(grads, rate, momentum * share if variant == "mom_ramp" else momentum)
        losses.append(float(loss))
        read[w] = [v.numpy() for v in weights]
        due[w] += rng.uniform(0.9, 1.1) / speeds[w]
    start = bsp_rounds - 2 * WINDOW
    return [float(np.mean(losses[i:i + WINDOW])) for i in range(start, len(losses), WINDOW)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--seeds", default="0")
    p.add_argument("--bsp-rounds", type=int, default=45)
    p.add_argument("--asp-pushes", type=int, default=400)
    p.add_argument("--ramp", type=int, default=100, help="pushes the ramps take")
    p.add_argument("--out", default=os.path.join(ROOT, "results", "switch_transient.csv"))
    p.add_argument("--summarise", action="store_true",
                   help="only write the page's table (results/switch_transient.md) from the CSV")
    args = p.parse_args(argv)
    if args.summarise:   # experiments/tables.py: the table, the command that made the CSV, its date
        import tables
        tables.write(tables.of_script("switch_transient.py"))
        return 0
    for v in args.variants.split(","):
        if v not in VARIANTS:
            p.error(f"--variants {v!r}: one of {', '.join(VARIANTS)}")
    data = np.load(os.path.join(ROOT, "..", "shared", "data", "mnist.npz"))
    x = (data["x_train"].astype("float32") / 255.0)[..., None]
    y = data["y_train"].astype("int64")
    rows = []
    for seed in map(int, args.seeds.split(",")):
        for variant in args.variants.split(","):
            windows = run(variant, x, y, seed, args.bsp_rounds, args.asp_pushes, args.ramp)
            print(f"seed {seed} {variant:9s} peak {max(windows[2:]):.2f}  " + " ".join(f"{w:.2f}" for w in windows),
                  flush=True)
            rows += [{"seed": seed, "variant": variant, "window": i - 2, "pushes_after_switch": (i - 2) * WINDOW,
                      "loss": round(w, 4)} for i, w in enumerate(windows)]
    write_csv(args.out, rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

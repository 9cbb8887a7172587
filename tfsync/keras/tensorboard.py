"""TensorBoard for ``model.fit`` under ParameterServerStrategy, with the switch marked.

tf_keras' ``TensorBoard`` writes no per-batch scalars under ParameterServerStrategy: a
batch hook there is handed a ``RemoteValue`` (the step has only been scheduled, on
whichever worker is idle) and it skips those, whatever ``update_freq`` says. This
subclass fetches the logs of every ``update_freq``-th batch, which waits for that step
(one sync point per ``update_freq`` batches: pick it accordingly), and writes them as
``batch_<name>`` at the batch's index in the whole fit (1, 2, ... across epochs). Given
the ``SyncSwitch`` (``sync=``), it writes ``sync/mode`` (0 BSP, 1 ASP), ``sync/rounds``
(BSP updates) and ``sync/learning_rate`` (of the next update) there and at each epoch
end, and the switch as the text summary ``sync_switch`` at the step it happened.

    tb = tfsync.keras.TensorBoard("logs", update_freq=10, sync=sync)
    model.fit(..., callbacks=[sync.callback(), tb])
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from .sync_switch import ASP


class TensorBoard(keras.callbacks.TensorBoard):
    """``keras.callbacks.TensorBoard`` whose ``update_freq`` works under
    ParameterServerStrategy; ``sync``: a ``SyncSwitch`` whose mode and switch to write."""

    def __init__(self, log_dir="logs", update_freq="epoch", sync=None, **kwargs):
        super().__init__(log_dir=log_dir, update_freq=update_freq, **kwargs)
        self.sync = sync
        self.batches = 0  # batch hooks seen in this fit
        self._switch_written = False
        self._written_at = None   # the step of the last write

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self.batches, self._switch_written, self._written_at = 0, False, None

    # The parent makes its writer the default for the whole fit (a context entered in
    # on_train_begin, left in on_train_end): two such callbacks in one fit leave each
    # other's contexts in the wrong order and fit fails at its end. Writes here name
    # their writer instead, so the parent's own batch writes (of dict logs) go nowhere.
    def _push_writer(self, writer, step):
        pass

    def _pop_writer(self):
        pass

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        self.batches += 1
        if self.update_freq == "epoch" or self.batches % self.update_freq:
            return
        if logs is not None and not isinstance(logs, dict) and hasattr(logs, "fetch"):
            logs = logs.fetch()  # a RemoteValue: waits for that step
        self._write({f"batch_{k}": v for k, v in (logs or {}).items()})

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if self._written_at != self.batches:   # (the epoch's last batch may have written them)
            self._write({})

    def _write(self, values: dict) -> None:
        self._written_at = self.batches
        sync = self.sync
        if sync is not None:
            mode = int(sync.mode.numpy())
            values = {**values, "sync/mode": mode, "sync/rounds": int(sync.rounds.numpy()),
                      "sync/learning_rate": float(sync.rate().numpy())}
        with self._train_writer.as_default(), tf.summary.record_if(True):
            for name, value in values.items():
                tf.summary.scalar(name, value, step=self.batches)
            if sync is not None and mode == ASP and sync.plan.first == "bsp" and not self._switch_written:
                steps = int(sync.switch_step.numpy())
                tf.summary.text("sync_switch", f"BSP -> ASP after {steps} BSP steps "
                                f"({int(sync.rounds.numpy())} rounds)", step=max(steps, 0))
                self._switch_written = True

"""Which error a failed step is reported with (tfsync.engine.results): ClusterCoordinator
cancels every closure once one fails, and the cancelled ones may be fetched first."""

import queue

import pytest
import tensorflow as tf

from tfsync.engine.results import error_line, root_error

pytestmark = pytest.mark.unit


def _results(*results):
    """The lifecycle's queue of results, holding ``results``."""
    q = queue.Queue()
    for r in results:
        q.put(r)
    return q


def test_a_cancelled_closure_is_reported_with_the_error_that_failed_the_step():
    gen, old = object(), object()
    cancelled = tf.errors.CancelledError(None, None, "The corresponding function is cancelled.")
    cause = tf.errors.InvalidArgumentError(None, None, "Graph execution error:\n\nlabels out of range")
    results = _results((gen, [1.0], None), (old, None, ValueError("another generation's")),
                 (gen, None, cancelled), (gen, None, cause))
    got = root_error(results, gen, cancelled, wait_s=1.0)
    assert got is cause and error_line(got) == "labels out of range"
    assert root_error(_results(), gen, cancelled, wait_s=0.05) is cancelled   # none came: the cancellation
    assert root_error(_results((gen, None, cause)), gen, cause) is cause   # not a cancellation: as it is

"""The coordinator's receive links hand the PS's rows on in the PS's order
(tfsync.engine.links.InOrder): several drains wait on the PS at once, each answer is a
numbered batch, and the answers can come back in any order. The drains themselves run in
every cluster test."""

import numpy as np
import pytest

from tfsync.engine.links import InOrder

pytestmark = pytest.mark.unit


def batch(*rows: float) -> np.ndarray:
    return np.array([[r] for r in rows], dtype=np.float64)


def handed(batches: list[np.ndarray]) -> list[float]:
    return [float(r[0]) for b in batches for r in b]


def test_a_batch_that_overtakes_an_earlier_one_waits_for_it():
    order = InOrder()
    order.add(1, batch(3.0, 4.0))
    assert handed(order.ready()) == []
    order.add(0, batch(1.0, 2.0))
    assert handed(order.ready()) == [1.0, 2.0, 3.0, 4.0]
    order.add(3, batch(6.0))
    order.add(2, batch(5.0))
    assert handed(order.ready()) == [5.0, 6.0]
    assert handed(order.ready()) == []


def test_what_is_held_when_the_links_end_comes_out_in_order_gaps_and_all():
    order = InOrder()
    order.add(0, batch(1.0))
    assert handed(order.ready()) == [1.0]
    order.add(4, batch(9.0))
    order.add(2, batch(7.0))
    assert handed(order.ready()) == []
    assert handed(order.rest()) == [7.0, 9.0]
    assert order.rest() == [] and order.ready() == []

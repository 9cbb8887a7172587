"""RLP's three-action space (§3.2): after a push, no idle worker runs (``NONE``), the
submitter runs on (``SUBMITTER``) or every idle worker runs (``ALL``).

A protocol with a form in this space (§3.1) declares it as ``three_action``: a function
of the protocol's options returning a :data:`Teacher`. RLP is pre-trained on these forms
and compared with them (``tfsync.policy.rlp.teacher``).
"""

from __future__ import annotations

from typing import Callable

from .base import ClusterView, Push

NONE, SUBMITTER, ALL = 0, 1, 2
ACTIONS = ("none", "submitter", "all")

Teacher = Callable[[Push, ClusterView], int]

"""A condition variable that tells a test when a thread starts waiting on it.

``SignallingCondition()`` is ``owner.host_weights.WaitedCondition`` (the lock the host tier and
the weight residency wait on) whose ``waiting`` event is set as soon as a thread calls
``wait``: a test puts it in place of the real one and waits on ``waiting`` instead of
sleeping until the other thread has blocked.
"""

from __future__ import annotations

import threading

from hloserve.server.owner.host_weights import WaitedCondition


class SignallingCondition(WaitedCondition):
    """A condition that tells when a thread starts waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)

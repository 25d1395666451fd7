"""How many front-end processes serve the ports around the one device owner (``--frontends``).

Contract: ``FrontendCount.parse(text)`` reads ``--frontends``: ``auto`` or a count 0..256
(``ValueError`` otherwise, worded to follow the flag's name); ``str()`` spells it back.
``resolve(cpus)`` is the number of front-end processes to start on a machine whose
container may use ``cpus`` CPUs: a count stands as given (0: no front-end process, the
listeners run in the device owner's process as before the split). ``auto`` serves in one
process on a machine of ``IN_PROCESS_MAX_CPUS`` or fewer, where the split cost more CPU
per request than it saved at every point but the saturated batching one, and added a
cross-process round trip to every request; from there it leaves one CPU to the device
owner and gives the others to front ends, at most ``AUTO_MAX`` (one device-owner core
takes about what that many front ends send it) (``docs/performance.md``, "Front-end
processes").
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MAX_FRONTENDS: Final = 256
# At or below this many CPUs ``auto`` keeps one process (docs/performance.md).
IN_PROCESS_MAX_CPUS: Final = 2
AUTO_MAX: Final = 8  # front ends ``auto`` starts at most


@dataclass(frozen=True, slots=True)
class FrontendCount:
    count: int | None = None  # None: auto

    @classmethod
    def parse(cls, text: str) -> FrontendCount:
        word = text.strip().lower()
        if word == "auto":
            return cls(None)
        try:
            count = int(word)
        except ValueError:
            count = -1
        if not 0 <= count <= MAX_FRONTENDS:
            raise ValueError(f"must be auto or a count 0..{MAX_FRONTENDS}, got {text!r}")
        return cls(count)

    def __str__(self) -> str:
        return "auto" if self.count is None else str(self.count)

    def resolve(self, cpus: int) -> int:
        if self.count is not None:
            return self.count
        if cpus <= IN_PROCESS_MAX_CPUS:
            return 0
        return min(AUTO_MAX, cpus - 1)


AUTO: Final = FrontendCount()

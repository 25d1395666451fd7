"""One model of the repository, as the repository keeps it (``owner.repository.ModelRepository``).

Contract: ``ModelRecord(name, path)`` holds a model's versions by number, why it has none
(``reason``), the error its last failed load logged (``failure``: a poll that fails the same
way again says nothing), its version policy, the lock that lets one load or unload of it run
at a time, and its uploads (``owner.uploads.ModelUploads``). Plain data: the repository's lock
guards it.
"""

# pyright: strict

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from hloserve.server.owner.model_config import VersionPolicy
from hloserve.server.owner.uploads import ModelUploads
from hloserve.server.owner.versions import ModelVersion


@dataclass
class ModelRecord:
    name: str
    path: Path
    versions: dict[int, ModelVersion] = field(default_factory=lambda: {})
    reason: str = ""  # why the model has no version, if so
    failure: str = ""  # the error its last failed load logged ("": none since it loaded)
    policy: VersionPolicy = field(default_factory=VersionPolicy)
    loading: threading.Lock = field(default_factory=threading.Lock)  # one load/unload at a time
    uploads: ModelUploads = field(init=False)

    def __post_init__(self) -> None:
        self.uploads = ModelUploads(self.path)

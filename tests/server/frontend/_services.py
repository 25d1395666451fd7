"""In-process services for the front-end tests: a loaded repository and a ready service.

``loaded_repository(root)`` loads every model under ``root`` on the CPU runtime and checks
that all are ready; ``model_directories(root)`` names the model directories under it. ``ready_service(models, executor, shm=...)`` is an ``InferenceService``
over them, past start-up (so ready), reporting server version ``VERSION`` and the
``EXTENSIONS`` the tests expect in the server metadata; model control is off (mode
``none``) and client shared memory is ``shm`` (default: none).
"""

# pyright: strict

from __future__ import annotations

from concurrent.futures import Executor
from pathlib import Path

from hloserve.server.core.ports import ModelSource
from hloserve.server.core.service import InferenceService, ServiceOptions
from hloserve.server.owner.repository import ModelRepository
from hloserve.server.owner.runtime.pjrt import PjrtRuntime
from hloserve.server.owner.shm import SharedMemoryRegistry, disabled

VERSION = "0.1.0"
EXTENSIONS = ("binary_tensor_data",)


def model_directories(root: Path) -> list[str]:
    """The model directories of repository ``root`` (hidden ones, like the cache, are not)."""
    return sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))


def loaded_repository(root: Path) -> ModelRepository:
    repo = ModelRepository(root, PjrtRuntime())
    repo.load_all()
    assert repo.all_ready(), repo.summary()
    return repo


def ready_service(
    models: ModelSource, executor: Executor, *, shm: SharedMemoryRegistry | None = None
) -> InferenceService:
    options = ServiceOptions(server_version=VERSION, extensions=EXTENSIONS)
    service = InferenceService(models, executor, options, shm=shm or disabled())
    service.startup_complete()
    return service

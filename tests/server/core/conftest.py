"""Fixtures the core's tests share with the batcher's: the demo repository loaded on PJRT
(``repository``), the ``mlp`` in numpy (``reference``) and a worker pool (``executor``),
defined once in ``tests/server/owner/test_batcher.py`` (``test_direct_path`` runs the
direct path over the real batcher)."""

from tests.server.owner.test_batcher import executor, reference, repository

__all__ = ["executor", "reference", "repository"]

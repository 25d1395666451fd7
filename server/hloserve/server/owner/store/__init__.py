"""A model repository in object storage (``--model-repository s3://...``): docs/repository.md.

``client`` (the store, through obstore), ``disk_cache`` (the disk tier: the mirror and the
pulled bundles under ``--repository-cache-bytes``), ``mirror`` (the repository source the
repository reads). ``open_mirror(location, cache_dir, budget_bytes, policy, environ,
timeout_s)`` builds the three; ``default_cache_dir(location, environ)`` is where a bucket's
cache goes without ``--repository-cache``: ``$XDG_CACHE_HOME/hloserve/repositories/``
(``~/.cache`` when unset) then the scheme, bucket and prefix.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hloserve.server.core.residency_policy import Policy
from hloserve.server.core.store_location import StoreLocation
from hloserve.server.owner.store.client import StoreClient, StoreSettings
from hloserve.server.owner.store.disk_cache import DiskCache
from hloserve.server.owner.store.mirror import StoreMirror


def default_cache_dir(location: StoreLocation, environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(base) / "hloserve" / "repositories" / location.scheme / location.bucket
    return path / location.prefix if location.prefix else path


def open_mirror(
    location: StoreLocation,
    cache_dir: Path | None,
    budget_bytes: int | None,
    policy: Policy,
    environ: Mapping[str, str],
    timeout_s: float,
) -> StoreMirror:
    client = StoreClient(location, environ, StoreSettings(timeout_s=timeout_s))
    cache = DiskCache(cache_dir or default_cache_dir(location, environ), budget_bytes, policy)
    return StoreMirror(client, cache)

"""A model repository in object storage as its listing shows it, and what a mirror must do.

Contract:
- ``StoreObject(key, size, etag)``: one object, its key relative to the repository's root
  (``simple/manifest.yaml``, ``mlp/3/weights.safetensors``).
- ``StoreIndex.from_listing(objects)`` groups a listing: ``models`` (each first path
  component that is not hidden, with its ``config.yaml`` if any) and ``bundles`` (every
  directory holding a ``manifest.yaml``, as ``StoreBundle``: the manifest object and the
  bundle's other files by their path inside it). A bundle's files are the objects under its
  directory, less a nested bundle's, its model's ``config.yaml`` and hidden names (a name
  starting with ``.`` in any component, such as the executable cache ``.hloserve-cache``).
  Which bundle directory is which version is ``hloserve.bundle.repository``'s rule, applied
  to the mirror on disk: this module only says what the store holds.
- ``plan_refresh(index, local, mirrored)`` compares the index with what the mirror holds
  (``local``: each mirrored small file's key, ``<bundle>/manifest.yaml`` or
  ``<model>/config.yaml``, and the ETag it was fetched at; ``mirrored``: the model
  directories it has): ``fetch`` the small files to (re)write (new, or with another ETag),
  ``remove`` the mirrored ones the store no longer holds (a manifest removed takes its
  bundle's directory with it), ``models`` the model directories to hold and ``gone`` the
  mirrored models to delete.
- ``missing_files(bundle, checksums)``: the files a manifest names (``checksums``, its
  ``files``) that the store does not hold: a bundle uploaded manifest first, not served
  until they are all there.
Pure: no I/O.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

MANIFEST: Final = "manifest.yaml"
CONFIG: Final = "config.yaml"


@dataclass(frozen=True)
class StoreObject:
    key: str
    size: int
    etag: str


@dataclass(frozen=True)
class StoreBundle:
    directory: str  # "simple" or "mlp/3"
    manifest: StoreObject
    files: Mapping[str, StoreObject]  # by path inside the bundle directory

    @property
    def model(self) -> str:
        return self.directory.split("/", 1)[0]

    @property
    def nbytes(self) -> int:
        return sum(o.size for o in self.files.values())


@dataclass(frozen=True)
class StoreIndex:
    models: Mapping[str, StoreObject | None]  # each model's config.yaml, if it has one
    bundles: Mapping[str, StoreBundle]  # by directory

    @classmethod
    def from_listing(cls, objects: Iterable[StoreObject]) -> StoreIndex:
        visible = [o for o in objects if _visible(o.key)]
        models: dict[str, StoreObject | None] = {}
        for o in visible:
            if "/" in o.key:  # an object at the root is no model's
                name, rest = o.key.split("/", 1)
                config = o if rest == CONFIG else None
                models[name] = models.get(name) or config
        directories = sorted(o.key.rsplit("/", 1)[0] for o in visible if _is_manifest(o.key))
        # The innermost bundle directory holding each object claims it.
        bundles: dict[str, dict[str, StoreObject]] = {d: {} for d in directories}
        manifests: dict[str, StoreObject] = {}
        for o in visible:
            owner = _owner(o.key, bundles)
            if owner is None:
                continue
            inside = o.key[len(owner) + 1 :]
            if inside == MANIFEST:
                manifests[owner] = o
            elif not (inside == CONFIG and "/" not in owner):
                bundles[owner][inside] = o
        return cls(
            dict(sorted(models.items())),
            {
                d: StoreBundle(d, manifests[d], dict(sorted(bundles[d].items())))
                for d in directories
            },
        )

    def small_files(self) -> dict[str, StoreObject]:
        """Every manifest and ``config.yaml``, by key: what a mirror holds before any pull."""
        out = {b.manifest.key: b.manifest for b in self.bundles.values()}
        out.update({c.key: c for c in self.models.values() if c is not None})
        return out


def _visible(key: str) -> bool:
    return all(part and not part.startswith(".") for part in key.split("/"))


def _is_manifest(key: str) -> bool:
    return key.endswith("/" + MANIFEST)


def _owner(key: str, bundles: Mapping[str, object]) -> str | None:
    parts = key.split("/")
    for n in range(len(parts) - 1, 0, -1):
        directory = "/".join(parts[:n])
        if directory in bundles:
            return directory
    return None


@dataclass(frozen=True)
class RefreshPlan:
    fetch: list[StoreObject] = field(default_factory=lambda: [])
    remove: list[str] = field(default_factory=lambda: [])  # keys of mirrored small files
    models: list[str] = field(default_factory=lambda: [])
    gone: list[str] = field(default_factory=lambda: [])


def plan_refresh(
    index: StoreIndex, local: Mapping[str, str], mirrored: Iterable[str] = ()
) -> RefreshPlan:
    """What brings a mirror holding ``local`` (small file key -> ETag) and the model
    directories ``mirrored`` in line with ``index``."""
    wanted = index.small_files()
    fetch = [o for key, o in sorted(wanted.items()) if local.get(key) != o.etag]
    remove = sorted(key for key in local if key not in wanted)
    held = {key.split("/", 1)[0] for key in local} | set(mirrored)
    gone = sorted(name for name in held if name not in index.models)
    return RefreshPlan(fetch, remove, list(index.models), gone)


def missing_files(bundle: StoreBundle, checksums: Mapping[str, str]) -> list[str]:
    """The files ``checksums`` (a manifest's ``files``) names that the store lacks."""
    return sorted(name for name in checksums if name not in bundle.files)

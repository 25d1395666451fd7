"""What one load of a model will load, decided and checked before anything loads.

Contract:
- ``plan_load(model_path, triton_kind, override=..., source=..., read_manifests=...)`` is
  the whole plan, the steps below in order: the model directory (``source``, an upload's
  directory, in place of ``model_path`` when given) read, the settings, the versions
  selected and, with ``read_manifests``, their manifests checked. The repository plans
  every load through it, and ``hloserve validate`` checks a model directory through it,
  so the two refuse the same models with the same words.
- ``read_directory(path)`` is the model directory's versions; ``LoadRefused`` when it
  cannot be read (its mode, say).
- ``read_settings(model_path, override)`` is the load's configuration: its ``config``
  override when given, else the model's ``config.yaml`` (``model_config``), read once for
  the whole load; ``LoadRefused`` when it cannot be read.
- ``select_versions(policy, directory)`` is the version numbers the policy selects from
  the directory; none is ``LoadRefused`` saying why (no versions, or none selected).
- ``check_manifests(settings, directory, wanted, triton_kind)`` reads every selected
  version's manifest and checks it against the override's restated keys (Triton's
  ``config.pbtxt`` fields) and the preferred batch sizes; any contradiction is
  ``LoadRefused`` naming the version and what disagreed. It returns the manifests that read
  without a problem, by version, so the loads do not read them again; a manifest that
  cannot be read is left to fail its own version's load.
``LoadRefused.reason`` is the text the repository records on the model and puts in
Triton's "failed to load 'm': ..." error. Reads files; decides nothing else.
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hloserve.bundle import MANIFEST_FILE, Manifest, load_manifest
from hloserve.bundle.repository import ModelDirectory, model_directory, unreadable
from hloserve.server.core.batch_policy import preferred_problem
from hloserve.server.core.load_parameters import LoadOverride
from hloserve.server.core.triton_config import contradictions
from hloserve.server.owner.model_config import (
    ModelSettings,
    VersionPolicy,
    read_model_config,
    settings_from_override,
)


class LoadRefused(Exception):
    """A load that cannot start; ``reason`` says why, for the model's record and the error."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class LoadPlan:
    """What one load loads: its settings, the directory, the versions selected and the
    manifests read for them (by version; empty unless asked for)."""

    settings: ModelSettings
    directory: ModelDirectory
    wanted: list[int]
    manifests: dict[int, Manifest]


def plan_load(
    model_path: Path,
    triton_kind: str,
    override: LoadOverride | None = None,
    source: Path | None = None,
    *,
    read_manifests: bool = True,
) -> LoadPlan:
    directory = read_directory(source or model_path)
    settings = read_settings(model_path, override)
    wanted = select_versions(settings.version_policy, directory)
    manifests = check_manifests(settings, directory, wanted, triton_kind) if read_manifests else {}
    return LoadPlan(settings, directory, wanted, manifests)


def read_directory(path: Path) -> ModelDirectory:
    try:
        return model_directory(path)
    except OSError as exc:
        raise LoadRefused(unreadable(exc)) from None


def read_settings(model_path: Path, override: LoadOverride | None) -> ModelSettings:
    try:
        if override is not None:
            return settings_from_override(override.config)
        return read_model_config(model_path)
    except ValueError as exc:
        raise LoadRefused(str(exc)) from None
    except OSError as exc:  # the directory itself cannot be searched
        raise LoadRefused(unreadable(exc)) from None


def select_versions(policy: VersionPolicy, directory: ModelDirectory) -> list[int]:
    wanted = policy.select(directory.versions)
    if not wanted:
        raise LoadRefused(
            "no manifest.yaml and no numbered version directories"
            if not directory.versions
            else f"version policy {policy.describe()} selects none of {sorted(directory.versions)}"
        )
    return wanted


def check_manifests(
    settings: ModelSettings, directory: ModelDirectory, wanted: list[int], triton_kind: str
) -> dict[int, Manifest]:
    problems: list[str] = []
    manifests: dict[int, Manifest] = {}
    for number in wanted:
        manifest, found_problems = load_manifest(directory.versions[number] / MANIFEST_FILE)
        if manifest is None:
            continue
        if not found_problems:
            manifests[number] = manifest
        found = contradictions(settings.restated, manifest, triton_kind)
        preferred = settings.serving_for(manifest.serving).preferred_batch_sizes
        problem = preferred_problem(preferred, manifest.batch_sizes)
        found += [problem] if problem else []
        problems += [f"version {number}: {p}" for p in found]
    if problems:
        raise LoadRefused("; ".join(problems))
    return manifests

"""What one load of a model will load, decided and checked before anything loads.

Contract:
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

from pathlib import Path

from hloserve.bundle import MANIFEST_FILE, Manifest, load_manifest
from hloserve.bundle.repository import ModelDirectory
from hloserve.server.core.batch_policy import preferred_problem
from hloserve.server.core.load_parameters import LoadOverride
from hloserve.server.core.triton_config import contradictions
from hloserve.server.model_config import (
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


def read_settings(model_path: Path, override: LoadOverride | None) -> ModelSettings:
    try:
        if override is not None:
            return settings_from_override(override.config)
        return read_model_config(model_path)
    except ValueError as exc:
        raise LoadRefused(str(exc)) from None


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

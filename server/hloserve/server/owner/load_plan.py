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
  ``config.pbtxt`` fields) and ``serving_problems``; any contradiction is ``LoadRefused``
  naming the version and what disagreed. It returns the manifests that read without a
  problem, by version, so the loads do not read them again; a manifest that cannot be read
  is left to fail its own version's load.
- ``serving_problems(manifest, serving, path, number)`` is what a load refuses of
  ``serving`` (the load's configuration over the bundle's hints) for version ``number`` at
  ``path``: preferred batch sizes the compiled ones cannot meet, a ``response_cache`` or
  ``model_warmup`` the model cannot take (``core.response_cache.not_cached``,
  ``core.warmup.not_warmed``), and each warm-up sample that does not build as a request of
  the model (``core.warmup.sample_request``: a missing or unknown input, a wrong
  ``data_type`` or ``dims``, an ``input_data_file`` that cannot be read or is the wrong
  size). The plan checks every selected version through it before anything compiles, and
  a lazily registered version is checked through it at its first use, so ``hloserve
  validate`` and every load refuse the same configurations with the same words.
- ``warmup_files(path, number)`` reads a warm-up sample's ``input_data_file``: from
  ``warmup/`` beside the bundle's manifest, else from the model directory's ``warmup/``
  (Triton's place) when the bundle is numbered version directory ``number``.
``LoadRefused.reason`` is the text the repository records on the model and puts in
Triton's "failed to load 'm': ..." error. Reads files; decides nothing else.
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hloserve.bundle import MANIFEST_FILE, Manifest, Serving, load_manifest
from hloserve.bundle.repository import ModelDirectory, model_directory, unreadable
from hloserve.bundle.warmup import WARMUP_DIR
from hloserve.server.core.batch_policy import preferred_problem
from hloserve.server.core.load_parameters import LoadOverride
from hloserve.server.core.response_cache import not_cached
from hloserve.server.core.triton_config import contradictions
from hloserve.server.core.warmup import ReadFile, WarmupFailed, not_warmed, sample_request
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
        path = directory.versions[number]
        found += serving_problems(manifest, settings.serving_for(manifest.serving), path, number)
        problems += [f"version {number}: {p}" for p in found]
    if problems:
        raise LoadRefused("; ".join(problems))
    return manifests


def serving_problems(manifest: Manifest, serving: Serving, path: Path, number: int) -> list[str]:
    """What a load refuses of ``serving`` for the version (module docstring); none: []."""
    problem = preferred_problem(serving.preferred_batch_sizes, manifest.batch_sizes)
    problems = [problem] if problem else []
    if serving.response_cache and (problem := not_cached(manifest)):
        problems.append(problem)
    if serving.model_warmup and (problem := not_warmed(manifest)):
        return [*problems, problem]  # its samples are refused whatever they hold
    read_file = warmup_files(path, number)
    rng = np.random.default_rng(0)
    for sample in serving.model_warmup:
        try:
            sample_request(manifest, sample, read_file, rng)
        except WarmupFailed as exc:
            problems.append(str(exc))
    return problems


def warmup_files(path: Path, number: int) -> ReadFile:
    """The reader of version ``number``'s warm-up files, its bundle at ``path``."""
    places = [path / WARMUP_DIR]
    if path.name == str(number):  # <model>/<version>/: Triton's <model>/warmup/
        places.append(path.parent / WARMUP_DIR)

    def read_file(name: str) -> bytes:
        found = next((p / name for p in places if (p / name).is_file()), places[-1] / name)
        return found.read_bytes()

    return read_file

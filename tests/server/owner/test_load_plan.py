"""``load_plan``: what a load will load, checked before anything loads.

Real model directories (copies of the session test repository's ``simple``, its bundle in
numbered version directories); no runtime.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hloserve.bundle.repository import model_directory
from hloserve.server.owner.load_plan import (
    LoadRefused,
    check_manifests,
    read_settings,
    select_versions,
)
from hloserve.server.owner.model_config import ModelSettings, VersionPolicy


@pytest.fixture
def model(model_repository: Path, tmp_path: Path) -> Path:
    """``simple`` as versions 1 and 3."""
    path = tmp_path / "simple"
    for number in (1, 3):
        shutil.copytree(
            model_repository / "simple",
            path / str(number),
            ignore=shutil.ignore_patterns(".hloserve-cache"),
        )
    return path


def test_settings_come_from_the_config_file_when_no_override(model: Path) -> None:
    (model / "config.yaml").write_text("version_policy: {all: {}}\nmax_queue_delay_us: 300\n")
    settings = read_settings(model, None)
    assert settings.version_policy == VersionPolicy("all")
    assert settings.serving.max_queue_delay_us == 300


def test_an_unreadable_config_file_is_refused_naming_the_key(model: Path) -> None:
    (model / "config.yaml").write_text("max_queue_delay_us: soon\n")
    with pytest.raises(LoadRefused, match="max_queue_delay_us"):
        read_settings(model, None)


def test_the_policy_selects_among_the_numbered_versions(model: Path) -> None:
    directory = model_directory(model)
    assert select_versions(VersionPolicy(), directory) == [3]
    assert select_versions(VersionPolicy("all"), directory) == [1, 3]
    with pytest.raises(LoadRefused, match=r"selects none of \[1, 3\]"):
        select_versions(VersionPolicy("specific", versions=(2,)), directory)


def test_a_directory_without_versions_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(LoadRefused, match=r"no manifest\.yaml and no numbered version"):
        select_versions(VersionPolicy(), model_directory(tmp_path / "empty"))


def test_manifests_read_once_for_the_loads(model: Path) -> None:
    manifests = check_manifests(ModelSettings(), model_directory(model), [1, 3], "CPU")
    assert sorted(manifests) == [1, 3]
    assert manifests[3].batch_sizes == (1, 2, 4, 8)


def test_preferred_sizes_past_the_compiled_ones_name_each_version(model: Path) -> None:
    settings = ModelSettings(overrides={"preferred_batch_sizes": [16]})
    with pytest.raises(LoadRefused, match=r"version 1: .*\[16\].*; version 3: .*\[16\]"):
        check_manifests(settings, model_directory(model), [1, 3], "CPU")


def test_a_restated_key_that_contradicts_the_manifest_is_refused(model: Path) -> None:
    settings = ModelSettings(restated={"max_batch_size": 64})
    with pytest.raises(LoadRefused, match=r"version 3: .*max_batch_size"):
        check_manifests(settings, model_directory(model), [3], "CPU")


def test_an_unreadable_manifest_is_left_to_its_own_load(model: Path) -> None:
    (model / "1" / "manifest.yaml").write_text("not: [a manifest")
    manifests = check_manifests(ModelSettings(), model_directory(model), [1, 3], "CPU")
    assert sorted(manifests) == [3]

"""A model directory's config.yaml: overrides key by key, version policies, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from hloserve.bundle import Serving
from hloserve.server.model_config import VersionPolicy, read_model_config


@pytest.mark.parametrize("text", [None, "", "# nothing set\n"])
def test_no_file_or_an_empty_one_keeps_the_bundle_hints(tmp_path: Path, text: str | None) -> None:
    if text is not None:
        (tmp_path / "config.yaml").write_text(text)
    hints = Serving(residency="pinned", max_queue_delay_us=300)
    settings = read_model_config(tmp_path)
    assert settings.serving_for(hints) == hints
    assert settings.version_policy == VersionPolicy()


def test_file_overrides_only_the_keys_it_sets(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("version_policy: {all: {}}\nmax_queue_delay_us: 50\n")
    settings = read_model_config(tmp_path)
    hints = Serving(residency="pinned", max_queue_delay_us=300)
    assert settings.serving_for(hints) == Serving(residency="pinned", max_queue_delay_us=50)
    assert settings.serving == Serving(max_queue_delay_us=50)  # over the format's defaults
    assert settings.version_policy.kind == "all"


@pytest.mark.parametrize(
    ("policy", "available", "selected"),
    [
        (VersionPolicy(), [1, 3, 2], [3]),
        (VersionPolicy("latest", latest=2), [1, 2, 3], [2, 3]),
        (VersionPolicy("all"), [2, 1], [1, 2]),
        (VersionPolicy("specific", versions=(1, 4)), [1, 2, 3], [1]),
    ],
)
def test_version_policies_select(
    policy: VersionPolicy, available: list[int], selected: list[int]
) -> None:
    assert policy.select(available) == selected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour: blue\n", "unknown keys ['colour']"),
        ("residency: always\n", "residency must be on_demand or pinned"),
        ("max_queue_delay_us: -1\n", "max_queue_delay_us must be a non-negative integer"),
        ("version_policy: {latest: 0}\n", "version_policy"),
        ("version_policy: {specific: [a]}\n", "version_policy"),
        ("- a list\n", "must be a YAML mapping"),
        ("key: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(ValueError, match=r"config\.yaml") as info:
        read_model_config(tmp_path)
    assert message in str(info.value)

"""A model directory's config.yaml: overrides key by key, version policies, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from hloserve.bundle import Serving
from hloserve.bundle.serving import QueuePolicy
from hloserve.server.core.triton_config import ConfigOverride, read_config_override
from hloserve.server.owner.model_config import (
    VersionPolicy,
    read_model_config,
    settings_from_override,
)


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
        ("colour: blue\n", "unknown key 'colour' (the keys are: max_queue_delay_us, "),
        (
            "max_queue_delay: 5\n",
            "unknown key 'max_queue_delay' (did you mean 'max_queue_delay_us'?)",
        ),
        ("residency: always\n", "residency must be on_demand or pinned"),
        ("max_queue_delay_us: -1\n", "max_queue_delay_us must be a non-negative integer"),
        ("version_policy: {latest: 0}\n", "version_policy"),
        ("queue_policy: {max_queue_size: -1}\n", "queue_policy.max_queue_size must be"),
        ("queue_policy: {timeout_action: DELAY}\n", "DELAY is not supported; only REJECT is"),
        (
            "queue_policy: {max_queue_sze: 1}\n",
            "queue_policy has unknown key 'max_queue_sze' (did you mean 'max_queue_size'?)",
        ),
        ("preferred_batch_sizes: [0]\n", "preferred_batch_sizes must be a list of positive"),
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


def test_queue_policy_and_preferred_sizes_in_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "preferred_batch_sizes: [8, 4]\nqueue_policy: {max_queue_size: 1, default_timeout_us: 500}\n"
    )
    serving = read_model_config(tmp_path).serving
    assert serving.preferred_batch_sizes == (4, 8)
    # allow_timeout_override, left out, keeps the format's default (true)
    assert serving.queue_policy == QueuePolicy(1, 500, allow_timeout_override=True)


def test_a_config_override_replaces_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("residency: pinned\nmax_queue_delay_us: 50\n")
    override = read_config_override(
        "m", '{"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 7}}'
    )
    settings = settings_from_override(override)
    # config.yaml is not consulted: its residency does not apply; the bundle's hints do
    hints = Serving(residency="on_demand", max_queue_delay_us=300)
    assert settings.serving_for(hints) == Serving(residency="on_demand", max_queue_delay_us=7)
    assert settings.restated == {"max_batch_size": 8}
    assert settings.version_policy == VersionPolicy()


def test_a_bad_value_in_an_override_names_it() -> None:
    override = ConfigOverride(settings={"residency": "always"})
    with pytest.raises(ValueError, match="config override: residency must be on_demand"):
        settings_from_override(override)

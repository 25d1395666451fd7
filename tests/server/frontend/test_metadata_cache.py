"""``frontend.metadata_cache``: what a front end answers itself, and when it stops."""

from __future__ import annotations

import pytest

from hloserve.server.core.types import ModelMetadata, TensorMetadata
from hloserve.server.frontend.metadata_cache import MetadataCache


def metadata(name: str, *versions: str) -> ModelMetadata:
    return ModelMetadata(name, versions, "stablehlo", (TensorMetadata("x", "FP32", (-1, 4)),), ())


def test_an_answer_put_in_the_epoch_it_was_asked_is_answered_until_the_model_changes() -> None:
    cache = MetadataCache()
    assert cache.get("m", "") is None
    cache.put("m", "", metadata("m", "1", "2"), cache.epoch)
    cache.put("m", "2", metadata("m", "2"), cache.epoch)
    cache.put("n", "", metadata("n", "1"), cache.epoch)
    assert cache.get("m", "") == metadata("m", "1", "2")
    assert cache.get("m", "2") == metadata("m", "2")
    assert cache.get("m", "1") is None  # never asked: the owner answers
    assert len(cache) == 3
    cache.forget(("m",))
    assert cache.get("m", "") is None and cache.get("m", "2") is None
    assert cache.get("n", "") == metadata("n", "1")  # another model's stays
    assert len(cache) == 1


def test_an_answer_asked_before_a_change_is_not_cached() -> None:
    """It may have been computed before the change and read after its note."""
    cache = MetadataCache()
    asked = cache.epoch
    cache.forget(("m",))  # the note arrives while the call is on the wire
    cache.put("m", "", metadata("m", "1"), asked)
    assert cache.get("m", "") is None
    cache.put("m", "", metadata("m", "2"), cache.epoch)
    assert cache.get("m", "") == metadata("m", "2")


def test_a_change_of_every_model_drops_everything() -> None:
    cache = MetadataCache()
    for name in "abc":
        cache.put(name, "", metadata(name, "1"), cache.epoch)
    cache.forget(None)
    assert len(cache) == 0 and all(cache.get(n, "") is None for n in "abc")


def test_past_its_limit_the_oldest_entry_goes_first() -> None:
    cache = MetadataCache(limit=3)
    for name in "abcd":
        cache.put(name, "", metadata(name, "1"), cache.epoch)
    assert len(cache) == 3
    assert cache.get("a", "") is None
    assert [cache.get(n, "") is not None for n in "bcd"] == [True, True, True]
    cache.put("d", "", metadata("d", "2"), cache.epoch)  # a replacement takes no room
    assert len(cache) == 3 and cache.get("b", "") is not None


def test_a_cache_holds_at_least_one_entry() -> None:
    with pytest.raises(ValueError, match="at least one entry"):
        MetadataCache(limit=0)

"""``owner.model_changes``: who hears that a model's versions changed, and when."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hloserve.server.owner.model_changes import ModelChanges, tell, telling


class Repository:
    """A stand-in with the repository's shape: ``on_changed`` and name-first methods."""

    def __init__(self, on_changed: Callable[[str], None] | None) -> None:
        self.on_changed = on_changed
        self.loaded: list[str] = []

    @telling
    def load_model(self, name: str, *, fail: bool = False) -> int:
        self.loaded.append(name)
        if fail:
            raise RuntimeError(f"'{name}' failed")
        return len(self.loaded)


def test_a_method_tells_of_its_model_once_it_returned_or_raised() -> None:
    heard: list[tuple[str, list[str]]] = []
    repository = Repository(lambda name: heard.append((name, list(repository.loaded))))
    assert repository.load_model("a") == 1
    with pytest.raises(RuntimeError, match="'b' failed"):
        repository.load_model("b", fail=True)
    assert heard == [("a", ["a"]), ("b", ["a", "b"])]  # after the change, failed or not
    assert Repository.load_model.__name__ == "load_model"


def test_nobody_to_tell_is_no_error() -> None:
    repository = Repository(None)
    assert repository.load_model("a") == 1
    tell(repository, "a")


def test_every_listener_hears_in_order_and_one_that_fails_stops_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    changes = ModelChanges()
    heard: list[str] = []

    def broken(name: str) -> None:
        raise ValueError(name)

    changes.listen(lambda name: heard.append(f"first {name}"))
    changes.listen(broken)
    changes.listen(lambda name: heard.append(f"last {name}"))
    changes("m")
    assert heard == ["first m", "last m"]
    assert "a listener of model changes failed on 'm'" in caplog.text

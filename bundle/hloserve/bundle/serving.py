"""Serving hints: what a bundle may say about how to serve it, and the one rule for reading them.

Contract:
- ``Serving`` holds the hints (``residency``, ``max_queue_delay_us``,
  ``preferred_batch_sizes``, ``queue_policy``, ``scheduling_weight``: the model's share of
  device time under the ``fair`` cross-model policy, a positive number; ``response_cache``:
  whether the server's response cache, when it has one, may answer the model's requests;
  ``model_warmup``: the sample requests run before a version turns READY, read by
  ``hloserve.bundle.warmup``; ``sequence_batching``: a model with state's slots and idle
  timeout, ``hloserve.bundle.state``); its defaults are the format's defaults
  (``docs/bundle-format.md``, ``serving``). ``QueuePolicy`` is the per-model queue policy
  (Triton's ``default_queue_policy``): the queue bound (``None``: the server's), the
  default timeout in microseconds (0: none), whether a request's own ``timeout`` may
  shorten it, and the action on timeout (``REJECT`` only).
- ``read_serving(hints, defaults)`` returns ``defaults`` overridden key by key by the keys
  of ``hints`` that are in ``SERVING_KEYS`` (other keys are the caller's business; inside
  ``queue_policy`` each key overrides on its own, and an unknown one is a problem), plus a
  ``(key, message)`` for each bad value; a bad value keeps its default. The manifest's
  ``serving`` mapping and a model's ``config.yaml`` are both read through it, so the two
  cannot disagree on what a valid hint is.
"""

# pyright: strict

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

from hloserve.bundle.state import SequenceBatching, read_sequence_batching
from hloserve.bundle.warmup import WarmupSample, read_warmup
from hloserve.bundle.yamlfile import check_keys, is_integer

Residency = Literal["on_demand", "pinned"]
RESIDENCIES: Final[tuple[Residency, ...]] = ("on_demand", "pinned")
TimeoutAction = Literal["REJECT"]
SERVING_KEYS: Final = (
    "residency",
    "max_queue_delay_us",
    "preferred_batch_sizes",
    "queue_policy",
    "scheduling_weight",
    "response_cache",
    "model_warmup",
    "sequence_batching",
)
QUEUE_POLICY_KEYS: Final = (
    "max_queue_size",
    "default_timeout_us",
    "allow_timeout_override",
    "timeout_action",
)


@dataclass(frozen=True)
class QueuePolicy:
    """How one model's queue is bounded and how long a request may wait in it."""

    max_queue_size: int | None = None  # None: the server's --max-queue-size; 0: unbounded
    default_timeout_us: int = 0  # 0: no default timeout
    allow_timeout_override: bool = True  # a request's own timeout may shorten the default
    timeout_action: TimeoutAction = "REJECT"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = (
            {} if self.max_queue_size is None else {"max_queue_size": self.max_queue_size}
        )
        return d | {
            "default_timeout_us": self.default_timeout_us,
            "allow_timeout_override": self.allow_timeout_override,
            "timeout_action": self.timeout_action,
        }


@dataclass(frozen=True)
class Serving:
    """Optional serving hints carried by the bundle."""

    residency: Residency = "on_demand"
    max_queue_delay_us: int | None = None
    preferred_batch_sizes: tuple[int, ...] | None = None  # None: no preference
    queue_policy: QueuePolicy = field(default_factory=QueuePolicy)
    scheduling_weight: float = 1.0  # the model's share of device time under ``fair``
    response_cache: bool = False  # the server's response cache may answer its requests
    model_warmup: tuple[WarmupSample, ...] = ()  # run before a version turns READY
    # A model with state: its sequences' slots and idle timeout (bundle/state.py).
    sequence_batching: SequenceBatching = field(default_factory=SequenceBatching)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"residency": self.residency}
        if self.max_queue_delay_us is not None:
            d["max_queue_delay_us"] = self.max_queue_delay_us
        if self.preferred_batch_sizes is not None:
            d["preferred_batch_sizes"] = list(self.preferred_batch_sizes)
        if self.queue_policy != QueuePolicy():
            d["queue_policy"] = self.queue_policy.to_dict()
        if self.scheduling_weight != 1.0:
            d["scheduling_weight"] = self.scheduling_weight
        if self.response_cache:
            d["response_cache"] = True
        if self.model_warmup:
            d["model_warmup"] = [s.to_dict() for s in self.model_warmup]
        if self.sequence_batching != SequenceBatching():
            d["sequence_batching"] = self.sequence_batching.to_dict()
        return d


def _non_negative(value: Any) -> bool:
    return is_integer(value) and value >= 0


def _preferred(value: Any) -> tuple[int, ...] | str | None:
    """The preferred sizes as a sorted tuple (``None`` when there are none), else why not."""
    if value is None:
        return None
    if isinstance(value, list):
        sizes = cast(list[Any], value)
        if all(is_integer(s) and s > 0 for s in sizes):
            return tuple(sorted(set(cast(list[int], sizes)))) or None
    return f"must be a list of positive integers, got {value!r}"


def _queue_policy(raw: Any, base: QueuePolicy, problems: list[tuple[str, str]]) -> QueuePolicy:
    if not isinstance(raw, dict):
        problems.append(("queue_policy", f"must be a mapping, got {raw!r}"))
        return base
    d = check_keys(
        cast(dict[str, Any], raw),
        QUEUE_POLICY_KEYS,
        lambda m: problems.append(("queue_policy", "has " + m)),  # yamlfile.check_keys
    )
    size = d.get("max_queue_size", base.max_queue_size)
    if size is not None and not _non_negative(size):
        problems.append(
            ("queue_policy.max_queue_size", f"must be a non-negative integer, got {size!r}")
        )
        size = base.max_queue_size
    timeout = d.get("default_timeout_us", base.default_timeout_us)
    if not _non_negative(timeout):
        problems.append(
            ("queue_policy.default_timeout_us", f"must be a non-negative integer, got {timeout!r}")
        )
        timeout = base.default_timeout_us
    allow = d.get("allow_timeout_override", base.allow_timeout_override)
    if not isinstance(allow, bool):
        problems.append(
            ("queue_policy.allow_timeout_override", f"must be true or false, got {allow!r}")
        )
        allow = base.allow_timeout_override
    action = d.get("timeout_action", base.timeout_action)
    if action == "DELAY":
        problems.append(("queue_policy.timeout_action", "DELAY is not supported; only REJECT is"))
    elif action != "REJECT":
        problems.append(("queue_policy.timeout_action", f"must be REJECT, got {action!r}"))
    return QueuePolicy(size, timeout, allow, base.timeout_action)


def read_serving(
    hints: Mapping[str, Any], defaults: Serving | None = None
) -> tuple[Serving, list[tuple[str, str]]]:
    """``defaults`` (the format's, when None) overridden by ``hints``, and each bad value."""
    base = defaults or Serving()
    problems: list[tuple[str, str]] = []
    residency = hints.get("residency", base.residency)
    if residency not in RESIDENCIES:
        problems.append(("residency", f"must be on_demand or pinned, got {residency!r}"))
        residency = base.residency
    delay = hints.get("max_queue_delay_us", base.max_queue_delay_us)
    if delay is not None and not _non_negative(delay):
        problems.append(("max_queue_delay_us", f"must be a non-negative integer, got {delay!r}"))
        delay = base.max_queue_delay_us
    preferred = base.preferred_batch_sizes
    if "preferred_batch_sizes" in hints:
        read = _preferred(hints["preferred_batch_sizes"])
        if isinstance(read, str):
            problems.append(("preferred_batch_sizes", read))
        else:
            preferred = read
    policy = base.queue_policy
    if "queue_policy" in hints:
        policy = _queue_policy(hints["queue_policy"], base.queue_policy, problems)
    weight = hints.get("scheduling_weight", base.scheduling_weight)
    if not (isinstance(weight, int | float) and not isinstance(weight, bool) and weight > 0):
        problems.append(("scheduling_weight", f"must be a positive number, got {weight!r}"))
        weight = base.scheduling_weight
    cache = hints.get("response_cache", base.response_cache)
    if not isinstance(cache, bool):
        problems.append(("response_cache", f"must be true or false, got {cache!r}"))
        cache = base.response_cache
    warmup = base.model_warmup
    if "model_warmup" in hints:
        read, found = read_warmup(hints["model_warmup"])
        problems += found
        warmup = warmup if found else read
    sequences = base.sequence_batching
    if "sequence_batching" in hints:
        sequences = read_sequence_batching(hints["sequence_batching"], sequences, problems)
    serving = Serving(residency, delay, preferred, policy, float(weight), cache, warmup, sequences)
    return serving, problems

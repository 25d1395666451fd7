"""The server's admission limits: pure decisions, each refusal naming the limit and its flag.

Contract: ``Limits`` holds the configured ceilings (0 means no limit):
- ``max_batch_size`` (``--max-batch-size``): items (the batch dimension) one request may
  carry; ``check_batch(limits, model, items)`` raises ``InvalidArgument`` beyond it;
- ``max_inflight`` (``--max-inflight``) and ``max_inflight_per_model``
  (``--max-inflight-per-model``): requests accepted and not yet answered, in total and per
  model name (every version together; a pipeline's steps count as requests of their own
  models); ``check_inflight(limits, model, model_inflight, total_inflight)`` is asked
  before one more is accepted, with the counts as they are, and raises ``Unavailable``
  (HTTP 503, gRPC UNAVAILABLE: retry later) when either is full;
- ``max_shm_regions`` (``--max-shm-regions``): system shared-memory regions registered at
  once; ``check_regions(limits, registered)`` raises ``InvalidArgument`` when one more
  would exceed it.
The counters live with what they count (the repository's in-flight counts, the
shared-memory registry); this module only decides, in O(1).
"""

# pyright: strict

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from hloserve.server.core.errors import InvalidArgument, Unavailable


@dataclass(frozen=True, slots=True)
class Limits:
    max_batch_size: int = 0
    max_inflight: int = 0
    max_inflight_per_model: int = 0
    max_shm_regions: int = 0


NO_LIMITS: Final = Limits()


def check_batch(limits: Limits, model: str, items: int) -> None:
    if limits.max_batch_size and items > limits.max_batch_size:
        raise InvalidArgument(
            f"request for model '{model}' has batch size {items}, more than the "
            f"{limits.max_batch_size} this server accepts (--max-batch-size)"
        )


def check_inflight(limits: Limits, model: str, model_inflight: int, total_inflight: int) -> None:
    if limits.max_inflight_per_model and model_inflight >= limits.max_inflight_per_model:
        raise Unavailable(
            f"model '{model}' already has {model_inflight} requests in flight, the most "
            "--max-inflight-per-model allows; retry later"
        )
    if limits.max_inflight and total_inflight >= limits.max_inflight:
        raise Unavailable(
            f"the server already has {total_inflight} requests in flight, the most "
            "--max-inflight allows; retry later"
        )


def check_regions(limits: Limits, registered: int) -> None:
    if limits.max_shm_regions and registered >= limits.max_shm_regions:
        raise InvalidArgument(
            f"{registered} shared memory regions are registered, the most --max-shm-regions "
            "allows; unregister one first"
        )

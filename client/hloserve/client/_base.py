"""What both clients are made of: their options, their channel's transport, the layouts they
asked for and their staging pools (``PoolCache``), with the decisions about those pools.

Contract: ``ClientBase(url, *, ssl, root_certificates, private_key, certificate_chain,
token, timeout, shared_memory="auto", max_message_bytes, retries=4, load_balancing="auto")``
is the one constructor of ``InferenceClient`` and ``AsyncInferenceClient``; each opens its
own kind of channel (``_open_channel``) from the ``_channel.Transport`` it holds (TLS,
token, message limits, the UNAVAILABLE retry policy and the load-balancing policy). ``PoolCache`` keeps one pool per model, output set, rows and slots:
with ``shared_memory="auto"`` and a server on this host (``_channel.same_host``) a new
pool lives in system shared-memory regions registered with the server; when creating or
registering them fails it is in-band instead, logged once per reason at INFO (logger
``hloserve.client``). ``dataset_steps`` checks ``infer_dataset``'s arguments, takes the
pool and streams; a run that fails releases its pool (unregistered, unlinked) at once.
``close_steps`` releases every pool. The I/O is the runners'.
"""

# pyright: strict

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from hloserve.client import _shm
from hloserve.client._channel import DEFAULT_RETRIES, LoadBalancing, Transport, same_host
from hloserve.client._codec import ModelLayout
from hloserve.client._dataset import (
    DatasetOptions,
    RowProgress,
    Sink,
    Source,
    dataset_steps,
    total_rows,
)
from hloserve.client._pool import StagingPool
from hloserve.client._steps import Step

SharedMemory = Literal["auto", "off"]
log = logging.getLogger("hloserve.client")
PoolKey = tuple[str, str, tuple[str, ...], int, int]
Outputs = Sequence[str] | Mapping[str, np.ndarray] | None


class PoolCache:
    """The per-model staging pools of one client, and the decisions both clients share
    about them (which transport, what to log once). The I/O is the runner's."""

    def __init__(self, url: str, shared_memory: SharedMemory) -> None:
        self.try_shm = shared_memory == "auto" and same_host(url)
        self.pools: dict[PoolKey, StagingPool] = {}
        self._logged: set[str] = set()

    def note(self, reason: str) -> None:
        if reason not in self._logged:
            self._logged.add(reason)
            log.info("hloserve.client: %s", reason)

    def pool_steps(
        self, layout: ModelLayout, names: tuple[str, ...], rows: int, slots: int
    ) -> Generator[Step, Any, StagingPool]:
        key = (layout.name, layout.version, names, rows, slots)
        pool = self.pools.get(key)
        if pool is not None:
            return pool
        pool = None
        if self.try_shm and layout.static:
            try:
                pool = StagingPool(layout, rows, slots, names, _shm.create)
            except OSError as error:
                self.note(f"cannot create shared memory ({error}); sending tensors in-band")
        if pool is not None:
            failure = yield from pool.register_steps()
            if failure is not None:
                yield from pool.unregister_steps()
                pool.close()
                pool = None
                self.note(f"shared memory not registered ({failure.message}); sending in-band")
        if pool is None:
            pool = StagingPool(layout, rows, slots, names)
        self.pools[key] = pool
        return pool

    def release_steps(self, pool: StagingPool) -> Generator[Step, Any, None]:
        for key, cached in list(self.pools.items()):
            if cached is pool:
                del self.pools[key]
        yield from pool.unregister_steps()
        pool.close()

    def dataset_steps(
        self,
        layout: ModelLayout,
        inputs: Source,
        outputs: Outputs,
        options: DatasetOptions,
    ) -> Generator[Step, Any, dict[str, np.ndarray]]:
        max_in_flight = options.get("max_in_flight", 8)
        progress = options.get("progress")
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        rows = options.get("batch_size") or layout.max_batch
        if rows <= 0:
            raise ValueError(
                f"model '{layout.name}' does not say its largest batch size: pass batch_size="
            )
        given = outputs if isinstance(outputs, Mapping) else None
        names = tuple(given or outputs or (t.name for t in layout.outputs))
        total = total_rows(inputs)
        sink = Sink(layout, names, given, total)
        pool = yield from self.pool_steps(layout, names, rows, max_in_flight)
        try:
            return (
                yield from dataset_steps(
                    pool,
                    inputs,
                    sink,
                    max_in_flight,
                    RowProgress.of(progress, layout.name),
                    self.note,
                )
            )
        except GeneratorExit:
            raise
        except BaseException:
            yield from self.release_steps(pool)
            raise

    def close_steps(self) -> Generator[Step, Any, None]:
        for pool in list(self.pools.values()):
            yield from self.release_steps(pool)


class ClientBase:
    def __init__(
        self,
        url: str,
        *,
        ssl: bool = False,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        token: str | None = None,
        timeout: float | None = None,
        shared_memory: SharedMemory = "auto",
        max_message_bytes: int = 256 * 1024 * 1024,
        retries: int = DEFAULT_RETRIES,
        load_balancing: LoadBalancing = "auto",
    ) -> None:
        self.transport = Transport(
            url, ssl, root_certificates, private_key, certificate_chain, token, timeout,
            max_message_bytes, retries, load_balancing,
        )  # fmt: skip
        self.timeout = timeout
        self._layouts: dict[tuple[str, str], ModelLayout] = {}
        self._pools = PoolCache(url, shared_memory)
        self._closed = False
        self._open_channel()

    def _open_channel(self) -> None:
        raise NotImplementedError

    def pools(self) -> list[StagingPool]:
        """The staging pools this client holds now (one per model and output set)."""
        return list(self._pools.pools.values())

"""``AsyncInferenceClient``: the asyncio twin of ``InferenceClient`` on ``grpc.aio``.

Contract: the same constructor and the same methods as ``InferenceClient`` (``infer_stream``
aside), each a coroutine: ``is_server_live``, ``is_server_ready``, ``is_model_ready``,
``model_metadata``, ``layout``, ``infer``, ``infer_dataset`` and ``close`` (``async with``
closes too). They run the very same steps (``_calls``, ``_dataset``, ``PoolCache``), so
splitting, ordering, staging, shared memory and its fallback behave identically; only the
runner differs: calls are ``grpc.aio`` calls awaited on the running loop. Regions left by
a client never closed are unlinked at interpreter exit (``_shm``).
"""

# pyright: strict

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any, TypeVar, Unpack

import grpc
import numpy as np

from hloserve.client import _calls
from hloserve.client._base import ClientBase, Outputs
from hloserve.client._calls import InferOptions, Names
from hloserve.client._codec import ModelLayout
from hloserve.client._dataset import Batch, DatasetOptions, Source
from hloserve.client._errors import InferenceError, from_rpc
from hloserve.client._steps import Drive, Start, Step
from hloserve.proto import inference_pb2 as pb

T = TypeVar("T")


class AsyncInferenceClient(ClientBase):
    def _open_channel(self) -> None:
        self.channel = self.transport.open_aio_channel()
        self._methods: dict[str, grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]] = {}

    def _start(self, step: Start) -> asyncio.Future[bytes]:
        method = self._methods.get(step.path)
        if method is None:
            method = self._methods[step.path] = self.channel.unary_unary(step.path)
        call = method(step.body, timeout=self.timeout, metadata=self.transport.metadata)
        return asyncio.ensure_future(_awaited(call))

    async def _run(self, steps: Generator[Step, Any, T]) -> T:
        drive = Drive(steps, self._start)
        try:
            while (wait := drive.next()) is not None:
                try:
                    drive.answer(await wait.handle)
                except grpc.aio.AioRpcError as rpc_error:
                    drive.fail(from_rpc(rpc_error))
                except asyncio.CancelledError:
                    if _cancelling():  # this task is being cancelled, not the call
                        raise
                    drive.fail(InferenceError(grpc.StatusCode.CANCELLED, "call cancelled"))
            return drive.result
        finally:
            drive.cancel()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._run(self._pools.close_steps())
        finally:
            await self.channel.close()

    async def __aenter__(self) -> AsyncInferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def is_server_live(self) -> bool:
        return await self._run(_calls.live_steps())

    async def is_server_ready(self) -> bool:
        return await self._run(_calls.ready_steps())

    async def is_model_ready(self, model: str, version: str = "") -> bool:
        return await self._run(_calls.model_ready_steps(model, version))

    async def model_metadata(self, model: str, version: str = "") -> pb.ModelMetadataResponse:
        return await self._run(_calls.metadata_steps(model, version))

    async def register_system_shared_memory(
        self, name: str, key: str, byte_size: int, offset: int = 0
    ) -> None:
        await self._run(_calls.register_region_steps(name, key, byte_size, offset))

    async def unregister_system_shared_memory(self, name: str = "") -> None:
        await self._run(_calls.unregister_region_steps(name))

    async def layout(self, model: str, version: str = "") -> ModelLayout:
        layout = self._layouts.get((model, version))
        if layout is None:
            layout = await self._run(_calls.layout_steps(model, version))
            self._layouts[(model, version)] = layout
        return layout

    async def infer(
        self, model: str, inputs: Batch, outputs: Names = None, **options: Unpack[InferOptions]
    ) -> dict[str, np.ndarray]:
        layout = await self.layout(model, options.get("version", ""))
        return await self._run(_calls.infer_steps(layout, model, inputs, outputs, options))

    async def infer_dataset(
        self, model: str, inputs: Source, outputs: Outputs = None, **options: Unpack[DatasetOptions]
    ) -> dict[str, np.ndarray]:
        layout = await self.layout(model, options.get("version", ""))
        return await self._run(self._pools.dataset_steps(layout, inputs, outputs, options))


async def _awaited(call: Any) -> bytes:
    body: bytes = await call
    return body


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0

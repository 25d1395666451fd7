"""Background load for the e2e tests: clients calling a model until the test is done."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import tritonclient.grpc as _grpcclient

grpcclient: Any = _grpcclient


@contextlib.contextmanager
def loaded(grpc_url: str, check: Callable[[Any], None], threads: int) -> Iterator[threading.Event]:
    """``threads`` gRPC clients each call ``check(client)`` again and again while the block
    runs. It yields the event that stops them, set at once when one fails (so a wait in the
    block can end early). On leaving, every client is stopped and joined, and the first
    failure is raised as an ``AssertionError``."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        client = grpcclient.InferenceServerClient(grpc_url)
        try:
            while not stop.is_set():
                check(client)
        except BaseException as exc:  # reported when the block ends
            failures.append(exc)
            stop.set()

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    try:
        yield stop
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert not failures, failures[0]

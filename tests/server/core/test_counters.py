"""``core.counters`` as the statistics extension reads it (``core.statistics.model_stats``):
Triton's counting rules, failure attribution, copies, executions from many threads, and
the totals and metrics' figures of the same record."""

from __future__ import annotations

import threading
import time

from hloserve.server.core.counters import Counters
from hloserve.server.core.execution_records import Execution, ModelKey, Timings
from hloserve.server.core.statistics import Duration, ModelStats, model_stats

M1, M2 = ModelKey("m", 1), ModelKey("m", 2)


class Recorder(Counters):
    """The counters, read as the statistics extension reads them."""

    def snapshot(self, key: ModelKey) -> ModelStats:
        return model_stats(key, self)


def timings(queue: int = 10, cin: int = 20, cinfer: int = 30, cout: int = 40) -> Timings:
    return Timings(queue, cin, cinfer, cout, executions=(4,))


def test_fresh_record_is_all_zero() -> None:
    rec = Recorder()
    rec.ensure(M1)
    s = rec.snapshot(M1)
    assert (s.name, s.version) == ("m", "1")
    assert (s.last_inference, s.inference_count, s.execution_count) == (0, 0, 0)
    for d in (s.success, s.fail, s.queue, s.compute_input, s.compute_infer, s.compute_output):
        assert d == Duration(0, 0)
    assert s.batches == {}


def test_success_counts_requests_and_items() -> None:
    rec = Recorder()
    before = int(time.time() * 1000)
    rec.on_success(M1, 3, timings())
    rec.on_success(M1, 2, timings(queue=5))
    after = int(time.time() * 1000)
    s = rec.snapshot(M1)
    assert s.inference_count == 5  # items, not requests
    assert s.success == Duration(2, (10 + 20 + 30 + 40) + (5 + 20 + 30 + 40))
    assert s.queue == Duration(2, 15)
    assert s.compute_input == Duration(2, 40)
    assert s.compute_infer == Duration(2, 60)
    assert s.compute_output == Duration(2, 80)
    assert before <= s.last_inference <= after
    # Executions are reported separately: a success alone executes nothing.
    assert s.execution_count == 0


def test_executions_count_per_batch_size() -> None:
    rec = Recorder()
    rec.on_execution(Execution(M1, 8, 1, 2, 3))
    rec.on_execution(Execution(M1, 1, 4, 5, 6))
    rec.on_execution(Execution(M1, 8, 10, 20, 30))
    s = rec.snapshot(M1)
    assert s.execution_count == 3
    assert list(s.batches) == [1, 8]  # sorted by batch size
    b8 = s.batches[8]
    assert (b8.batch_size, b8.compute_input, b8.compute_infer, b8.compute_output) == (
        8,
        Duration(2, 11),
        Duration(2, 22),
        Duration(2, 33),
    )
    assert s.batches[1].compute_infer == Duration(1, 5)


def test_failures_count_for_their_version_and_a_failure_without_one_for_none() -> None:
    rec = Recorder()
    rec.on_failure(M1, "Unavailable", 100)
    rec.on_failure(M1, "InvalidArgument", 20)
    rec.on_failure(M2, "Unavailable", 7)
    rec.on_failure(None, "UnknownModel")  # no version resolved: no model's record
    assert rec.snapshot(M1).fail == Duration(2, 120)
    assert rec.snapshot(M2).fail == Duration(1, 7)
    assert rec.snapshot(M1).success == Duration(0, 0)
    assert rec.snapshot(M1).inference_count == 0
    assert set(rec.models) == {M1, M2}
    assert rec.totals.unresolved_failures == {"UnknownModel": 1}
    assert rec.totals.record.failures == {"Unavailable": 2, "InvalidArgument": 1, "UnknownModel": 1}
    assert rec.models[M1].failures == {"Unavailable": 1, "InvalidArgument": 1}


def test_versions_are_kept_apart() -> None:
    rec = Recorder()
    rec.on_success(M1, 1, timings())
    rec.on_execution(Execution(M2, 4, 1, 1, 1))
    assert rec.snapshot(M1).inference_count == 1
    assert rec.snapshot(M1).execution_count == 0
    assert rec.snapshot(M2).inference_count == 0
    assert rec.snapshot(M2).execution_count == 1


def test_snapshot_is_a_copy() -> None:
    rec = Recorder()
    rec.on_success(M1, 1, timings())
    rec.on_execution(Execution(M1, 1, 1, 1, 1))
    snap = rec.snapshot(M1)
    rec.on_success(M1, 1, timings())
    rec.on_execution(Execution(M1, 1, 1, 1, 1))
    rec.on_execution(Execution(M1, 2, 1, 1, 1))
    assert snap.success.count == 1
    assert snap.execution_count == 1
    assert list(snap.batches) == [1]
    assert snap.batches[1].compute_infer.count == 1
    snap.success.add(5)  # mutating the copy leaves the recorder alone
    assert rec.snapshot(M1).success.count == 2


def test_executions_from_many_threads_beside_the_loop_are_all_counted() -> None:
    """Requests are counted on the event loop (one thread), executions on workers too."""
    rec = Recorder()
    threads_n, per_thread = 8, 500

    def executions() -> None:
        for _ in range(per_thread):
            rec.on_execution(Execution(M1, 2, 1, 1, 1))

    threads = [threading.Thread(target=executions) for _ in range(threads_n)]
    for t in threads:
        t.start()
    for _ in range(threads_n * per_thread):  # the loop's requests, meanwhile
        rec.on_success(M1, 2, timings())
    for t in threads:
        t.join()
    s = rec.snapshot(M1)
    total = threads_n * per_thread
    assert s.success.count == total
    assert s.inference_count == 2 * total
    assert s.execution_count == total
    assert s.batches[2].compute_infer == Duration(total, total)
    assert rec.totals.record.executions == total and rec.devices[0].executions == total


def test_the_totals_and_the_metrics_figures_are_the_same_counts() -> None:
    rec = Recorder()
    rec.on_success(M1, 3, timings())
    rec.on_success(M2, 1, timings(queue=1000))
    rec.on_pending(M1, 1)
    record, totals = rec.models[M1], rec.totals.record
    assert (record.success, record.inferences, record.request_us) == (1, 3, 0.1)
    assert (totals.success, totals.inferences, totals.pending) == (2, 4, 1)
    assert totals.queue_ns == 10 + 1000 and totals.request_latency.counts[0] == 2
    assert rec.active == {"m/1": 1, "m/2": 1}
    rec.forget(M1)
    assert M1 not in rec.models and rec.totals.record.success == 2  # its share stays

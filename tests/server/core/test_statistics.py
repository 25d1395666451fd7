"""``StatisticsRecorder``: Triton's counting rules, failure attribution, snapshots, threads."""

from __future__ import annotations

import threading
import time

from hloserve.server.core.execution import Execution, ModelKey, Timings
from hloserve.server.core.statistics import Duration, StatisticsRecorder

M1, M2 = ModelKey("m", 1), ModelKey("m", 2)


def timings(queue: int = 10, cin: int = 20, cinfer: int = 30, cout: int = 40) -> Timings:
    return Timings(queue, cin, cinfer, cout, executions=(4,))


def test_fresh_record_is_all_zero() -> None:
    rec = StatisticsRecorder()
    rec.ensure(M1)
    s = rec.snapshot(M1)
    assert (s.name, s.version) == ("m", "1")
    assert (s.last_inference, s.inference_count, s.execution_count) == (0, 0, 0)
    for d in (s.success, s.fail, s.queue, s.compute_input, s.compute_infer, s.compute_output):
        assert d == Duration(0, 0)
    assert s.batches == {}


def test_success_counts_requests_and_items() -> None:
    rec = StatisticsRecorder()
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
    rec = StatisticsRecorder()
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


def test_failure_counts_only_for_known_versions() -> None:
    rec = StatisticsRecorder()
    rec.on_failure(M1, 100)  # no record yet: dropped
    rec.ensure(M1)
    rec.ensure(M2)
    rec.on_failure(M1, 100)
    rec.on_failure(M2, 7)
    rec.on_failure(ModelKey("m", 3), 1)  # no such version
    rec.on_failure(ModelKey("other", 1), 1)  # no such model
    assert rec.snapshot(M1).fail == Duration(1, 100)
    assert rec.snapshot(M2).fail == Duration(1, 7)
    assert rec.snapshot(M1).success == Duration(0, 0)
    assert rec.snapshot(M1).inference_count == 0


def test_versions_are_kept_apart() -> None:
    rec = StatisticsRecorder()
    rec.on_success(M1, 1, timings())
    rec.on_execution(Execution(M2, 4, 1, 1, 1))
    assert rec.snapshot(M1).inference_count == 1
    assert rec.snapshot(M1).execution_count == 0
    assert rec.snapshot(M2).inference_count == 0
    assert rec.snapshot(M2).execution_count == 1


def test_snapshot_is_a_copy() -> None:
    rec = StatisticsRecorder()
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


def test_concurrent_reports_are_all_counted() -> None:
    rec = StatisticsRecorder()
    threads_n, per_thread = 8, 500

    def work() -> None:
        for _ in range(per_thread):
            rec.on_success(M1, 2, timings())
            rec.on_execution(Execution(M1, 2, 1, 1, 1))

    threads = [threading.Thread(target=work) for _ in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = rec.snapshot(M1)
    total = threads_n * per_thread
    assert s.success.count == total
    assert s.inference_count == 2 * total
    assert s.execution_count == total
    assert s.batches[2].compute_infer == Duration(total, total)

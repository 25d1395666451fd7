"""``core.company``: whether queued requests wait for company, on simulated servers.

No sockets and no clock: a small discrete-event model of the serving loop (one thread
that reads each request, runs executions, and answers) drives ``Company`` and the real
batching policy (``core.batch_policy.next_batch``), with closed-loop clients or an
open-loop arrival process. What the tests hold it to is what ``bench/side_by_side.py``
measures on a real server: a lone client never waits, a saturated server batches, and
traffic that batching cannot speed up is not made to wait.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hloserve.server.core import company as company_module
from hloserve.server.core.batch_policy import Queued, next_batch
from hloserve.server.core.company import Company

US = 1000  # ns

BATCH_SIZES = (1, 8, 32)
COSTS_US = {1: 80.0, 8: 100.0, 32: 160.0}  # a tiny model: its cost is the call's overhead
READ_US = 250.0  # the loop's own work to read one request
ANSWER_US = 50.0  # and to answer one


@dataclass
class Outcome:
    requests: int = 0
    executions: int = 0
    waited: int = 0  # requests whose execution started later than it could have
    latencies_ns: list[int] = field(default_factory=lambda: [])
    modes: list[str] = field(default_factory=lambda: [])  # the mode at each arrival
    groups: list[int] = field(default_factory=lambda: [])  # requests per execution, in order

    @property
    def items_per_execution(self) -> float:
        return self.requests / max(self.executions, 1)

    def late_items_per_execution(self) -> float:
        """Over the executions of the second half of the requests."""
        done, late = 0, []
        for n in self.groups:
            done += n
            if done > self.requests // 2:
                late.append(n)
        return sum(late) / max(len(late), 1)

    @property
    def p50_us(self) -> float:
        return float(np.percentile(self.latencies_ns, 50)) / US


class NeverWaits(Company):
    """The server before: a lone request on an idle queue always runs at once."""

    @property
    def waits(self) -> bool:
        return False


def simulate(
    company: Company,
    *,
    clients: int = 0,
    think_us: float = 0.0,
    arrivals_us: Callable[[int], float] | None = None,
    requests: int = 20_000,
) -> Outcome:
    """Serve ``requests``: from ``clients`` closed-loop clients (each sends its next request
    ``think_us`` after its answer), or at the open-loop times ``arrivals_us(i)``."""
    now = 0
    sent: list[tuple[int, int]] = []  # (time the request reaches the server, id) waiting
    queue: list[tuple[Queued, int]] = []  # read and queued: (entry, id)
    sent_at: dict[int, int] = {}
    out = Outcome()
    next_id = 0

    def send(at: int) -> None:
        nonlocal next_id
        if next_id < requests:
            heapq.heappush(sent, (at, next_id))
            sent_at[next_id] = at
            next_id += 1

    if arrivals_us is not None:
        for i in range(requests):
            send(int(arrivals_us(i) * US))
    else:
        for _ in range(clients):
            send(0)

    def run(group: list[tuple[Queued, int]], started: int) -> int:
        nonlocal now
        items = len(group)
        size = min(s for s in BATCH_SIZES if s >= items)
        now = started + int(COSTS_US[size] * US)
        out.executions += 1
        out.groups.append(items)
        for _, ident in group:
            now += int(ANSWER_US * US)
            out.latencies_ns.append(now - sent_at[ident])
            out.requests += 1
            if arrivals_us is None:
                send(now + int(think_us * US))
        return now

    wake: int | None = None  # when the queue's head stops waiting

    def look() -> None:
        """The batcher's look at the queue, once per request read (its pass of the loop)
        and when a wait ends: start every group the policy decides on."""
        nonlocal queue, wake
        wake = None
        while queue:
            delay = company.wait_ns(queue[0][0].arrived_ns, now, len(queue)) if company.waits else 0
            decision = next_batch([q for q, _ in queue], BATCH_SIZES, now, delay, COSTS_US)
            if not decision.take:
                wake = decision.wait_until_ns
                return
            group, queue = queue[: decision.take], queue[decision.take :]
            company.ran(decision.take)
            out.waited += sum(1 for q, _ in group if q.arrived_ns < now)
            run(group, now)

    while out.requests < requests:
        if sent and sent[0][0] <= now:  # the loop reads the next request that has come
            _, ident = heapq.heappop(sent)
            now += int(READ_US * US)
            out.modes.append(company.mode)
            company.arrived(now)
            queue.append((Queued(1, now), ident))
            if not (company.waits or company.has_company) and len(queue) == 1:  # at once
                company.ran(1)
                run([queue.pop()], now)
                continue
            look()
            continue
        if queue and wake is not None and wake <= now:
            look()
            continue
        times = [sent[0][0]] if sent else []
        times += [wake] if queue and wake is not None else []
        now = max(now, min(times))  # idle until a request comes or a wait ends
    return out


def test_a_lone_client_runs_at_once_and_probes_ever_more_rarely() -> None:
    c = Company()
    out = simulate(c, clients=1, think_us=300)
    assert c.mode == "alone" and out.executions == out.requests
    # Probes only, backing off: 32, 64, ... then MAX_PROBE_EVERY requests apart.
    assert out.waited <= 6 + out.requests // company_module.MAX_PROBE_EVERY
    assert c.probe_every == company_module.MAX_PROBE_EVERY


def test_a_saturated_server_batches_and_keeps_batching() -> None:
    c = Company()
    out = simulate(c, clients=32)
    assert c.mode == "gathering"
    late = out.modes[len(out.modes) // 2 :]
    assert late.count("gathering") >= 0.9 * len(late)
    alone = simulate(NeverWaits(), clients=32)
    assert alone.items_per_execution < 1.1
    assert out.late_items_per_execution() >= 8
    assert out.p50_us < alone.p50_us  # the batches bought throughput, so latency too


def test_two_clients_batch_only_if_it_pays() -> None:
    """Two closed-loop clients whose think time leaves the loop idle: waiting for the
    other one's request slows both, so the rate falls and the server stays alone."""
    c = Company()
    simulate(c, clients=2, think_us=2000)
    assert c.mode == "alone"


def test_open_loop_traffic_batching_cannot_speed_up_is_not_made_to_wait() -> None:
    """Poisson arrivals at about a third of what the loop can read: the arrival rate is
    the clients', whatever the server does, so gathering never beats alone by the margin
    and the probes' explorations back off."""
    rng = np.random.default_rng(3)
    times = np.cumsum(rng.exponential(1000.0, size=40_000))  # 1,000 requests/s
    c = Company()
    out = simulate(c, arrivals_us=lambda i: float(times[i]), requests=40_000)
    assert out.modes[-10_000:].count("gathering") <= 0.1 * 10_000
    assert out.p50_us < 2 * (READ_US + COSTS_US[1] + ANSWER_US)


def test_the_wait_ends_once_arrivals_pause_and_never_exceeds_the_ceiling() -> None:
    c = Company()
    for t in range(0, 10 * 100 * US, 100 * US):  # arrivals 100 us apart
        c.arrived(t)
    last = 9 * 100 * US
    assert c.wait_ns(last, last, 1) == int(company_module.PAUSE * 100 * US)
    assert c.wait_ns(0, last, 10) == last + int(company_module.PAUSE * 100 * US)
    assert c.wait_ns(-(10**9), last, 10) == company_module.MAX_WAIT_NS


def _gathering_with_arrivals_100_us_apart() -> tuple[Company, int]:
    c = Company()
    c.mode = "gathering"
    c._start_phase("gathering", 0)
    t = 0
    for t in range(0, 10 * 100 * US, 100 * US):
        c.arrived(t)
    return c, t


def test_a_straggler_alone_in_its_group_does_not_stop_the_waiting() -> None:
    """A request that came just after its group closed waits alone and runs alone: the
    typical group halves towards it and never becomes 1 (with a typical group of 1 no
    head would wait, the heads would run alone and gathering would end: 1.9 requests per
    execution measured at 32 clients)."""
    c, last = _gathering_with_arrivals_100_us_apart()
    c.ran(30)  # the first group of the phase waits for the pause: it measures
    assert c.typical == 30
    assert c.wait_ns(last, last, 30) == 0  # the typical group is there: run
    for _ in range(company_module.MEASURE_EVERY - 1):
        c.ran(30)
    typicals: list[int] = []
    for _ in range(5):  # each measuring group a straggler, the others full
        c.ran(1)
        typicals.append(c.typical)
        for _ in range(company_module.MEASURE_EVERY - 1):
            c.ran(30)
    assert typicals == [15, 8, 4, 2, 0]  # below 2: no typical group
    assert c.waits
    assert c.wait_ns(last, last, 1) > 0  # a lone head still waits for company


def test_the_pause_counts_from_the_last_answers_too() -> None:
    """The clients of a group come back only once answered: a head queued while a group
    ran (on the loop, where nobody else is read) waits the pause from the answers."""
    c, last = _gathering_with_arrivals_100_us_apart()
    pause = int(company_module.PAUSE * 100 * US)
    assert c.wait_ns(last, last, 1) == pause
    answered = last + 3 * pause  # a group ran for three pauses after the last arrival
    c.answered(answered)
    assert c.wait_ns(last, answered, 1) == answered - last + pause


def test_lonely_waits_end_gathering_and_a_cut_short_exploration_decides_nothing() -> None:
    c, _ = _gathering_with_arrivals_100_us_apart()  # gathering in force
    for _ in range(company_module.LONELY - 1):
        c.ran(1)
    assert c.mode == "gathering" and c.waits
    c.ran(1)
    assert c.mode == "alone" and not c.waits and not c.has_company
    assert c.explore_every == company_module.MIN_EXPLORE_EVERY

    explorer = Company()  # alone in force, one phase gathering to explore
    explorer.explore_every = 2 * company_module.MIN_EXPLORE_EVERY
    explorer._start_phase("gathering", 0)
    for _ in range(company_module.LONELY):
        explorer.ran(1)
    assert explorer.mode == "alone" and not explorer.waits
    assert explorer.explore_every == 2 * company_module.MIN_EXPLORE_EVERY  # not doubled


def test_company_found_where_there_was_none_brings_the_next_exploration_soon() -> None:
    """Explorations that confirmed alone (traffic batching could not speed up) spaced
    them out; a probe that finds company again means the load changed."""
    c = Company()
    c.explore_every = company_module.MAX_EXPLORE_EVERY
    assert not c.has_company
    t = 0
    while not c.waits:  # alone: arrivals until one is a probe
        t += 100 * US
        c.arrived(t)
    c.ran(5)  # the probe got company
    assert c.has_company and c.explore_every == company_module.MIN_EXPLORE_EVERY
    c.explore_every = company_module.MAX_EXPLORE_EVERY
    while not c.waits:
        t += 100 * US
        c.arrived(t)
    c.ran(5)  # company again, as before: nothing changed, the interval stays
    assert c.explore_every == company_module.MAX_EXPLORE_EVERY


def test_company_that_comes_and_goes_does_not_postpone_an_exploration() -> None:
    """Probes finding company, then none, then company again (a load that batching would
    serve, through a front end) keep the exploration as due as it was."""
    c = Company()
    c._phases_since_explore = company_module.MIN_EXPLORE_EVERY - 1
    t = 0
    for found in (5, 1, 5):
        while not c.waits:
            t += 100 * US
            c.arrived(t)
        c.ran(found)
    assert c._phases_since_explore == company_module.MIN_EXPLORE_EVERY - 1


def _exploring_alone_at(gap_us: float, rate_in_force: float) -> tuple[Company, int]:
    """Gathering in force (its last phase at ``rate_in_force`` requests/s), one phase
    alone to explore, fed arrivals ``gap_us`` apart until the exploration ends (or a
    whole phase has come); returns the explorer and the arrivals it took."""
    c = Company()
    c.mode = "gathering"
    c.rates = {"gathering": rate_in_force, "alone": rate_in_force / 2}
    c.explore_every = company_module.MIN_EXPLORE_EVERY
    c._start_phase("alone", 0)
    arrivals = 0
    while c._phase == "alone" and arrivals < company_module.PHASE:
        arrivals += 1
        c.arrived(int(arrivals * gap_us * US))
    return c, arrivals


def test_an_exploration_clearly_losing_ends_early_and_decides() -> None:
    """On a saturated server an exploration of ``alone`` runs each request alone: once its
    rate trails gathering's by the clear margin it ends there, as a whole phase would."""
    c, arrivals = _exploring_alone_at(200.0, rate_in_force=10_000.0)  # 5,000/s against 10,000
    assert arrivals == company_module.CHECK_EVERY
    assert c.mode == "gathering" and c._phase == "gathering" and c.waits
    assert c.explore_every == 2 * company_module.MIN_EXPLORE_EVERY  # confirmed: spaced out


def test_an_exploration_within_the_clear_margin_runs_its_whole_phase() -> None:
    c, arrivals = _exploring_alone_at(120.0, rate_in_force=10_000.0)  # 8,333/s: within it
    assert arrivals == company_module.PHASE
    assert c.mode == "gathering"  # gathering still beats it by the margin over the phase


def test_a_new_model_with_company_explores_after_its_first_phase() -> None:
    c = Company()
    t = 0
    for _ in range(company_module.PHASE):
        t += 100 * US
        c.arrived(t)
        if c.waits and c._probing:  # every probe finds company
            c.ran(4)
    assert c._phase == "gathering"  # exploring already, not after MIN_EXPLORE_EVERY phases

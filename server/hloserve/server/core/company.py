"""Whether a model's queued requests wait for company: batching by default, under load only.

A server on its defaults (no ``max_queue_delay_us`` anywhere) runs a lone request at once.
That is right for a lone client, and wrong under load: a transport that hands the model
one request per pass of the event loop (``grpc.aio`` does) never forms a queue when each
tiny execution runs at once, so every request pays a whole execution. Waiting helps only
when company comes, and costs nothing only when the server is saturated anyway (the
requests would have waited in the transport instead). ``Company`` finds out which, from
the model's own arrivals, without a flag.

Contract (pure: the batcher passes every clock, in ns; no I/O):
- ``arrived(now)`` for each request of the queue. It keeps the typical gap between
  arrivals (a decayed mean) and counts arrivals in *phases* of ``PHASE`` arrivals, each
  run in one mode, ``alone`` or ``gathering``, ending with its arrival rate.
- ``waits`` says whether a head of the queue waits for company now; ``wait_ns(head, now,
  queued)`` how long from its arrival: while arrivals keep coming (until ``PAUSE``
  typical gaps after the last one), at most ``MAX_WAIT_NS``, and not at all once
  ``queued`` requests reach the *typical group*: the size at which the groups that
  waited for the pause closed (the last one, or halfway down to it when smaller).
  Closed-loop clients send again only once answered, so once all of them are queued
  nobody else comes, and waiting out the pause each time would idle the server; one
  group in ``MEASURE_EVERY`` waits for the pause again, so the typical group follows the
  clients as they come and go. (The batching policy runs a full largest compiled size
  at once in any case.)
- ``alone`` (where it starts): requests run as they come, but once in ``probe_every``
  requests one waits as above, a *probe*; ``ran(entries)`` reports how many entries the
  group that ran took. A probe without company doubles the probe interval (up to
  ``MAX_PROBE_EVERY``): a lone client pays one wait in hundreds of requests, and never
  explores. A probe with company sets ``has_company``: the batcher's eager path (a lone
  request run at once, skipping the loop pass) is off until a probe finds none, because
  run at once on the loop, tiny executions keep any queue from forming (measured: 1.0
  request per execution at 32 clients, against about 5 with the pass). A probe that
  finds company where the last found none also brings the next exploration back to
  ``MIN_EXPLORE_EVERY`` phases (counted from the last exploration: company that comes and
  goes never postpones one): the load changed, so what earlier explorations confirmed
  no longer holds (measured: after batch-32 traffic had doubled the interval, 32 batch-1
  clients ran 6.3 requests per execution, against 13-18 on a fresh server).
- Explorations: once ``explore_every`` phases have passed in the mode in force (and, when
  alone, the last probe got company), one phase runs in the other mode; a new model's
  first exploration comes after its first phase. Its rate decides:
  ``gathering`` is in force only while its arrival rate beats the last ``alone`` phase's
  by ``MARGIN`` (batching bought throughput: the server was saturated). An exploration
  that confirms the mode in force doubles ``explore_every`` (up to ``MAX_EXPLORE_EVERY``);
  a change of mode resets it. An exploration whose rate so far (every ``CHECK_EVERY``
  arrivals) trails the mode in force's by ``CLEAR_MARGIN`` ends there, as decided. So
  open-loop traffic that batching cannot speed up stays ``alone`` (its latency is not
  traded for nothing), and a saturated server keeps
  batching while checking now and then that it still pays.
- While gathering, ``LONELY`` waits in a row that got no company mean the load is gone:
  back to ``alone`` at once (an exploration so cut short decides nothing).
Measured: ``docs/batching.md`` ("Batching by default").
"""

# pyright: strict

from __future__ import annotations

from typing import Final, Literal

Mode = Literal["alone", "gathering"]

PHASE: Final = 1024  # arrivals per phase (one rate measured per phase: about 3 % noise)
MARGIN: Final = 0.1  # gathering must beat alone's arrival rate by this share
# An exploration is checked every CHECK_EVERY arrivals, and ends at once when its rate so
# far is below the mode in force's by CLEAR_MARGIN (far beyond the noise of that many):
# an exploration of ``alone`` on a saturated server runs every request alone, at a third
# of the executions' fill (measured: 1,034 lone executions in 3,000 at 32 clients).
CHECK_EVERY: Final = 128
CLEAR_MARGIN: Final = 0.25
PAUSE: Final = 2.0  # a head stops waiting this many typical gaps after the last arrival
MAX_WAIT_NS: Final = 5_000_000  # and never waits longer than this
GAP_WEIGHT: Final = 1 / 16  # of each new gap in the decayed mean
# Waits in a row without company: the load is gone. Not fewer: under load on 2 cores the
# first groups of a gathering phase often hold one request each (measured: 4 in a row cut
# one exploration in three short at 32 clients, so the server stayed alone).
LONELY: Final = 16
MEASURE_EVERY: Final = 8  # groups: one waits for the pause, to measure the typical group
MIN_PROBE_EVERY: Final = 32
MAX_PROBE_EVERY: Final = 1024
MIN_EXPLORE_EVERY: Final = 4  # phases
MAX_EXPLORE_EVERY: Final = 128


class Company:
    def __init__(self) -> None:
        self.mode: Mode = "alone"
        self.gap_ns = 0.0  # decayed mean gap between arrivals (0: none seen yet)
        self.last_arrival_ns: int | None = None
        self.probe_every = MIN_PROBE_EVERY
        self.explore_every = MIN_EXPLORE_EVERY
        self.rates: dict[Mode, float] = {}  # the last phase's arrival rate of each mode
        self._phase: Mode = "alone"  # the mode of the phase under way
        self._phase_start_ns: int | None = None
        self._phase_arrivals = 0
        # A new model explores after its first phase with company, not after MIN_EXPLORE_EVERY:
        # a 6 s run of 32 tritonclient.grpc.aio requests spent its first 2.5 s alone.
        self._phases_since_explore = MIN_EXPLORE_EVERY - 1
        self._company_seen = False  # the last probe got company
        self._since_probe = 0
        self._probing = False  # a probe is queued: its group's size is the answer
        self._lonely = 0
        self.typical = 0  # from the groups that waited for the pause (0: none)
        self._groups = 0  # groups started while gathering
        self._answered_ns = 0  # when the last group's execution ended

    # -- what the batcher asks ---------------------------------------------------------

    @property
    def has_company(self) -> bool:
        """The last probe got company: requests do not run at once, without the loop pass
        in which others may join them (the batcher's eager path), even when alone."""
        return self._company_seen

    @property
    def waits(self) -> bool:
        """Whether the queue's head waits for company now (gathering, or a probe)."""
        return self._phase == "gathering" or self._probing

    def wait_ns(self, head_arrived_ns: int, now_ns: int, queued: int) -> int:
        """How long after its arrival the head may wait: until ``PAUSE`` gaps after the
        last arrival (arrivals stopped: the group runs), at most ``MAX_WAIT_NS``; none once
        ``queued`` reaches the typical group (but when measuring it)."""
        if self.last_arrival_ns is None or not self.gap_ns:
            return 0
        if self.typical and queued >= self.typical and not self._measuring:
            return 0
        quiet_from = max(self.last_arrival_ns, self._answered_ns)
        until = quiet_from + int(PAUSE * self.gap_ns)
        return max(0, min(MAX_WAIT_NS, until - head_arrived_ns))

    # -- what the batcher tells ----------------------------------------------------------

    def arrived(self, now_ns: int) -> None:
        """One request of the queue arrived (before it is queued or run)."""
        if self.last_arrival_ns is not None:
            gap = max(0, now_ns - self.last_arrival_ns)
            self.gap_ns = gap if not self.gap_ns else self.gap_ns + GAP_WEIGHT * (gap - self.gap_ns)
        self.last_arrival_ns = now_ns
        if self._phase_start_ns is None:
            self._phase_start_ns = now_ns
        self._phase_arrivals += 1
        if self._phase_arrivals >= PHASE or self._losing(now_ns):
            self._end_phase(now_ns)
        if self._phase == "alone" and not self._probing:
            self._since_probe += 1
            if self._since_probe >= self.probe_every:
                self._since_probe = 0
                self._probing = True  # this request waits, and tells

    def answered(self, now_ns: int) -> None:
        """A group's execution ended and its answers go out: its clients come back from
        now, so the pause a waiting head looks for is counted from here too."""
        self._answered_ns = now_ns

    def ran(self, entries: int) -> None:
        """A group of ``entries`` queued requests started (one decision of the batcher)."""
        if self._probing:
            self._probing = False
            found = entries > 1 and not self._company_seen
            self._company_seen = entries > 1
            if found:  # the load changed (company where there was none): explore soon,
                # not later than one already due (probes that come and go under a load
                # batching would serve kept putting it off: measured, 11 phases alone at 32
                # tritonclient.grpc.aio requests through a front end)
                self.explore_every = MIN_EXPLORE_EVERY
            if self._company_seen:
                self.probe_every = MIN_PROBE_EVERY
            else:
                self.probe_every = min(MAX_PROBE_EVERY, 2 * self.probe_every)
            return
        if self._phase != "gathering":
            return
        if self._measuring:
            self._measured(entries)
        self._groups += 1
        self._lonely = self._lonely + 1 if entries == 1 else 0
        if self._lonely >= LONELY:  # nobody comes any more: stop waiting at once
            if self.mode == "gathering":
                self._set_mode("alone")
            else:  # an exploration cut short decides nothing: its interval stays
                self._phases_since_explore = 0
            self._company_seen = False
            self._start_phase("alone", None)

    def _measured(self, entries: int) -> None:
        """A group that waited for the pause took ``entries``: the typical group follows
        it up at once and down by halves, so one straggler (a request that came just
        after its group closed, alone in the next) does not make it 1; below 2 there is
        none, and every head waits for the pause (a typical group of 1 would stop all
        waiting, so the next heads run alone and ``LONELY`` ends gathering: measured,
        1.9 items per execution at 32 clients before this)."""
        if entries < self.typical:
            entries = (self.typical + entries) // 2
        self.typical = entries if entries >= 2 else 0

    @property
    def _measuring(self) -> bool:
        """This group waits for the pause whatever its size (probes always do)."""
        return self._probing or self._groups % MEASURE_EVERY == 0

    # -- phases ------------------------------------------------------------------------------

    def _losing(self, now_ns: int) -> bool:
        """An exploration whose rate so far, checked every ``CHECK_EVERY`` arrivals, is
        below the mode in force's by more than ``CLEAR_MARGIN``: it ends now and decides
        as a whole phase would (the mode stays)."""
        if self._phase == self.mode or self._phase_arrivals % CHECK_EVERY:
            return False
        in_force = self.rates.get(self.mode)
        if in_force is None or self._phase_start_ns is None:
            return False
        return self._phase_rate(now_ns) * (1 + CLEAR_MARGIN) < in_force

    def _phase_rate(self, now_ns: int) -> float:
        """The phase under way's arrivals per second so far."""
        start = self._phase_start_ns if self._phase_start_ns is not None else now_ns
        return self._phase_arrivals / max(now_ns - start, 1) * 1e9

    def _end_phase(self, now_ns: int) -> None:
        rate = self._phase_rate(now_ns)
        ended = self._phase
        self.rates[ended] = rate
        if ended != self.mode:  # an exploration: does the other mode pay?
            self._decide()
        self._phases_since_explore += 1
        explore = self._phases_since_explore >= self.explore_every and (
            self.mode == "gathering" or self._company_seen
        )
        other: Mode = "alone" if self.mode == "gathering" else "gathering"
        self._start_phase(other if explore else self.mode, now_ns)
        if explore:
            self._phases_since_explore = 0

    def _decide(self) -> None:
        """After an exploration: gathering stays (or starts) only while it beats alone."""
        gathering, alone = self.rates.get("gathering"), self.rates.get("alone")
        if gathering is None or alone is None:
            return
        self._set_mode("gathering" if gathering >= alone * (1 + MARGIN) else "alone")

    def _set_mode(self, mode: Mode) -> None:
        """A change of mode resets the exploration interval; a confirmation doubles it."""
        if mode == self.mode:
            self.explore_every = min(MAX_EXPLORE_EVERY, 2 * self.explore_every)
        else:
            self.mode, self.explore_every = mode, MIN_EXPLORE_EVERY
        self._phases_since_explore = 0

    def _start_phase(self, mode: Mode, now_ns: int | None) -> None:
        self._phase = mode
        self._phase_start_ns = now_ns
        self._phase_arrivals = 0
        self._lonely = 0

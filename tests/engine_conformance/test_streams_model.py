"""Streams against a model: every event exactly once per consumer, in the model's order.

A randomized program interleaves appending transactions held open on several
real connections, their commits and rollbacks, autocommit appends, seeks of
every kind and pumps of random limits, and compares each pump's deliveries
with what a simple model of the log says they must be. The model knows only
which events have committed, which each consumer has read, and the order a
pump delivers in:

* the rest of the transaction the previous pump stopped inside (if it filled
  its limit), then every other committed, unread event in position order;
* a seek to a position or a time reads the committed events before it, never
  an event of a transaction still open at the seek; a seek to the latest
  reads every committed event; a seek to the earliest reads none.

With one writer (SQLite) a transaction holds the write lock until it ends, so
the program ends the open transaction before anything else writes.

``HOPPER_STREAM_MODEL_CASES`` sets how many programs the default run tries;
the slow run tries thousands.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import queue
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, transaction

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import StreamAppendParams, StreamSeekParams
from django_hopper.engine.topics import pattern_matches
from django_hopper.models import Job, StreamConsumer
from django_hopper.models import StreamEvent as StreamEventModel
from django_hopper.types import StreamConsumerRow, StreamEvent, StreamPosition, StreamStart

KIND = "tests.stream_model"
CONSUMERS = {"all": "#", "odd": "*.odd"}
WRITERS = 3
DEFAULT_CASES = int(os.environ.get("HOPPER_STREAM_MODEL_CASES", "200"))
SLOW_CASES = 3000


class Writer:
    """A thread with its own database connection that holds one transaction open
    across calls, so that several transactions are open at once."""

    def __init__(self) -> None:
        self._calls: queue.Queue[Callable[[], Any] | None] = queue.Queue()
        self._results: queue.Queue[tuple[bool, Any]] = queue.Queue()
        self._atomic: transaction.Atomic | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while (fn := self._calls.get()) is not None:
                try:
                    self._results.put((True, fn()))
                except BaseException as exc:
                    self._results.put((False, exc))
        finally:
            connection.close()

    def call(self, fn: Callable[[], Any]) -> Any:
        self._calls.put(fn)
        ok, value = self._results.get(timeout=60)
        if not ok:
            raise value
        return value

    @property
    def open(self) -> bool:
        return self._atomic is not None

    def begin(self) -> None:
        def run() -> None:
            self._atomic = transaction.atomic()
            self._atomic.__enter__()

        self.call(run)

    def end(self, commit: bool) -> None:
        def run() -> None:
            assert self._atomic is not None
            if not commit:
                transaction.set_rollback(True)
            atomic, self._atomic = self._atomic, None
            atomic.__exit__(None, None, None)

        self.call(run)

    def stop(self) -> None:
        if self.open:
            self.end(commit=False)
        self._calls.put(None)
        self._thread.join(30)


@dataclasses.dataclass
class Event:
    n: int
    topic: str
    xid: int
    seq: int
    created_at: dt.datetime

    @property
    def position(self) -> tuple[int, int]:
        return (self.xid, self.seq)


@dataclasses.dataclass
class Consumer:
    """What the model knows of a consumer: the events it has read, and the
    transaction its last pump stopped inside (if that pump filled its limit)."""

    pattern: str
    read: set[int] = dataclasses.field(default_factory=set)
    partial: int | None = None


class Model:
    def __init__(self) -> None:
        self.committed: dict[int, Event] = {}
        self.open: dict[int, list[Event]] = {}  # writer index -> its transaction's events
        self.consumers = {name: Consumer(pattern) for name, pattern in CONSUMERS.items()}

    def pump(self, name: str, limit: int) -> list[int]:
        c = self.consumers[name]
        if limit == 0:
            return []
        unread = [
            e
            for e in self.committed.values()
            if e.n not in c.read and pattern_matches(c.pattern, e.topic)
        ]
        unread.sort(key=lambda e: (e.xid != c.partial, e.xid, e.seq))
        batch = unread[:limit]
        c.read.update(e.n for e in batch)
        c.partial = batch[-1].xid if len(batch) == limit else None
        return [e.n for e in batch]

    def seek_before(self, name: str, position: tuple[int, int]) -> None:
        """Read every committed event before ``position``, in the position's transaction."""
        c = self.consumers[name]
        c.read = {e.n for e in self.committed.values() if e.position < position}
        c.partial = position[0]

    def seek_latest(self, name: str) -> None:
        c = self.consumers[name]
        c.read = set(self.committed)
        c.partial = None

    def seek_earliest(self, name: str) -> None:
        c = self.consumers[name]
        c.read = set()
        c.partial = None


class Program:
    """One random program on one engine, checked against the model as it runs."""

    def __init__(
        self, engine: BaseEngine, writers: list[Writer], rng: random.Random, base: dt.datetime
    ) -> None:
        self.engine: Any = engine
        self.writers = writers
        self.rng = rng
        self.base = base
        self.model = Model()
        self.appended = 0
        self.single_writer = engine.features.single_writer
        self.trace: list[str] = []
        self.deliveries = Deliveries()

    # -- steps ------------------------------------------------------------------------

    def _append(self, run: Callable[[Callable[[], StreamEvent]], StreamEvent]) -> Event:
        n = self.appended
        self.appended += 1
        topic = f"m{n}.{'odd' if self.rng.random() < 0.5 else 'even'}"
        # Times go up with n, and a seek picks one of them.
        created = self.base + dt.timedelta(seconds=n)
        params = StreamAppendParams(topic=topic, payload={"n": n}, now=created)
        got = run(lambda: self.engine.stream_append(params))
        return Event(n, topic, got.position.xid, got.position.seq, created)

    def append_in(self, w: int) -> None:
        event = self._append(self.writers[w].call)
        self.model.open[w].append(event)
        self.trace.append(f"append {event.n} in writer {w} at {event.position}")

    def append_alone(self) -> None:
        event = self._append(lambda fn: fn())
        self.model.committed[event.n] = event
        self.trace.append(f"append {event.n} committed at {event.position}")

    def begin(self, w: int) -> None:
        self.writers[w].begin()
        self.model.open[w] = []
        self.trace.append(f"begin writer {w}")

    def end(self, w: int, commit: bool) -> None:
        self.writers[w].end(commit)
        events = self.model.open.pop(w)
        if commit:
            self.model.committed.update((e.n, e) for e in events)
        self.trace.append(f"{'commit' if commit else 'rollback'} writer {w}")

    def pump(self, name: str, limit: int) -> list[int]:
        result = self.engine.stream_pump(name, limit)
        got = self.deliveries.new(name)
        want = self.model.pump(name, limit)
        self.trace.append(f"pump {name} limit {limit} -> {got}")
        assert got == want, self.failure(f"pump {name}: delivered {got}, the model says {want}")
        assert result.delivered == len(got)
        return got

    def seek(self, name: str) -> None:
        mode = target = self.rng.choice(["earliest", "latest", "position", "time", "time"])
        committed = sorted(self.model.committed.values(), key=lambda e: e.position)
        if mode in ("position", "time") and not committed:
            mode = "latest"
        if mode == "earliest":
            self.engine.stream_consumer_seek(name, StreamSeekParams(earliest=True))
            self.model.seek_earliest(name)
        elif mode == "latest":
            self.engine.stream_consumer_seek(name, StreamSeekParams(latest=True))
            self.model.seek_latest(name)
        elif mode == "position":
            at = self.rng.choice(committed)
            position = StreamPosition(xid=at.xid, seq=at.seq)
            self.engine.stream_consumer_seek(name, StreamSeekParams(position=position))
            self.model.seek_before(name, (at.xid, at.seq + 1))
            target = f"position {at.position}"
        else:
            # Any appended time, an open transaction's included, or one past them all.
            second = self.rng.randint(0, self.appended)
            t = self.base + dt.timedelta(seconds=second)
            target = f"time of {second}"
            self.engine.stream_consumer_seek(name, StreamSeekParams(time=t))
            after = [e for e in committed if e.created_at >= t]
            if after:
                self.model.seek_before(name, after[0].position)
            else:
                self.model.seek_latest(name)
        self.trace.append(f"seek {name} {target}")

    # -- the program ----------------------------------------------------------------

    def end_open_transaction_if_single_writer(self) -> None:
        """With one writer, the open transaction holds the lock: end it first."""
        if self.single_writer:
            for w in list(self.model.open):
                self.end(w, commit=self.rng.random() < 0.8)

    def step(self) -> None:
        rng = self.rng
        idle = [w for w in range(len(self.writers)) if w not in self.model.open]
        busy = list(self.model.open)
        roll = rng.random()
        if roll < 0.15 and idle and not (self.single_writer and busy):
            self.begin(rng.choice(idle))
        elif roll < 0.40 and busy:
            self.append_in(rng.choice(busy))
        elif roll < 0.50:
            self.end_open_transaction_if_single_writer()
            self.append_alone()
        elif roll < 0.62 and busy:
            self.end(rng.choice(busy), commit=rng.random() < 0.75)
        elif roll < 0.92:
            self.end_open_transaction_if_single_writer()
            self.pump(rng.choice(list(CONSUMERS)), rng.choice([0, 1, 1, 1, 2, 2, 3, 5, 100]))
        else:
            self.end_open_transaction_if_single_writer()
            self.seek(rng.choice(list(CONSUMERS)))

    def run(self, steps: int) -> None:
        self.engine.stream_consumer_upsert(
            [
                StreamConsumerRow(name=name, pattern=pattern, kind=KIND, start=StreamStart.EARLIEST)
                for name, pattern in CONSUMERS.items()
            ]
        )
        for _ in range(steps):
            self.step()
        for w in list(self.model.open):
            self.end(w, commit=self.rng.random() < 0.8)
        # Drain: whatever was committed and not read comes out, and nothing else.
        for name, c in self.model.consumers.items():
            while self.pump(name, self.rng.choice([1, 2, 3, 100])):
                pass
            unread = {
                n
                for n, e in self.model.committed.items()
                if pattern_matches(c.pattern, e.topic) and n not in c.read
            }
            assert not unread, self.failure(f"{name} never delivered {sorted(unread)}")

    def failure(self, message: str) -> str:
        return message + "\n" + "\n".join(self.trace)


class Deliveries:
    """Reads the deliveries the pumps insert, each once, in insert order (job IDs
    are time-ordered)."""

    def __init__(self) -> None:
        self.last: Any = None

    def new(self, name: str) -> list[int]:
        """Return the event numbers of the consumer's deliveries made since the last call."""
        jobs = Job.objects.filter(kind=KIND).order_by("id")
        if self.last is not None:
            jobs = jobs.filter(id__gt=self.last)
        rows = list(jobs.values_list("id", "args", "metadata"))
        if rows:
            self.last = rows[-1][0]
        assert all(m["consumer"] == name for _, _, m in rows), rows
        return [args["args"][0]["payload"]["n"] for _, args, _ in rows]


@pytest.fixture
def writers(tx_engine: BaseEngine) -> Iterator[list[Writer]]:
    made = [Writer() for _ in range(WRITERS)]
    try:
        yield made
    finally:
        for w in made:
            w.stop()


def run_programs(engine: BaseEngine, writers: list[Writer], cases: int, seed: int) -> None:
    base = engine.now().replace(microsecond=0)
    for case in range(cases):
        rng = random.Random(seed * 1_000_003 + case)
        Job.objects.filter(kind=KIND).delete()
        StreamConsumer.objects.all().delete()
        StreamEventModel.objects.all().delete()
        Program(engine, writers, rng, base).run(steps=rng.randint(5, 30))


def test_streams__every_event_once_per_consumer_in_the_models_order(
    tx_engine: BaseEngine, writers: list[Writer]
) -> None:
    run_programs(tx_engine, writers, DEFAULT_CASES, seed=1)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_streams__every_event_once_per_consumer_in_the_models_order_thousands_of_cases(
    tx_engine: BaseEngine, writers: list[Writer]
) -> None:
    run_programs(tx_engine, writers, SLOW_CASES, seed=2)

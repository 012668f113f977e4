"""Pub/sub: subscriptions, topic patterns and publishing deliveries (both engines)."""

from __future__ import annotations

import datetime as dt
import random
import re
from functools import cache

import pytest

from django_hopper.engine.base import BaseEngine
from django_hopper.engine.params import (
    JobListParams,
    MessagePublishParams,
    StreamAppendParams,
    StreamReadParams,
)
from django_hopper.engine.topics import (
    MAX_PATTERN_WORDS,
    check_name,
    check_pattern,
    check_topic,
    pattern_matches,
    pattern_regex,
)
from django_hopper.exceptions import InvalidJob
from django_hopper.types import SubscriptionRow
from tests.engine_conformance.support import HOUR, MINUTE

KIND = "tests.subscriber"


def pubsub(engine: BaseEngine) -> BaseEngine:
    return engine


def subscribe(engine: BaseEngine, now: dt.datetime, *rows: tuple[str, str], **fields: object):
    pubsub(engine).subscription_upsert(
        [SubscriptionRow(name=n, pattern=p, kind=KIND, **fields) for n, p in rows],  # type: ignore[arg-type]
        now=now,
    )


def publish(engine: BaseEngine, now: dt.datetime, topic: str, **fields: object):
    return pubsub(engine).message_publish(
        MessagePublishParams(topic=topic, now=now, **fields)  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("pattern", "topic", "matches"),
    [
        ("orders.created", "orders.created", True),
        ("orders.created", "orders.created.eu", False),
        ("orders.*", "orders.created", True),
        ("orders.*", "orders", False),
        ("orders.*", "orders.created.eu", False),
        ("orders.#", "orders", True),
        ("orders.#", "orders.created.eu", True),
        ("orders.#", "ordersx", False),
        ("#", "anything.at.all", True),
        ("#.eu", "eu", True),
        ("#.eu", "orders.created.eu", True),
        ("#.eu", "orders.created.us", False),
        ("orders.#.eu", "orders.eu", True),
        ("orders.#.eu", "orders.a.b.eu", True),
        ("*.*.#", "orders", False),
        ("*.created", "orders.created", True),
        ("#.#", "a.b", True),
    ],
)
def test_pattern__follows_amqp_topic_rules(pattern: str, topic: str, matches: bool) -> None:
    assert pattern_matches(pattern, topic) is matches


def amqp_matches(pattern: str, topic: str) -> bool:
    """The AMQP rule itself, word by word: the reference the matchers are held to."""
    p, t = (pattern or "#").split("."), topic.split(".")

    @cache
    def match(i: int, j: int) -> bool:
        if i == len(p):
            return j == len(t)
        if p[i] == "#":
            return match(i + 1, j) or (j < len(t) and match(i, j + 1))
        return j < len(t) and p[i] in ("*", t[j]) and match(i + 1, j + 1)

    return match(0, 0)


def random_case(rng: random.Random) -> tuple[str, str]:
    """Return a short random pattern and topic over a tiny alphabet, so that they often match."""
    words = ["a", "b", "c:d"]
    pattern = ".".join(rng.choice([*words, "*", "#", "#"]) for _ in range(rng.randint(1, 7)))
    topic = ".".join(rng.choice(words) for _ in range(rng.randint(1, 8)))
    return pattern, topic


def test_pattern_matches__agrees_with_the_amqp_rule_and_the_regex_on_random_cases() -> None:
    rng = random.Random(20261201)
    for _ in range(5000):
        pattern, topic = random_case(rng)
        expected = amqp_matches(pattern, topic)
        assert pattern_matches(pattern, topic) is expected, (pattern, topic)
        # The regex PostgreSQL reads (Python's re reads it alike on such short input).
        assert (re.match(pattern_regex(pattern), topic) is not None) is expected, (pattern, topic)


def test_pattern__the_engines_sql_matcher_agrees_with_pattern_matches(engine: BaseEngine) -> None:
    rng = random.Random(7)
    cases = [random_case(rng) for _ in range(60)]
    topics = sorted({t for _, t in cases})
    for topic in topics:
        engine.stream_append(StreamAppendParams(topic=topic))

    for pattern, _ in cases:
        read = engine.stream_read(StreamReadParams(pattern=pattern, limit=1000))
        assert sorted(e.topic for e in read) == [t for t in topics if amqp_matches(pattern, t)]


#: Wildcard runs such as ``#.*.#.*`` that make a backtracking regex try every way
#: to split a long topic between them (minutes in Python's re at 8 repeats).
ADVERSARIAL_PATTERN = ".".join(["#.*"] * 10) + ".z"
LONG_TOPIC = ".".join(["w"] * 60)


@pytest.mark.timeout(60)
def test_pattern_matches__adversarial_wildcard_runs_match_in_linear_time() -> None:
    assert not pattern_matches(ADVERSARIAL_PATTERN, LONG_TOPIC)
    assert pattern_matches(ADVERSARIAL_PATTERN, LONG_TOPIC + ".z")
    assert not pattern_matches("#.w." * 8 + "z", LONG_TOPIC)


@pytest.mark.timeout(60)
def test_message_publish__an_adversarial_pattern_does_not_stall_the_publish(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    subscribe(engine, db_now, ("slow", ADVERSARIAL_PATTERN), ("all", "#"))

    results = publish(engine, db_now, LONG_TOPIC)
    matched = publish(engine, db_now, LONG_TOPIC + ".z")

    assert [r.job.metadata["subscription"] for r in results] == ["all"]
    assert [r.job.metadata["subscription"] for r in matched] == ["all", "slow"]


@pytest.mark.timeout(60)
def test_stream_read__an_adversarial_pattern_does_not_stall_the_read(engine: BaseEngine) -> None:
    for topic in (LONG_TOPIC, LONG_TOPIC + ".z"):
        engine.stream_append(StreamAppendParams(topic=topic))

    read = engine.stream_read(StreamReadParams(pattern=ADVERSARIAL_PATTERN, limit=10))

    assert [e.topic for e in read] == [LONG_TOPIC + ".z"]


@pytest.mark.parametrize(
    "topic", ["", "a..b", ".a", "a.", "a.*", "a.#", "a b", 7, "pay.done\n", "x" * 256]
)
def test_topic__malformed_ones_are_refused_naming_the_field(topic: object) -> None:
    with pytest.raises(InvalidJob) as exc:
        check_topic(topic)
    assert exc.value.field == "topic"


@pytest.mark.parametrize(
    "pattern",
    ["", "a..b", "a.*x", "a.#b", "a b", None, "a.#\n", ".".join(["*"] * (MAX_PATTERN_WORDS + 1))],
)
def test_pattern__malformed_ones_are_refused_naming_the_field(pattern: object) -> None:
    with pytest.raises(InvalidJob) as exc:
        check_pattern(pattern)
    assert exc.value.field == "pattern"


def test_pattern__the_word_bound_is_named_in_the_error() -> None:
    check_pattern(".".join(["#"] * MAX_PATTERN_WORDS))
    with pytest.raises(InvalidJob, match=f"at most {MAX_PATTERN_WORDS}"):
        check_pattern(".".join(["a"] * (MAX_PATTERN_WORDS + 1)))


def test_name__a_trailing_newline_is_refused() -> None:
    with pytest.raises(InvalidJob) as exc:
        check_name("audit\n")
    assert exc.value.field == "name"


def test_subscription_upsert__records_and_updates_by_name(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    subscribe(engine, db_now, ("b", "orders.*"), ("a", "users.#"), queue="subs")
    later = db_now + MINUTE
    pubsub(engine).subscription_upsert(
        [
            SubscriptionRow(
                name="b",
                pattern="orders.#",
                kind="tests.other",
                queue="q2",
                max_attempts=3,
                metadata={"team": "x"},
            )
        ],
        now=later,
    )

    rows = pubsub(engine).subscription_list()

    assert [r.name for r in rows] == ["a", "b"]
    a, b = rows
    assert (a.pattern, a.kind, a.queue, a.max_attempts) == ("users.#", KIND, "subs", 0)
    assert (b.pattern, b.kind, b.queue, b.max_attempts) == ("orders.#", "tests.other", "q2", 3)
    assert b.metadata == {"team": "x"}
    assert b.created_at == db_now
    assert b.updated_at == later


@pytest.mark.parametrize("bad", ["a..b", ".".join(["#.*"] * 20)])
def test_subscription_upsert__refuses_a_malformed_pattern_and_writes_nothing(
    engine: BaseEngine, db_now: dt.datetime, bad: str
) -> None:
    with pytest.raises(InvalidJob) as exc:
        subscribe(engine, db_now, ("good", "a.*"), ("bad", bad))
    assert exc.value.field == "pattern"
    assert pubsub(engine).subscription_list() == []


def test_message_publish__inserts_one_delivery_per_matching_subscription(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    subscribe(engine, db_now, ("billing", "orders.*"), ("audit", "#"), ("users", "users.*"))
    pubsub(engine).subscription_upsert(
        [
            SubscriptionRow(
                name="billing",
                pattern="orders.*",
                kind=KIND,
                queue="billing",
                metadata={"team": "money", "topic": "overridden"},
            )
        ],
        now=db_now,
    )

    results = publish(engine, db_now, "orders.created", payload={"id": 7}, headers={"trace": "t-1"})

    assert [r.duplicate for r in results] == [False, False]
    audit, billing = (r.job for r in results)
    assert (audit.queue, billing.queue) == ("default", "billing")
    assert billing.kind == KIND
    message = billing.args["args"][0]
    assert billing.args == {"args": [message], "kwargs": {}}
    assert message["topic"] == "orders.created"
    assert message["payload"] == {"id": 7}
    assert message["headers"] == {"trace": "t-1"}
    assert message["message_id"] == audit.args["args"][0]["message_id"]
    assert billing.metadata == {
        "team": "money",
        "topic": "orders.created",
        "message_id": message["message_id"],
        "headers": {"trace": "t-1"},
        "subscription": "billing",
    }
    assert billing.max_attempts == 25


def test_message_publish__with_no_matching_subscription_inserts_nothing(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    subscribe(engine, db_now, ("users", "users.*"))

    assert publish(engine, db_now, "orders.created") == []
    assert engine.job_list(JobListParams(kinds=(KIND,))) == []


def test_message_publish__dedup_key_reports_a_live_duplicate_per_subscription(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    subscribe(engine, db_now, ("one", "orders.*"), ("two", "orders.*"))

    first = publish(engine, db_now, "orders.paid", dedup_key="order-7")
    again = publish(engine, db_now, "orders.paid", dedup_key="order-7")

    assert [r.duplicate for r in first] == [False, False]
    assert [r.duplicate for r in again] == [True, True]
    assert [r.job.id for r in again] == [r.job.id for r in first]
    assert [r.job.unique_key for r in first] == ["one:order-7", "two:order-7"]


def test_message_publish__applies_delay_ttl_priority_await_and_ordering_key(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    subscribe(engine, db_now, ("keyed", "orders.*"), queue="lane")

    (result,) = publish(
        engine,
        db_now,
        "orders.paid",
        delay=MINUTE,
        ttl=HOUR,
        priority=5,
        awaited=True,
        ordering_key="order-7",
    )

    job = result.job
    assert job.state == "scheduled"
    assert job.scheduled_at == db_now + MINUTE
    assert job.expires_at == db_now + HOUR
    assert job.priority == 5
    assert job.awaited is True
    assert job.ordering_key == "order-7"
    assert job.max_attempts == 10  # the default of keyed deliveries


def test_message_publish__a_subscription_max_attempts_wins_over_the_default(
    engine: BaseEngine, db_now: dt.datetime
) -> None:
    subscribe(engine, db_now, ("s", "orders.*"), max_attempts=3)

    (result,) = publish(engine, db_now, "orders.paid", ordering_key="k")

    assert result.job.max_attempts == 3


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"topic": ""}, "topic"),
        ({"topic": "orders.*"}, "topic"),
        ({"payload": {1: object()}}, "payload"),
        ({"headers": {"a": 1}}, "headers"),
        ({"priority": 500}, "priority"),
        ({"dedup_key": ""}, "dedup_key"),
        ({"delay": dt.timedelta(seconds=-1)}, "delay"),
    ],
)
def test_message_publish__refuses_bad_input_naming_the_field(
    engine: BaseEngine, db_now: dt.datetime, fields: dict[str, object], field: str
) -> None:
    subscribe(engine, db_now, ("s", "#"))
    params = {"topic": "orders.paid", **fields}

    with pytest.raises(InvalidJob) as exc:
        publish(engine, db_now, **params)  # type: ignore[arg-type]

    assert exc.value.field == field

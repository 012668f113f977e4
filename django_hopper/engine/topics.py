"""Topics, patterns and deliveries: the pub/sub and stream rules written once.

Both engines (and the API above them) call these, so that the engines cannot
disagree about what a topic is, which topics a pattern matches, or what a
delivery job carries:

* A **topic** is words separated by ``.``; a word is letters, digits, ``_``,
  ``-`` and ``:``. A **pattern** is the same with two wildcard words, as in
  AMQP topic exchanges: ``*`` matches exactly one word, ``#`` zero or more.
* A pattern is matched word by word (:func:`pattern_matches`), in time
  linear in the topic's length, never by a backtracking regex; it has at
  most :data:`MAX_PATTERN_WORDS` words. Publishing matches the (few)
  subscriptions in Python; streams match in SQL, next to the position
  filter: SQLite calls the same Python function (registered as
  ``hopper_topic_matches``), PostgreSQL reads the pattern as a regex
  (:func:`pattern_regex`) that its automaton-based ``~`` matches in linear
  time. A test holds the two to the same answers.
* A **delivery** is a job of the subscriber's kind, called as
  ``fn(message)``: ``args = {"args": [message], "kwargs": {}}``, where
  ``message`` is a :class:`Message`. Its metadata is the subscription's (or
  consumer's) metadata merged with ``topic``, ``message_id``, ``headers`` and
  the subscription's or consumer's name.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any, TypedDict, TypeVar

from django_hopper import validation
from django_hopper.engine.params import (
    JobInsertParams,
    MessagePublishParams,
    StreamAppendParams,
    StreamReadParams,
    StreamSeekParams,
)
from django_hopper.exceptions import InvalidJob
from django_hopper.types import (
    HELD_AT,
    JSON,
    StreamConsumerRow,
    StreamEvent,
    StreamPosition,
    StreamStart,
    SubscriptionRow,
)

#: The job kind of a delivery whose event does not decode: it fails with the
#: reason, once, in the consumer's queue (:func:`django_hopper.streams.undecodable_event`).
UNDECODABLE_EVENT_KIND = "django_hopper.streams.undecodable_event"

#: Retry budgets of deliveries whose subscription or consumer says 0: keyed
#: deliveries hold up their lane while they retry, so they give up sooner.
DEFAULT_MAX_ATTEMPTS = 25
DEFAULT_MAX_ATTEMPTS_KEYED = 10

_WORD = r"[A-Za-z0-9_:\-]+"
#: Whole-string rules (``fullmatch``: a trailing newline is not a word).
TOPIC_RE = re.compile(rf"{_WORD}(\.{_WORD})*")
PATTERN_RE = re.compile(rf"({_WORD}|\*|#)(\.({_WORD}|\*|#))*")
NAME_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,255}")
MAX_LENGTH = 255
#: Words of a pattern: enough for any real routing rule, and a bound on what
#: one match may cost (topic words x pattern words).
MAX_PATTERN_WORDS = 32


class Message(TypedDict, total=False):
    """What a subscriber function receives as its one argument."""

    topic: str
    payload: JSON
    headers: dict[str, str]
    #: Shared by every delivery of one publish (or of one stream event).
    message_id: str
    #: Stream deliveries only: the event's key and position.
    key: str | None
    position: dict[str, int]


# ---------------------------------------------------------------------------
# Validation


def check_topic(value: Any, field: str = "topic") -> str:
    """Return a valid topic or raise InvalidJob naming ``field``."""
    if not isinstance(value, str) or not value:
        raise InvalidJob(f"{field} must be a non-empty string, not {value!r}", field=field)
    if len(value) > MAX_LENGTH or not TOPIC_RE.fullmatch(value):
        raise InvalidJob(
            f"{field} {value!r} is malformed: words of letters, digits, '_', '-' and ':' "
            f"separated by '.' (at most {MAX_LENGTH} characters, no wildcards)",
            field=field,
        )
    return value


def check_pattern(value: Any, field: str = "pattern", *, allow_empty: bool = False) -> str:
    """Return a valid topic pattern or raise InvalidJob naming ``field``."""
    if allow_empty and value == "":
        return value
    if not isinstance(value, str) or not value:
        raise InvalidJob(f"{field} must be a non-empty string, not {value!r}", field=field)
    if len(value) > MAX_LENGTH or not PATTERN_RE.fullmatch(value):
        raise InvalidJob(
            f"{field} {value!r} is malformed: words separated by '.', each a literal word "
            f"(letters, digits, '_', '-', ':'), '*' (one word) or '#' (zero or more words), "
            f"at most {MAX_LENGTH} characters",
            field=field,
        )
    words = value.count(".") + 1
    if words > MAX_PATTERN_WORDS:
        raise InvalidJob(
            f"{field} has {words} words; a pattern has at most {MAX_PATTERN_WORDS}",
            field=field,
        )
    return value


def check_name(value: Any, field: str = "name") -> str:
    """Return a valid subscription or consumer name or raise InvalidJob."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise InvalidJob(
            f"{field} must be 1..255 letters, digits, '_', '.', ':' or '-', not {value!r}",
            field=field,
        )
    return value


def check_limit(value: Any, field: str = "limit") -> int:
    """Return a non-negative integer limit or raise InvalidJob."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidJob(f"{field} must be a non-negative integer, not {value!r}", field=field)
    return value


def check_headers(value: Any, field: str = "headers") -> dict[str, str]:
    """Return headers as a dict of strings or raise InvalidJob."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidJob(f"{field} must map strings to strings, not {value!r}", field=field)
    return dict(value)


def check_max_attempts(value: Any, field: str = "max_attempts") -> int:
    """Return a retry budget (0 for the default) or raise InvalidJob."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidJob(
            f"{field} must be a non-negative integer (0 for the default), not {value!r}",
            field=field,
        )
    return value


def check_metadata(value: Any, field: str = "metadata") -> dict[str, Any]:
    """Return a JSON object of metadata or raise InvalidJob."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidJob(f"{field} must be a dict, not {value!r}", field=field)
    return dict(validation.json_normalize(value, field))


_Route = TypeVar("_Route", SubscriptionRow, StreamConsumerRow)


def _check_route(row: _Route) -> _Route:
    """Return a subscription or consumer row with the fields they share checked."""
    return dataclasses.replace(
        row,
        name=check_name(row.name),
        pattern=check_pattern(row.pattern),
        kind=_check_kind(row.kind),
        queue=validation.queue_name(row.queue),
        max_attempts=check_max_attempts(row.max_attempts),
        metadata=check_metadata(row.metadata),
    )


def check_subscription(row: SubscriptionRow) -> SubscriptionRow:
    """Return the row with every field checked (and metadata normalized)."""
    return _check_route(row)


def check_consumer(row: StreamConsumerRow) -> StreamConsumerRow:
    """Return the row with every field checked (and metadata normalized)."""
    if row.start not in StreamStart.values():
        raise InvalidJob(
            f"start must be one of {', '.join(StreamStart.values())}, not {row.start!r}",
            field="start",
        )
    return _check_route(row)


def _check_kind(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_LENGTH:
        raise InvalidJob(f"kind must be a non-empty string, not {value!r}", field="kind")
    return value


def check_seek(params: StreamSeekParams) -> str:
    """Return which of the four seeks ``params`` asks for, refusing none or several."""
    chosen = [
        name
        for name, given in (
            ("position", params.position is not None),
            ("time", params.time is not None),
            ("earliest", params.earliest),
            ("latest", params.latest),
        )
        if given
    ]
    if len(chosen) != 1:
        raise InvalidJob(
            "a seek takes exactly one of position, time, earliest and latest, "
            f"not {chosen or 'none'}",
            field="position",
        )
    if params.position is not None:
        check_position(params.position, "position")
    if params.time is not None:
        validation.aware(params.time, "time")
    return chosen[0]


def check_position(value: Any, field: str = "after") -> StreamPosition:
    """Return a StreamPosition with non-negative parts or raise InvalidJob."""
    if not isinstance(value, StreamPosition) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (value.xid, value.seq)
    ):
        raise InvalidJob(
            f"{field} must be a StreamPosition of non-negative integers, not {value!r}",
            field=field,
        )
    return value


def check_append(params: StreamAppendParams) -> StreamAppendParams:
    """Return the append's params checked, payload normalized to what reads back."""
    return dataclasses.replace(
        params,
        topic=check_topic(params.topic),
        key=validation.key(params.key, "key"),
        payload=validation.json_normalize(params.payload, "payload"),
        headers=check_headers(params.headers),
    )


def check_read(params: StreamReadParams) -> StreamReadParams:
    """Return the read's params checked."""
    check_pattern(params.pattern, allow_empty=True)
    check_position(params.after, "after")
    check_limit(params.limit)
    return params


# ---------------------------------------------------------------------------
# Matching
#
# A pattern is matched word by word, never by a backtracking regex: the set of
# pattern positions a topic's prefix can have reached is carried along the
# topic, so a match costs at most (topic words x pattern words) steps whatever
# the pattern. PostgreSQL reads the same pattern as a regex
# (:func:`pattern_regex`), which its automaton-based engine matches in linear
# time; SQLite calls :func:`pattern_matches` itself (``hopper_topic_matches``).


@lru_cache(maxsize=1024)
def pattern_words(pattern: str) -> tuple[str, ...]:
    """Return a (valid) pattern's words in their canonical form.

    Within a run of wildcards only the count of ``*`` and whether there is a
    ``#`` matter (``#.*`` and ``*.#`` both mean "one word or more"), so a run
    is rewritten as its ``*`` words followed by at most one ``#``. The empty
    pattern is ``#``.
    """
    words: list[str] = []
    stars, hash_ = 0, False

    def flush() -> None:
        words.extend(["*"] * stars)
        if hash_:
            words.append("#")

    for w in (pattern or "#").split("."):
        if w == "*":
            stars += 1
        elif w == "#":
            hash_ = True
        else:
            flush()
            stars, hash_ = 0, False
            words.append(w)
    flush()
    return tuple(words)


def pattern_matches(pattern: str, topic: str) -> bool:
    """Return whether a topic matches a pattern, in time linear in the topic's words."""
    words = pattern_words(pattern)
    m = len(words)

    def closure(states: set[int]) -> set[int]:
        # A "#" may match zero words: whoever stands before it also stands after it.
        out = set(states)
        for i in sorted(states):
            j = i
            while j < m and words[j] == "#":
                j += 1
                out.add(j)
        return out

    states = closure({0})
    for word in topic.split("."):
        step: set[int] = set()
        for i in states:
            if i == m:
                continue
            w = words[i]
            if w == "#":
                step.add(i)  # "#" eats this word; the closure lets it stop here too
            elif w == "*" or w == word:
                step.add(i + 1)
        if not step:
            return False
        states = closure(step)
    return m in states


def _escape(word: str) -> str:
    """Escape every non-alphanumeric character: a literal in both regex dialects."""
    return "".join(c if c.isascii() and c.isalnum() else "\\" + c for c in word)


@lru_cache(maxsize=1024)
def pattern_regex(pattern: str) -> str:
    """Compile a (valid) pattern to the anchored regex PostgreSQL's ``~`` reads;
    the empty pattern matches every topic.

    Built on :func:`pattern_words`, so a run of wildcards is ``*`` words and at
    most one ``#``. A leading ``#`` eats whole words with their trailing dots,
    any other ``#`` whole words with their leading dots, so ``a.#`` matches
    ``a`` and ``#.b`` matches ``b``. Only for an automaton-based engine: a
    backtracking one (Python's ``re``) can take exponential time on it, which
    is why Python matches with :func:`pattern_matches`.
    """
    words = pattern_words(pattern)
    if words == ("#",):
        return "^.*$"
    out = ""
    for i, w in enumerate(words):
        if w == "#":
            out += r"(?:[^.]+\.)*" if i == 0 else r"(?:\.[^.]+)*"
            continue
        if i > 0 and not (i == 1 and words[0] == "#"):
            out += r"\."
        out += "[^.]+" if w == "*" else _escape(w)
    return f"^{out}$"


# ---------------------------------------------------------------------------
# Deliveries


def delivery_max_attempts(configured: int, keyed: bool) -> int:
    """Return a delivery's retry budget: the configured one, else the default."""
    if configured:
        return configured
    return DEFAULT_MAX_ATTEMPTS_KEYED if keyed else DEFAULT_MAX_ATTEMPTS


def _delivery(
    route: SubscriptionRow | StreamConsumerRow,
    role: str,
    message: Message,
    ordering_key: str | None,
    **extra: Any,
) -> JobInsertParams:
    """Return the job delivering ``message`` to a subscription or consumer.

    ``role`` ("subscription" or "consumer") is the metadata key naming it;
    ``extra`` are the job's further insert params (a publish's priority ...).
    """
    return JobInsertParams(
        kind=route.kind,
        queue=route.queue,
        max_attempts=delivery_max_attempts(route.max_attempts, bool(ordering_key)),
        args={"args": [dict(message)], "kwargs": {}},
        metadata={
            **(route.metadata or {}),
            "topic": message["topic"],
            "message_id": message["message_id"],
            "headers": dict(message["headers"]),
            role: route.name,
        },
        ordering_key=ordering_key,
        **extra,
    )


def check_publish(params: MessagePublishParams) -> MessagePublishParams:
    """Return the publish's params checked, payload normalized to what reads back."""
    if params.delay is not None and (
        not isinstance(params.delay, dt.timedelta) or params.delay < dt.timedelta(0)
    ):
        raise InvalidJob(
            f"delay must be a non-negative timedelta, not {params.delay!r}", field="delay"
        )
    if params.ttl is not None:
        validation.positive_duration(params.ttl, "ttl")
    return dataclasses.replace(
        params,
        topic=check_topic(params.topic),
        payload=validation.json_normalize(params.payload, "payload"),
        headers=check_headers(params.headers),
        ordering_key=validation.key(params.ordering_key, "ordering_key"),
        dedup_key=validation.key(params.dedup_key, "dedup_key"),
        priority=validation.priority(params.priority),
    )


def publish_deliveries(
    subscriptions: Sequence[SubscriptionRow],
    params: MessagePublishParams,
    message_id: str,
    scheduled_at: dt.datetime | None,
) -> list[JobInsertParams]:
    """Return one delivery per subscription whose pattern matches, in name order.

    A paused subscription's delivery is held: scheduled at :data:`HELD_AT`,
    which nothing promotes, until ``subscription_resume`` makes it due.
    ``params`` must have passed :func:`check_publish`.
    """
    message: Message = {
        "topic": params.topic,
        "payload": params.payload,
        "headers": dict(params.headers),
        "message_id": message_id,
    }
    return [
        _delivery(
            sub,
            "subscription",
            message,
            params.ordering_key,
            priority=params.priority,
            scheduled_at=HELD_AT if sub.paused_at is not None else scheduled_at,
            unique_key=f"{sub.name}:{params.dedup_key}" if params.dedup_key else None,
            ttl=params.ttl,
            awaited=params.awaited,
        )
        for sub in sorted(subscriptions, key=lambda s: s.name)
        if pattern_matches(sub.pattern, params.topic)
    ]


def decoded_event(
    position: StreamPosition,
    topic: str,
    key: str | None,
    message_id: str,
    *,
    payload: Callable[[], JSON],
    headers: Callable[[], Any],
    created_at: Callable[[], dt.datetime | None],
) -> StreamEvent:
    """Return a stored event, decoding its columns tolerantly.

    Both engines build events through this, each passing how it reads its
    columns. A column that does not decode (invalid JSON, headers that are
    not an object of strings, a bad time) comes back empty, and the event's
    ``decode_error`` names it: a read shows the row, a pump delivers it as a
    failure, and no other event is held up.
    """
    errors: list[str] = []

    def read(name: str, load: Callable[[], Any], empty: Any) -> Any:
        try:
            return load()
        except Exception as exc:
            errors.append(f"{name}: {exc}")
            return empty

    loaded_payload = read("payload", payload, None)
    loaded_headers = read("headers", lambda: stored_headers(headers()), {})
    loaded_created_at = read("created_at", created_at, None)
    return StreamEvent(
        position=position,
        topic=topic,
        key=key,
        payload=loaded_payload,
        headers=loaded_headers,
        message_id=message_id,
        created_at=loaded_created_at,
        decode_error="; ".join(errors) or None,
    )


def stored_headers(value: Any) -> dict[str, str]:
    """Return stored headers as a dict of strings, or raise ValueError saying why."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"must be an object of strings, not {_short(value)}")
    return value


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def pump_stops(consumer: StreamConsumerRow, limit: int) -> bool:
    """Return whether a pump that has locked ``consumer`` delivers nothing: a zero
    limit, or a consumer an operator paused (checked under the row's lock, so no
    pump starting after the pause commits delivers)."""
    return limit == 0 or consumer.paused_at is not None


def event_message(event: StreamEvent) -> Message:
    """Return the message a stream delivery's function receives."""
    return {
        "topic": event.topic,
        "payload": event.payload,
        "headers": dict(event.headers),
        "message_id": event.message_id,
        "key": event.key,
        "position": {"xid": event.position.xid, "seq": event.position.seq},
    }


def event_deliveries(
    consumer: StreamConsumerRow, events: Sequence[StreamEvent]
) -> list[JobInsertParams]:
    """Return one delivery per event, with the consumer's kind, queue and settings;
    an event's key becomes the delivery's ordering key. An event that does not
    decode is delivered as :func:`undecodable_delivery`."""
    return [
        undecodable_delivery(consumer, event)
        if event.decode_error
        else _delivery(consumer, "consumer", event_message(event), event.key or None)
        for event in events
    ]


def undecodable_delivery(consumer: StreamConsumerRow, event: StreamEvent) -> JobInsertParams:
    """Return the delivery recording that an event does not decode, for this consumer.

    The consumer's function is never called with a message it cannot trust:
    the delivery is a job of :data:`UNDECODABLE_EVENT_KIND` in the consumer's
    queue and lane, with one attempt, that fails with the decode error, so the
    failure is on record (history, admin, ``job_finished``) like any failed
    delivery's, and the consumer's later events go on.
    """
    position = {"xid": event.position.xid, "seq": event.position.seq}
    error = event.decode_error or ""
    return JobInsertParams(
        kind=UNDECODABLE_EVENT_KIND,
        queue=consumer.queue,
        max_attempts=1,
        args={
            "args": [],
            "kwargs": {
                "consumer": consumer.name,
                "topic": event.topic,
                "position": position,
                "error": error,
            },
        },
        metadata={
            **(consumer.metadata or {}),
            "topic": event.topic,
            "message_id": event.message_id,
            "headers": {},
            "consumer": consumer.name,
            "consumer_kind": consumer.kind,
            "decode_error": error,
        },
        ordering_key=event.key or None,
    )

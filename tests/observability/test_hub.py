"""The hub's per-attempt path: a receiver called directly while it listens alone."""

from __future__ import annotations

from typing import Any

import pytest
from django.dispatch import Signal

from django_hopper import signals


@pytest.fixture
def signal() -> Signal:
    return Signal()


def test_send_logged__calls_a_direct_receiver_alone_with_the_signal_and_sender(signal: Signal):
    calls: list[dict[str, Any]] = []
    signals.connect_direct(signal, lambda **kwargs: calls.append(kwargs), "test.direct")
    try:
        signals.send_logged(signal, "a sender", job=1)
    finally:
        signals.disconnect_direct(signal, "test.direct")
    assert calls == [{"signal": signal, "sender": "a sender", "job": 1}]
    assert not signal.receivers
    assert signal not in signals._direct


def test_send_logged__dispatches_to_every_receiver_once_another_connects(signal: Signal):
    calls: list[str] = []
    signals.connect_direct(signal, lambda **kwargs: calls.append("direct"), "test.direct")

    def other(**kwargs: Any) -> None:
        calls.append("other")

    signal.connect(other, weak=False)
    try:
        signals.send_logged(signal, None)
        signal.disconnect(other)
        signals.send_logged(signal, None)
    finally:
        signals.disconnect_direct(signal, "test.direct")
    assert calls == ["direct", "other", "direct"]


def test_send_logged__logs_a_direct_receivers_exception(
    signal: Signal, caplog: pytest.LogCaptureFixture
):
    def broken(**kwargs: Any) -> None:
        raise ValueError("broken receiver")

    signals.connect_direct(signal, broken, "test.direct")
    try:
        signals.send_logged(signal, None)  # does not raise
    finally:
        signals.disconnect_direct(signal, "test.direct")
    assert "broken receiver" in caplog.text


def test_send_logged__a_receiver_connected_with_the_same_uid_by_hand_is_dispatched(
    signal: Signal,
):
    calls: list[str] = []
    signals.connect_direct(signal, lambda **kwargs: calls.append("direct"), "test.direct")
    signals.disconnect_direct(signal, "test.direct")
    signal.connect(lambda **kwargs: calls.append("plain"), dispatch_uid="test.plain", weak=False)
    signals.send_logged(signal, None)
    assert calls == ["plain"]


@pytest.fixture
def attempt_signal(signal: Signal, monkeypatch: pytest.MonkeyPatch) -> Signal:
    """A signal sent positionally with ``job_finished``'s arguments."""
    monkeypatch.setitem(signals._POSITIONAL, signal, ("job", "state", "error", "output"))
    return signal


def test_send_positional__calls_a_positional_direct_receiver_with_the_arguments_in_order(
    attempt_signal: Signal,
):
    calls: list[Any] = []
    signals.connect_direct(
        attempt_signal, lambda *a, **kw: calls.append((a, kw)), "test.direct", positional=True
    )
    try:
        signals.send_positional(attempt_signal, "fn", "job", "completed", None, 3)
    finally:
        signals.disconnect_direct(attempt_signal, "test.direct")
    assert calls == [(("fn", "job", "completed", None, 3), {})]


def test_send_positional__names_the_arguments_for_a_receiver_not_taking_them_in_order(
    attempt_signal: Signal,
):
    calls: list[Any] = []
    signals.connect_direct(attempt_signal, lambda **kw: calls.append(kw), "test.direct")
    try:
        signals.send_positional(attempt_signal, "fn", "job", "retryable", "boom", None)
    finally:
        signals.disconnect_direct(attempt_signal, "test.direct")
    named = {"job": "job", "state": "retryable", "error": "boom", "output": None}
    assert calls == [{"signal": attempt_signal, "sender": "fn", **named}]


def test_send_positional__names_the_arguments_for_every_receiver_once_another_connects(
    attempt_signal: Signal,
):
    calls: list[Any] = []

    def other(sender: Any, **kwargs: Any) -> None:
        calls.append(("other", sender, kwargs))

    signals.connect_direct(
        attempt_signal,
        lambda *a, **kw: calls.append(("direct", a, kw)),
        "test.direct",
        positional=True,
    )
    attempt_signal.connect(other, weak=False)
    try:
        signals.send_positional(attempt_signal, "fn", "job", "retryable", "boom", None)
    finally:
        attempt_signal.disconnect(other)
        signals.disconnect_direct(attempt_signal, "test.direct")
    named = {"job": "job", "state": "retryable", "error": "boom", "output": None}
    assert calls == [
        ("direct", (), {"signal": attempt_signal, "sender": "fn", **named}),
        ("other", "fn", {"signal": attempt_signal, **named}),
    ]


def test_send_positional__calls_the_positional_function_alone_and_the_receiver_once_dispatched(
    signal: Signal, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(signals._POSITIONAL, signal, ("job",))
    calls: list[Any] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        calls.append(("receiver", sender, kwargs["job"]))

    def positional(sender: Any, job: Any) -> None:
        calls.append(("positional", sender, job))

    def other(**kwargs: Any) -> None:
        calls.append(("other",))

    signals.connect_direct(signal, receiver, "test.direct", positional=positional)
    try:
        signals.send_positional(signal, "a sender", "a job")
        signal.connect(other, weak=False)
        signals.send_positional(signal, "a sender", "a job")
    finally:
        signals.disconnect_direct(signal, "test.direct")
    assert calls == [
        ("positional", "a sender", "a job"),
        ("receiver", "a sender", "a job"),
        ("other",),
    ]


@pytest.mark.parametrize("send", ["send_logged", "send_positional"])
def test_a_signal_sent_while_its_direct_receiver_is_disconnected_elsewhere_never_raises(
    attempt_signal: Signal, send: str
):
    """Another thread may disconnect the receiver at any point of the send: the
    send calls it (it began while connected) or nobody, and never fails."""
    import sys

    sender = getattr(signals, send)
    code = sender.__code__
    args = ("fn", "job", "completed", None, 3)
    lines = 0
    at = 0
    while True:
        at += 1
        signals.connect_direct(
            attempt_signal, lambda *a, **kw: None, "test.direct", positional=True
        )
        seen = 0

        def trace(frame: Any, event: str, arg: Any, at: int = at) -> Any:
            nonlocal seen
            if frame.f_code is not code:
                return None
            if event == "line":
                seen += 1
                if seen == at:  # the other thread's disconnect lands before this line
                    signals.disconnect_direct(attempt_signal, "test.direct")
            return trace

        sys.settrace(trace)
        try:
            if send == "send_logged":
                sender(attempt_signal, "fn", job="job")
            else:
                sender(attempt_signal, *args)
        finally:
            sys.settrace(None)
            signals.disconnect_direct(attempt_signal, "test.direct")
        lines = max(lines, seen)
        if at > lines:  # every line of the send had the disconnect land before it
            break
    assert not attempt_signal.receivers

"""The notifier: turns database notifications into wake-ups (engines with ``supports_listen``):
insert notifications wake producers, stream appends wake the leader's pump."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django_hopper.exceptions import NotSupported
from django_hopper.types import CHANNEL_CONTROL, CHANNEL_INSERT, CHANNEL_LEADER, CHANNEL_STREAM
from django_hopper.worker.db import Backoff, close_thread_connections

if TYPE_CHECKING:
    from django_hopper.engine.base import BaseEngine
    from django_hopper.types import Notification
    from django_hopper.worker.control import ControlState

logger = logging.getLogger("django_hopper.worker")


class Notifier:
    """Turns notifications into wake-ups and control state changes.

    Reconnects with backoff when the listening connection breaks, and wakes
    every producer after reconnecting, since notifications sent meanwhile
    were lost.
    """

    def __init__(self, engine: BaseEngine, control: ControlState) -> None:
        self.engine = engine
        self.control = control

    def dispatch(self, note: Notification) -> None:
        """Act on one notification."""
        control = self.control
        if note.channel == CHANNEL_INSERT:
            control.wake(note.payload)
        elif note.channel == CHANNEL_CONTROL:
            control.on_message(note.payload)
        elif note.channel == CHANNEL_LEADER and control.elect is not None:
            control.elect.set()
        elif note.channel == CHANNEL_STREAM and control.streams is not None:
            control.streams(note.payload)

    def channels(self) -> list[str]:
        """Return the channels to listen on: stream appends only where maintenance runs."""
        channels: list[str] = [CHANNEL_INSERT, CHANNEL_CONTROL, CHANNEL_LEADER]
        if self.control.streams is not None:
            channels.append(CHANNEL_STREAM)
        return channels

    def run(self) -> None:
        """Listen until the worker stops."""
        stopping_hard = self.control.stopping_hard
        delay = Backoff(0.1, 5.0)
        first = True
        try:
            while not stopping_hard.is_set():
                listener = None
                try:
                    try:
                        listener = self.engine.listener()
                    except NotSupported:
                        return  # no session for LISTEN (a transaction pooler): poll
                    listener.listen(self.channels())
                    if not first:
                        logger.info("listening again")
                        self.control.wake_all()
                    first = False
                    delay.reset()
                    while not stopping_hard.is_set():
                        for note in listener.next(0.5):
                            self.dispatch(note)
                except Exception:
                    wait = delay.next()
                    logger.warning(
                        "listening for notifications failed; reconnecting in %.2fs",
                        wait,
                        exc_info=True,
                    )
                    stopping_hard.wait(wait)
                finally:
                    if listener is not None:
                        try:
                            listener.close()
                        except Exception:
                            logger.debug("closing the listener failed", exc_info=True)
        finally:
            close_thread_connections()

"""``hopper_worker --processes N``: N worker processes under one supervisor.

Each child is ``hopper_worker`` without ``--processes`` (its own client, its
own lease), so a child that crashes loses nothing: the rescue recovers its
jobs and the supervisor starts a replacement. The supervisor exits once its
children have all stopped.

Signals: the children share the supervisor's process group and cgroup, so a
terminal's Ctrl-C, ``kill -TERM -<pgid>`` or systemd's stop reach each child
directly as well as the supervisor. Forwarding SIGTERM/SIGINT would then make
one stop two signals, and a worker's second signal abandons its jobs. The
supervisor therefore forwards its first SIGTERM/SIGINT as SIGUSR1 ("stop
gracefully", which a child takes any number of times) and every later one as
SIGUSR2 ("stop at once"); see ``hopper_worker.follow_supervisor``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

logger = logging.getLogger("django_hopper.worker.supervisor")


def child_command(argv: Sequence[str]) -> list[str]:
    """Return the command line that runs one child worker with ``argv`` arguments.

    Through ``manage.py`` when the supervisor was started that way, else
    through ``python -m django`` (settings come from the environment).
    """
    script = sys.argv[0] if sys.argv else ""
    if script.endswith("manage.py") and os.path.exists(script):
        return [sys.executable, script, "hopper_worker", *argv]
    return [sys.executable, "-m", "django", "hopper_worker", *argv]


class Supervisor:
    """Starts, watches and stops the child worker processes."""

    def __init__(self, processes: int, argv: Sequence[str], *, burst: bool = False) -> None:
        self.processes = processes
        self.command = child_command(argv)
        self.burst = burst
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.stopping = False
        self._signals = 0

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["HOPPER_SUPERVISOR_PID"] = str(os.getpid())
        paths = [p for p in (os.getcwd(), *sys.path) if p and os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        return env

    def _start(self, slot: int) -> None:
        env = self._env()
        env["HOPPER_WORKER_SLOT"] = str(slot)  # e.g. each child's metrics port
        proc = subprocess.Popen(self.command, env=env)
        self.children[slot] = proc
        logger.info("started worker process %d (pid %d)", slot, proc.pid)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Ask every child to stop: gracefully the first time, at once after that."""
        self._signals += 1
        self.stopping = True
        forward = signal.SIGUSR1 if self._signals == 1 else signal.SIGUSR2
        if self._signals > 1:
            logger.warning("second signal: stopping the worker processes at once")
        for proc in self.children.values():
            if proc.poll() is None:
                try:
                    proc.send_signal(forward)
                except ProcessLookupError:
                    pass

    def run(self) -> int:
        """Run the children until a signal (or, in burst mode, until all are done)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for slot in range(self.processes):
            self._start(slot)
        restarts: dict[int, float] = {}
        code = 0
        while self.children:
            time.sleep(0.1)
            for slot, proc in list(self.children.items()):
                rc = proc.poll()
                if rc is None:
                    continue
                del self.children[slot]
                if self.stopping or (self.burst and rc == 0):
                    code = code or (rc if rc and rc > 0 else 0)
                    continue
                logger.error("worker process %d (pid %d) exited with %s", slot, proc.pid, rc)
                # Restart at once the first time, then no more than once a second.
                last = restarts.get(slot, 0.0)
                wait = max(0.0, 1.0 - (time.monotonic() - last))
                if wait:
                    time.sleep(wait)
                restarts[slot] = time.monotonic()
                if not self.stopping:
                    self._start(slot)
        return code

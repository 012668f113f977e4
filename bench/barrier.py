"""A common start for the benchmark's worker processes (warm processing runs).

The runner starts every worker of a measurement with ``BENCH_BARRIER`` set to
two inherited pipe ends, ``"<ready>,<go>"``, and this module among the
workers' ``HOPPER["IMPORTS"]``. Once a worker has set up (schema checked, job
modules imported, lease registered, paused queues read, completer and job
threads started: ``worker_started``), it writes one byte to ``ready`` and
blocks reading ``go``; the runner closes ``go`` once every worker is ready, and
all of them start claiming at once. Python's and Django's start-up, which
takes seconds of CPU on a loaded 2-core machine, then never overlaps the
measured window, and no worker works alone while another is still starting,
as the raw cycle's processes start behind a barrier too.

The cold section never uses it: it measures workers as a user starts them.
"""

from __future__ import annotations

import os
from typing import Any

from django_hopper import signals

_ENV = "BENCH_BARRIER"


def wait_at_barrier(**_kwargs: Any) -> None:
    """Say ready, then wait until the runner releases every worker."""
    fds = os.environ.pop(_ENV, "")
    if not fds:
        return
    ready, go = (int(fd) for fd in fds.split(","))
    os.write(ready, b"r")
    os.close(ready)
    os.read(go, 1)  # end of file: the runner closed its end
    os.close(go)


signals.worker_started.connect(wait_at_barrier, dispatch_uid="bench-barrier")

"""``manage.py hopper_worker``: run jobs (one process = one client)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_hopper.conf import hopper_settings
from django_hopper.engine import get_engine
from django_hopper.management.options import check_schema, database_alias
from django_hopper.observability import console, metrics
from django_hopper.topology import queue_alias, queues_of
from django_hopper.validation import QUEUE_RE
from django_hopper.worker import Worker, WorkerConfig
from django_hopper.worker.supervisor import Supervisor


def parse_queues(value: str, default_concurrency: int | None = None) -> dict[str, int]:
    """Parse ``name:conc,name2:conc``; a bare name takes ``default_concurrency`` or 10.

    Queue names may contain ``:``, so only a numeric last segment is a concurrency.
    """
    queues: dict[str, int] = {}
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        name, sep, conc = part.rpartition(":")
        if not sep or not conc.lstrip("-").isdigit():
            name, conc = part, ""
        if not QUEUE_RE.fullmatch(name):
            raise CommandError(f"--queues: malformed queue name {name!r}")
        n = int(conc) if conc else (default_concurrency or 10)
        if n < 1:
            raise CommandError(f"--queues: concurrency of {name!r} must be at least 1")
        queues[name] = n
    if not queues:
        raise CommandError("--queues names no queue")
    return queues


def _queues_on(alias: str, queues: dict[str, int], *, explicit: bool) -> dict[str, int]:
    """Return the queues a worker on ``alias`` serves: one worker process, one database.

    With ``HOPPER["QUEUE_DATABASES"]`` set, the default queues are those living
    on the alias, and a queue named with ``--queues`` must live there.
    """

    if not hopper_settings.QUEUE_DATABASES:
        return queues
    if explicit:
        for queue in queues:
            home = queue_alias(queue)
            if home != alias:
                raise CommandError(
                    f"--queues: queue {queue!r} lives on database {home!r} "
                    f"(HOPPER['QUEUE_DATABASES']); start its worker with --database {home}"
                )
        return queues
    mine = queues_of(alias, queues)
    if not mine:
        raise CommandError(
            f"no queue of HOPPER['QUEUES'] lives on database {alias!r}: name them with --queues"
        )
    return mine


class Command(BaseCommand):
    help = "Run hopper jobs from the given queues until stopped (SIGTERM/SIGINT)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queues",
            help="Queues and concurrency, e.g. default:10,emails:4 (default: HOPPER['QUEUES']).",
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            help="Concurrency of every queue (overrides the per-queue numbers).",
        )
        parser.add_argument(
            "--processes", type=int, default=1, help="Run N worker processes under a supervisor."
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Run every due job, then exit once nothing is claimable and nothing runs.",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            help="Seconds to wait for running jobs when stopping (HOPPER['SHUTDOWN_TIMEOUT']).",
        )
        parser.add_argument(
            "--no-maintenance",
            action="store_true",
            help="Do not take part in leader election (run hopper_maintain elsewhere).",
        )
        parser.add_argument(
            "--log-format",
            choices=("text", "json"),
            help="Console lines as text or one JSON object per line (HOPPER['LOG_FORMAT']).",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            help=(
                "Serve Prometheus metrics on this port (needs prometheus-client); with "
                "--processes N, process i serves on port + i."
            ),
        )
        parser.add_argument(
            "--metrics-host",
            default="127.0.0.1",
            help="Address the metrics endpoint binds (default 127.0.0.1: this machine only).",
        )
        parser.add_argument(
            "--database",
            help=(
                "Database alias whose jobs to run (default HOPPER['DATABASE']), e.g. the "
                "alias a Tasks backend stores its tasks on with OPTIONS['database']."
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:

        verbosity = int(options.get("verbosity", 1))
        log_format = options.get("log_format") or str(hopper_settings.LOG_FORMAT)
        processes = options["processes"]
        if processes < 1:
            raise CommandError("--processes must be at least 1")
        total = os.environ.get(PROCESSES_ENV, "")
        console.configure(
            verbosity,
            log_format,
            processes=int(total) if total.isdigit() else 1,
        )
        if options["queues"]:
            queues = parse_queues(options["queues"], options["concurrency"])
        else:
            queues = {str(k): int(v) for k, v in dict(hopper_settings.QUEUES).items()}
        if options["concurrency"] is not None:
            if options["concurrency"] < 1:
                raise CommandError("--concurrency must be at least 1")
            queues = {q: options["concurrency"] for q in queues}
        alias = database_alias(options)
        queues = _queues_on(alias, queues, explicit=bool(options["queues"]))
        check_schema(alias, wait_for_database=True)
        metrics_port = options.get("metrics_port")
        if metrics_port is not None and not 0 < metrics_port < 65536:
            raise CommandError("--metrics-port must be a port number (1-65535)")
        if processes > 1:
            # The children's system checks ran here already: print them once.
            argv = ["--skip-checks", "--queues", ",".join(f"{q}:{c}" for q, c in queues.items())]
            argv += ["--log-format", log_format]
            if metrics_port is not None:
                argv += ["--metrics-port", str(metrics_port)]
                argv += ["--metrics-host", str(options["metrics_host"])]
            if options["burst"]:
                argv.append("--burst")
            if options["shutdown_timeout"] is not None:
                argv += ["--shutdown-timeout", str(options["shutdown_timeout"])]
            if options["no_maintenance"]:
                argv.append("--no-maintenance")
            if options.get("database"):
                argv += ["--database", alias]
            if options.get("settings"):
                argv += ["--settings", options["settings"]]
            argv += ["--verbosity", str(options.get("verbosity", 1))]
            os.environ[PROCESSES_ENV] = str(processes)
            code = Supervisor(processes, argv, burst=options["burst"]).run()
            if code:
                raise CommandError(f"worker processes exited with status {code}", returncode=code)
            return
        config = WorkerConfig(
            queues=queues,
            burst=options["burst"],
            shutdown_timeout=options["shutdown_timeout"],
            maintenance=not options["no_maintenance"],
            freeze_heap=True,
        )
        worker = Worker(config, get_engine(alias))
        if metrics_port is not None:
            slot = os.environ.get(SLOT_ENV, "")
            port = metrics_port + (int(slot) if slot.isdigit() else 0)
            metrics.serve(port, str(options["metrics_host"]))
        supervisor = os.environ.get(SUPERVISOR_ENV)
        if supervisor and supervisor.isdigit():
            follow_supervisor(worker, int(supervisor))
        code = worker.run()
        if worker.stranded:
            # Threads of jobs that outlived the shutdown timeout cannot be joined;
            # leave without waiting for them (the rescue recovers their jobs).
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if code:
            raise CommandError(f"worker exited with status {code}", returncode=code)


#: Set by the supervisor in its children's environment: the supervisor's PID.
SUPERVISOR_ENV = "HOPPER_SUPERVISOR_PID"
#: Set by the supervisor in each child's environment: the child's slot (0..N-1).
SLOT_ENV = "HOPPER_WORKER_SLOT"
#: Set for the children of a supervisor: how many worker processes it runs.
PROCESSES_ENV = "HOPPER_WORKER_PROCESSES"


def follow_supervisor(worker: Worker, supervisor_pid: int) -> None:
    """Take stop requests from the supervisor on their own signals, and stop if it dies.

    A child shares its supervisor's process group and cgroup, so a terminal's
    Ctrl-C or systemd's stop signals it directly *and* through the
    supervisor. The supervisor therefore forwards SIGUSR1 (stop gracefully,
    however often it arrives) and, on a second signal, SIGUSR2 (stop at
    once): a stop that reaches the child twice is one stop, not the
    worker's "second signal" that abandons its jobs. SIGTERM and SIGINT keep
    their meaning for a child signalled on its own. A child whose supervisor
    died (SIGKILL) stops gracefully instead of running on unsupervised.
    """

    def stop_gracefully() -> None:
        logging.getLogger("django_hopper.worker").info("the supervisor asked to stop")
        worker.stop()

    def stop(signum: int, frame: FrameType | None) -> None:
        # The same stop often arrives as SIGINT too, and this handler may run
        # inside the worker's own, in the middle of an Event.set() whose lock
        # is not reentrant: stopping from this thread could deadlock, so stop
        # from another one.
        if not worker.stopping.is_set():
            threading.Thread(target=stop_gracefully, name="hopper-stop", daemon=True).start()

    def stop_now(signum: int, frame: FrameType | None) -> None:
        logging.getLogger("django_hopper.worker").warning("the supervisor asked to stop at once")
        logging.shutdown()
        os._exit(1)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, stop)
        signal.signal(signal.SIGUSR2, stop_now)

    def watch() -> None:
        while not worker.stopping.wait(1.0):
            if os.getppid() != supervisor_pid:
                logging.getLogger("django_hopper.worker").error(
                    "the supervisor (pid %d) is gone: stopping", supervisor_pid
                )
                worker.stop()
                return

    threading.Thread(target=watch, name="hopper-supervisor-watch", daemon=True).start()

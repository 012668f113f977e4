"""A throwaway PgBouncer in front of the test PostgreSQL server.

The suite starts its own bouncer (Debian's ``pgbouncer`` package) on a free
local port, with a generated configuration and user list, in ``transaction`` or
``session`` pool mode, and stops it afterwards. ``scripts/test`` uses the
command line to run a pass of the suite through it::

    python -m tests.pgbouncer start --mode transaction --dir .pgbouncer   # prints the port
    python -m tests.pgbouncer stop --dir .pgbouncer
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

#: Where Debian installs it.
BINARIES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def binary() -> str | None:
    """Return the path of the pgbouncer binary, or None when it is not installed."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((b for b in BINARIES if os.path.exists(b)), None)


def free_port() -> int:
    """Return a local TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Bouncer:
    """One pgbouncer process, its files in ``workdir``."""

    def __init__(
        self,
        workdir: Path,
        mode: str = "transaction",
        *,
        server_host: str | None = None,
        server_port: int | None = None,
        user: str | None = None,
    ) -> None:
        if mode not in ("transaction", "session"):
            raise ValueError(f"pool mode must be transaction or session, not {mode!r}")
        self.workdir = Path(workdir).resolve()
        self.mode = mode
        self.server_host = server_host or os.environ.get("PGHOST", "127.0.0.1")
        self.server_port = int(server_port or os.environ.get("PGPORT", "5432"))
        self.user = user or os.environ.get("PGUSER", "root")
        self.port = 0

    @property
    def pidfile(self) -> Path:
        return self.workdir / "pgbouncer.pid"

    @property
    def logfile(self) -> Path:
        return self.workdir / "pgbouncer.log"

    def write_config(self) -> Path:
        """Write pgbouncer.ini and the user list (trust: the names must still be listed)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        ini = self.workdir / "pgbouncer.ini"
        ini.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={self.server_host} port={self.server_port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {self.workdir / 'userlist.txt'}",
                    f"admin_users = {self.user}",
                    f"pool_mode = {self.mode}",
                    "max_client_conn = 1000",
                    "default_pool_size = 40",
                    "reserve_pool_size = 10",
                    # Django and psycopg send these at connect; the bouncer keeps
                    # them per client instead of refusing the connection.
                    "ignore_startup_parameters = extra_float_digits,options",
                    "server_check_delay = 0",
                    f"logfile = {self.logfile}",
                    f"pidfile = {self.pidfile}",
                    "",
                ]
            )
        )
        return ini

    def start(self, timeout: float = 15.0) -> int:
        """Start the bouncer in the background; return its port once it accepts connections."""
        exe = binary()
        if exe is None:
            raise RuntimeError("pgbouncer is not installed (apt-get install -y pgbouncer)")
        self.port = free_port()
        ini = self.write_config()
        command = [exe, "-d", "-q", str(ini)]
        if os.geteuid() == 0:
            # pgbouncer refuses to run as root: it switches to an unprivileged user.
            os.chmod(self.workdir, 0o777)
            for path in self.workdir.iterdir():
                os.chmod(path, 0o666)
            command[1:1] = ["-u", "nobody"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pgbouncer failed to start: {done.stderr} {self.log()}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self.port
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not start on port {self.port}: {self.log()}")

    def pid(self) -> int | None:
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the bouncer at once (SIGTERM: its server connections close with it)."""
        pid = self.pid()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--mode", default="transaction", choices=("transaction", "session"))
    parser.add_argument("--dir", default=".pgbouncer")
    args = parser.parse_args(argv)
    bouncer = Bouncer(Path(args.dir), args.mode)
    if args.action == "start":
        print(bouncer.start())
    else:
        bouncer.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

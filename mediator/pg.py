"""The embedded, root-safe PostgreSQL launcher.

``Mediator.connect()`` with no URL, ``mediator serve`` without ``--database-url``, the simulator and
the test session all need a private PostgreSQL cluster. ``testing.postgresql`` does the lifecycle
(initdb, free port, start, wait, stop, clean up); this module adds what it lacks here:

* PostgreSQL refuses to run as root, and CI runs as root. When the process is root, ``initdb`` and
  ``postgres`` run through ``setpriv --reuid/--regid --init-groups`` as an unprivileged user
  (``postgres`` if it exists, else ``nobody``). ``setpriv`` execs in place, so SIGINT from
  ``stop()`` reaches the server itself (``runuser``/``su`` do not forward it and orphan the server),
  and ``--pdeathsig`` stops the server if the launching process dies without cleaning up. Linux
  ties that signal to the *thread* that started the server: start a cluster from a thread that
  outlives it (the main thread), or it stops when that thread ends.
* A missing server says how to install it instead of ``command not found: initdb``.
* Two kinds of cluster (docs/design.md §19 "The embedded database"). A **persistent** cluster
  (``mediator serve --data DIR``, ``Mediator.connect(data_dir=...)``) keeps PostgreSQL's durable
  defaults — ``fsync``, ``synchronous_commit`` and ``full_page_writes`` on — so a committed run,
  lease or result survives an OS crash or power cut, as the sealed records that describe it do.
  An **ephemeral** cluster (tests, simulations, notebooks, ``Mediator.connect()`` without a URL)
  lives on tmpfs (``/dev/shm``) with all three off: it starts in about a second, and nothing of it
  is meant to outlive its process anyway.
* One process per persistent cluster: it holds an exclusive lock on ``DIR/mediator.lock`` for its
  life, and a second process on the same ``DIR`` is refused with the first one's pid before it
  touches anything (:class:`~mediator.core.errors.DataDirInUse`), instead of silently sharing the
  first one's server.
* An ephemeral cluster leaves nothing behind, even when its process is killed outright (SIGKILL, a
  notebook kernel shut down without its exit handlers): a small watcher process
  (:data:`_JANITOR`) waits on a pipe only the owner holds and, if the owner goes without saying
  it stopped the cluster, stops the server and removes the folder. Folders left by a process and
  watcher both killed carry the owner's pid in their name and are removed by the next cluster's
  start once that pid is dead and no server runs on them (mediator/tmpdirs.py).
* Clients connect over the cluster's unix socket, which is several times cheaper per round trip
  than TCP on loopback (docs/performance.md measures ``SELECT 1`` at ~90 µs).
* Only its owner can reach it (issue 11 §10, docs/security.md "The embedded database"). The
  cluster trusts whoever connects, so nobody else may connect at all: it listens on **no TCP
  address**, only on a unix socket in ``<base>/tmp``, a directory of mode 0700 owned by the account
  that runs the server (this account, or ``postgres``/``nobody`` when we are root — root passes
  anyway). We chose this over password authentication: no secret to generate, store and rotate,
  nothing that a leaked URL gives away, and the socket is faster than TCP besides.
* A fixed port number (:data:`PORT`): with no TCP it only names the socket file, so every cluster
  can use the same one, and a persistent cluster keeps one address across restarts — the one
  ``mediator serve`` prints.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import pwd
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import quote

import testing.postgresql

from mediator import tmpdirs
from mediator.core.errors import DataDirInUse, PostgresNotInstalled

INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, postgres) were not found. Install them, e.g. "
    "`apt-get install postgresql` on Debian/Ubuntu, `conda install -c conda-forge postgresql`, "
    "or put their directory on PATH / set MEDIATOR_PG_BIN; or pass database_url= / set "
    "MEDIATOR_DATABASE_URL to use an existing server."
)

# Durability traded for speed: only for clusters that are thrown away anyway. A persistent cluster
# gets none of these (nor ``-F``): PostgreSQL's defaults are all on.
EPHEMERAL_SETTINGS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")
EPHEMERAL_PREFIX = "mediator-pg-"  # then the owner's pid (mediator/tmpdirs.py)
LOCK_FILE = "mediator.lock"  # in a persistent cluster's folder, held by the process serving it
STALE_SERVER_WAIT_S = 15.0  # a server whose owner just died gets this long to finish shutting down
# What PostgreSQL says right after a crash while a killed server's backends still hold its
# shared memory, or its pid file names a process that is not gone (a zombie, a reused pid).
_LEFTOVER = ("pre-existing shared memory block", "lock file", "already exists")
# Names the socket file (.s.PGSQL.5432) in the cluster's private socket directory; no TCP.
PORT = 5432


def find_server_binaries() -> tuple[str, str]:
    """Locate ``initdb`` and ``postgres``: MEDIATOR_PG_BIN, then PATH, then the usual places."""
    dirs: list[str] = []
    if os.environ.get("MEDIATOR_PG_BIN"):
        dirs.append(os.environ["MEDIATOR_PG_BIN"])
    found = shutil.which("initdb"), shutil.which("postgres")
    if all(found):
        return found[0] or "", found[1] or ""
    # Newest version first, so a machine with several picks the one it would start by default.
    dirs += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    dirs += ["/usr/local/pgsql/bin", "/usr/local/bin", "/opt/homebrew/bin"]
    for d in dirs:
        initdb, postgres = os.path.join(d, "initdb"), os.path.join(d, "postgres")
        if os.access(initdb, os.X_OK) and os.access(postgres, os.X_OK):
            return initdb, postgres
    raise PostgresNotInstalled(INSTALL_HINT)


@dataclass(frozen=True)
class RunAs:
    """The unprivileged account the server runs as when we are root."""

    user: str
    uid: int
    gid: int

    @classmethod
    def pick(cls) -> RunAs | None:
        if os.geteuid() != 0:
            return None
        for name in ("postgres", "nobody"):
            try:
                pw = pwd.getpwnam(name)
            except KeyError:
                continue
            return cls(name, pw.pw_uid, pw.pw_gid)
        raise PostgresNotInstalled(
            "Running as root and no unprivileged account (postgres or nobody) exists to run the "
            "PostgreSQL server as; create one, or run as a normal user."
        )

    def wrap(self, argv: list[str]) -> list[str]:
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--init-groups",
            "--pdeathsig=SIGINT",
            "--",
            *argv,
        ]

    def check_reachable(self, path: str) -> None:
        """Every folder above ``path`` must let this user through, or initdb fails obscurely."""
        parent = os.path.dirname(os.path.abspath(path))
        while parent and parent != os.path.dirname(parent):
            try:
                st = os.stat(parent)
            except FileNotFoundError:  # made below by os.makedirs, with this process's umask
                parent = os.path.dirname(parent)
                continue
            if st.st_uid == self.uid:
                allowed = bool(st.st_mode & 0o100)
            elif st.st_gid == self.gid:
                allowed = bool(st.st_mode & 0o010)
            else:
                allowed = bool(st.st_mode & 0o001)
            if not allowed:
                raise PostgresNotInstalled(
                    f"The PostgreSQL data directory {path} is inside {parent}, which the "
                    f"unprivileged user {self.user!r} that runs the server cannot enter; choose a "
                    "data directory elsewhere (e.g. under /var/lib or /srv) or open that folder."
                )
            parent = os.path.dirname(parent)

    def own(self, path: str) -> None:
        for root, dirs, files in os.walk(path):
            os.chown(root, self.uid, self.gid)
            for name in dirs + files:
                os.chown(os.path.join(root, name), self.uid, self.gid, follow_symlinks=False)


class _Cluster(testing.postgresql.Postgresql):  # type: ignore[misc]
    """``testing.postgresql`` with ``initdb`` and ``postgres`` run as ``run_as`` (a setting)."""

    def initialize(self) -> None:
        self.run_as: RunAs | None = self.settings.pop("run_as", None)
        super().initialize()

    def initialize_database(self) -> None:
        # Every start, also of a cluster made by an older version: the socket directory (and the
        # folder holding it) belongs to the server's account alone.
        for path in (self.base_dir, os.path.join(self.base_dir, "tmp")):
            os.chmod(path, 0o700)
            if self.run_as is not None:
                os.chown(path, self.run_as.uid, self.run_as.gid)
        data = os.path.join(self.base_dir, "data")
        if os.path.exists(os.path.join(data, "PG_VERSION")):
            return  # a persistent cluster that exists already
        argv = [self.initdb, "-D", data, "--lc-messages=C", *self.settings["initdb_args"].split()]
        if self.run_as is not None:
            self.run_as.own(self.base_dir)
            argv = self.run_as.wrap(argv)
        done = subprocess.run(argv, capture_output=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr.decode(errors='replace')}")

    def get_server_commandline(self) -> list[str]:
        argv: list[str] = super().get_server_commandline()
        argv += ["-c", "listen_addresses=", "-c", "unix_socket_permissions=0700"]  # no TCP
        return self.run_as.wrap(argv) if self.run_as is not None else argv

    def dsn(self, **kwargs: Any) -> dict[str, Any]:
        """pg8000's arguments (testing.postgresql's readiness check uses them): the socket."""
        sock = os.path.join(self.base_dir, "tmp", f".s.PGSQL.{self.settings['port']}")
        return {
            "user": kwargs.get("user", "postgres"),
            "database": kwargs.get("database", "test"),
            "unix_sock": sock,
        }


def _running_server(base_dir: str) -> int | None:
    """The pid of a PostgreSQL server running on ``base_dir``'s cluster, if one is.

    Read from ``data/postmaster.pid`` (which the server removes at a clean stop) and believed only
    if that process's command line names this data directory: a pid left by a server that was
    killed may since have been given to another process.
    """
    data = os.path.join(base_dir, "data")
    try:
        with open(os.path.join(data, "postmaster.pid")) as f:
            pid = int(f.readline().strip() or "0")
    except (OSError, ValueError):
        return None
    if pid <= 0 or not tmpdirs.alive(pid):
        return None
    if not os.path.isdir("/proc"):
        return pid  # no /proc to ask (macOS): trust the pid
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()  # empty for a zombie
    except OSError:
        return None  # gone meanwhile
    return pid if os.fsencode(data) in cmdline else None


def _clear_stale_pidfile(base_dir: str) -> None:
    """Remove ``data/postmaster.pid`` (and the socket's lock file) when no process of the
    cluster is left.

    A postmaster killed with ``kill -9`` leaves its pid file behind. PostgreSQL removes such a
    file itself unless that pid is alive — but a killed postmaster can linger as a zombie (a
    container whose init does not reap) or its pid be given to another process, and then it
    refuses to start ("lock file postmaster.pid already exists") until someone removes the file.
    It is safe to remove exactly when no process works in the data directory: every PostgreSQL
    process (postmaster and backends) has it as its working directory, and a zombie has none.
    The caller holds the directory's lock, so no other launcher starts a server meanwhile.
    Without /proc nothing is removed (PostgreSQL's own check stands).
    """
    data = os.path.realpath(os.path.join(base_dir, "data"))
    # the data directory's lock file, and the socket's (PostgreSQL checks both alike)
    stale = [os.path.join(data, "postmaster.pid")]
    stale += glob.glob(os.path.join(base_dir, "tmp", ".s.PGSQL.*.lock"))
    if not any(os.path.exists(f) for f in stale) or not os.path.isdir("/proc"):
        return
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/cwd") == data:
                    return  # a process of the cluster is still there
            except OSError:
                continue  # gone, a zombie, or not ours to read
    for path in stale:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


# The watcher of an ephemeral cluster: run with the folder as argv[1] and a pipe as stdin that
# only the owner writes. "stopped" on it: the owner cleaned up, nothing to do. End of file without
# it: the owner is gone (killed, or exited without stopping the cluster) — stop the server
# (SIGINT, PostgreSQL's fast shutdown; SIGKILL if it does not go) and remove the folder. It runs in
# its own session, so a Ctrl-C or a kernel interrupt aimed at the owner's group spares it.
_JANITOR = """
import os, shutil, signal, sys, time
base = sys.argv[1]
if sys.stdin.readline().strip() == "stopped":
    sys.exit(0)
data = os.path.join(base, "data")
def running():
    try:
        pid = int(open(os.path.join(data, "postmaster.pid")).readline())
        if os.fsencode(data) in open(f"/proc/{pid}/cmdline", "rb").read():
            return pid
    except (OSError, ValueError):
        pass
    return None
pid = running()
if pid is not None:
    try:
        os.kill(pid, signal.SIGINT)
    except OSError:
        pass
    deadline = time.monotonic() + 20
    while running() is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    if running() is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        time.sleep(0.5)
shutil.rmtree(base, ignore_errors=True)
"""


class EmbeddedPostgres:
    """A private PostgreSQL cluster: ephemeral on tmpfs, or persistent and durable in ``data_dir``.

    Args:
        data_dir: keep the cluster here across restarts (``mediator serve --data``), with
            PostgreSQL's durable defaults; ``None`` makes a throw-away cluster on tmpfs, without
            fsync, that is deleted by :meth:`stop` (or by its watcher if this process dies first).
        database: the database created for the caller (``mediator`` by default).
        server_settings: extra ``name=value`` settings passed with ``-c`` at start, e.g. the
            statement-counting bench's ``shared_preload_libraries=pg_stat_statements``.

    Raises:
        PostgresNotInstalled: no server binaries, or the server's account cannot reach
            ``data_dir``.
        DataDirInUse: another process serves ``data_dir`` already.
    """

    def __init__(
        self,
        data_dir: str | None = None,
        database: str = "mediator",
        server_settings: tuple[str, ...] = (),
    ) -> None:
        initdb, postgres = find_server_binaries()
        self.run_as = RunAs.pick()
        self.ephemeral = data_dir is None
        self._lock: IO[str] | None = None
        self._janitor: subprocess.Popen[bytes] | None = None
        if data_dir is None:
            parent = (
                "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            )
            uids = {os.getuid()} | ({self.run_as.uid} if self.run_as is not None else set())
            tmpdirs.remove_orphans(
                EPHEMERAL_PREFIX, parent, uids, lambda p: bool(_running_server(p))
            )
            base_dir = tmpdirs.make(EPHEMERAL_PREFIX, parent)
            if sys.executable:  # an embedding interpreter may not name one: no watcher then
                self._janitor = subprocess.Popen(
                    [sys.executable, "-I", "-c", _JANITOR, base_dir],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    cwd="/",
                    start_new_session=True,
                )
        else:
            base_dir = os.path.abspath(data_dir)
            os.makedirs(base_dir, exist_ok=True)
            if self.run_as is not None:
                self.run_as.check_reachable(base_dir)
            self._lock = self._take(base_dir)
        self.base_dir = base_dir
        settings = ["-c", "logging_collector=off"]
        if self.ephemeral:
            for s in EPHEMERAL_SETTINGS:
                settings += ["-c", s]
        settings += ["-c", "max_connections=200"]
        for s in server_settings:
            settings += ["-c", s]
        cluster = {
            "base_dir": base_dir,
            "initdb": initdb,
            "initdb_args": "-U postgres -A trust -E UTF8 --locale=C",
            "postgres": postgres,
            "postgres_args": " ".join(settings),
            "port": PORT,
        }
        deadline = time.monotonic() + STALE_SERVER_WAIT_S
        try:
            while True:
                try:
                    self._pg: Any = _Cluster(**cluster, run_as=self.run_as)
                    break
                except RuntimeError as exc:
                    # Right after a crash (kill -9 of the postmaster) its backends may still hold
                    # the shared memory for a moment, or its pid file outlive it; the new server
                    # refuses to start until they are gone. Try again for a bounded time (and
                    # clear the pid file once no process of the cluster is left) rather than
                    # fail the restart.
                    said = str(exc)
                    leftover = _LEFTOVER[0] in said or all(m in said for m in _LEFTOVER[1:])
                    if not leftover or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
                    _clear_stale_pidfile(base_dir)
        except BaseException:
            self._release()
            raise
        if self.ephemeral:
            # testing.postgresql only deletes directories it created itself.
            self._pg._use_tmpdir = True
        self.database = database
        self.ensure_database(database)

    @staticmethod
    def _take(base_dir: str) -> IO[str]:
        """Lock ``base_dir`` for this process, or refuse: another process serves it, or the server
        a killed process started on it still runs (given :data:`STALE_SERVER_WAIT_S` to stop)."""
        lock = open(os.path.join(base_dir, LOCK_FILE), "a+")  # noqa: SIM115 (held for our life)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            lock.close()
            raise DataDirInUse(
                f"the data directory {base_dir} is in use by process {holder}; stop that one, or "
                "give this one another data directory (--data)"
            ) from None
        deadline = time.monotonic() + STALE_SERVER_WAIT_S
        while (pid := _running_server(base_dir)) is not None:
            if time.monotonic() > deadline:
                lock.close()
                raise DataDirInUse(
                    f"a PostgreSQL server (process {pid}) still runs on the data directory "
                    f"{base_dir}; stop it, or give this one another data directory (--data)"
                )
            time.sleep(0.1)
        _clear_stale_pidfile(base_dir)
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        return lock

    def _release(self) -> None:
        """Let go of the data directory's lock, or tell the watcher all is cleaned up."""
        if self._lock is not None:
            self._lock.close()  # closing the file releases the lock
            self._lock = None
        if self._janitor is not None:
            janitor, self._janitor = self._janitor, None
            assert janitor.stdin is not None
            with contextlib.suppress(OSError):
                if not os.path.exists(self.base_dir):
                    janitor.stdin.write(b"stopped\n")
                janitor.stdin.close()  # without "stopped": the watcher finishes the clean-up
            with contextlib.suppress(subprocess.TimeoutExpired):
                janitor.wait(timeout=30)

    @property
    def kind(self) -> str:
        """How this cluster keeps its data, in words (``mediator serve`` prints it)."""
        if self.ephemeral:
            return f"ephemeral, fsync off, deleted at exit: {self.base_dir}"
        return f"persistent and durable (fsync on): {self.base_dir}"

    @property
    def port(self) -> int:
        return int(self._pg.settings["port"])

    @property
    def socket_dir(self) -> str:
        return os.path.join(self.base_dir, "tmp")

    def dsn(self, database: str | None = None) -> str:
        """A libpq connection string over the unix socket."""
        db = database or self.database
        return f"host={self.socket_dir} port={self.port} user=postgres dbname={db}"

    def url(self, database: str | None = None) -> str:
        """The same address as a postgresql:// URL (the socket directory percent-encoded as the
        host, as libpq reads it), for tools that want one (psql, pgbench, notebooks); the database
        name is its last path segment, so ``url.rsplit("/", 1)[0]`` names the server."""
        host = quote(self.socket_dir, safe="")
        return f"postgresql://postgres@{host}:{self.port}/{database or self.database}"

    def ensure_database(self, database: str) -> None:
        """Create ``database`` on this cluster unless it exists."""
        import pg8000.native  # testing.postgresql's own driver; keeps psycopg in store/connector.py

        con = pg8000.native.Connection(
            "postgres", unix_sock=self._pg.dsn()["unix_sock"], database="postgres"
        )
        try:
            rows = con.run("SELECT 1 FROM pg_database WHERE datname = :d", d=database)
            if not rows:
                con.run(f'CREATE DATABASE "{database}"')
        finally:
            con.close()

    def stop(self) -> None:
        """Stop the server (SIGINT: fast shutdown); an ephemeral cluster's files are removed."""
        try:
            self._pg.stop()
        finally:
            self._release()

    def __enter__(self) -> EmbeddedPostgres:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

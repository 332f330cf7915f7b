"""The gateway's store on disk: one SQLite file in WAL mode, written by one thread in group commits.

Every row is an *event* of one session incarnation (``uid``, a fresh id each time a key is opened):
``m`` (a message or tool list, by digest: written once per session), ``call`` (a call's plan and its
replies), ``abort`` (tokens an engine sampled for a call nobody waits for), ``reward``, ``finish``. A
session's rows are deleted together when a reader acknowledges its finished episode. Each row carries a
CRC32 of its body: a row whose body does not match is named on start (the file and the row's ``seq``).

Writes go through :meth:`SqliteLog.submit`: rows are queued and committed at the event loop's next
turn, everything queued by then in one transaction (group commit: the calls that end in one turn of the
loop share a commit, on the loop's own thread: no thread hand-offs, no lock). A commit that fails (the
disk is full, the file unwritable) rolls back whole: every caller in that batch gets the error, and
nothing of the batch is in the file.

>>> import tempfile, os
>>> log = SqliteLog(os.path.join(tempfile.mkdtemp(), "s.db"))
>>> log.submit([("u1", "s1", "reward", b'{"value": 1.0}')])  # off an event loop: committed now
>>> [(uid, key, kind) for _, uid, key, kind, _ in log.load()]
[('u1', 's1', 'reward')]
>>> log.close()
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import zlib
from collections.abc import Iterable, Iterator

from ...errors import StoreCorruptError, StoreFullError

__all__ = ["SCHEMA", "SqliteLog"]

log = logging.getLogger("tmpl.gateway")

#: the schema's version, kept in the file's ``meta`` table (a file of another version is refused)
SCHEMA = 1

Row = tuple[str, str, str, bytes]  # uid, session key, kind, body


class SqliteLog:
    """An append-mostly log of session events in one SQLite file (see the module docstring).

    ``synchronous``: SQLite's ``synchronous`` pragma. ``NORMAL`` (default) in WAL mode keeps every
    committed transaction through a crash of the process (SIGKILL, OOM); ``FULL`` also through a power
    loss, at an fsync per commit.
    """

    def __init__(self, path: str, *, synchronous: str = "NORMAL") -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', not {synchronous!r}")
        self.path = os.path.abspath(path)
        folder = os.path.dirname(self.path)
        if not os.path.isdir(folder):
            raise StoreCorruptError(self.path, None, f"its folder {folder!r} does not exist")
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._check()
        except sqlite3.DatabaseError as exc:
            raise StoreCorruptError(self.path, None, f"SQLite cannot read it: {exc}") from exc
        self._queue: list[tuple[list[Row], asyncio.Future[None] | None]] = []
        self._scheduled = False  # a commit is due at the loop's next turn
        self._closing = False
        self._reader: sqlite3.Connection | None = None
        #: bytes the store's rows take (pages in use, updated at each commit; free pages are reused)
        self.used = 0
        #: commits made and rows written (how well calls were grouped: rows / commits)
        self.commits = 0
        self.rows = 0

    # -- opening ---------------------------------------------------------------------
    def _check(self) -> None:
        """Make the tables of a new file; refuse a file whose pages SQLite finds damaged or of another schema."""
        db = self._db
        db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        db.execute(
            "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, uid TEXT NOT NULL, "
            "key TEXT NOT NULL, kind TEXT NOT NULL, body BLOB NOT NULL, crc INTEGER NOT NULL)"
        )
        db.execute("CREATE INDEX IF NOT EXISTS events_uid ON events (uid)")
        found = db.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone()
        if found is None:
            db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
        elif found[0] != str(SCHEMA):
            raise StoreCorruptError(self.path, None, f"schema version {found[0]}, this tmpl reads {SCHEMA}")
        problems = [row[0] for row in db.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise StoreCorruptError(self.path, None, "SQLite's quick_check: " + "; ".join(problems[:5]))

    def load(self) -> Iterator[tuple[int, str, str, str, bytes]]:
        """Every event, oldest first: ``(seq, uid, key, kind, body)``; a row whose CRC does not match its
        body raises :class:`StoreCorruptError` naming the file and the row."""
        try:
            rows = self._db.execute("SELECT seq, uid, key, kind, body, crc FROM events ORDER BY seq").fetchall()
        except sqlite3.DatabaseError as exc:
            raise StoreCorruptError(self.path, None, f"SQLite cannot read its events: {exc}") from exc
        for seq, uid, key, kind, body, crc in rows:
            if zlib.crc32(body) != crc:
                raise StoreCorruptError(self.path, seq, f"the {kind!r} event of session {key!r} fails its CRC32")
            yield seq, uid, key, kind, body

    def size(self) -> int:
        """Bytes the store takes on disk: the file and its write-ahead log."""
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += os.path.getsize(self.path + suffix)
            except OSError:
                pass
        return total

    # -- writing ---------------------------------------------------------------------
    def submit(self, rows: Iterable[Row]) -> asyncio.Future[None] | None:
        """Queue ``rows`` for the next group commit. On an event loop: a future done once they are in the
        file (or holding the error that kept the whole batch out of it); the commit runs at the loop's
        next turn, with every write queued by then. Off a loop: committed now (raising on a failure)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if self._closing:
            raise StoreFullError(self.path, "the store is closed")
        if loop is None:
            self._commit([(list(rows), None)])
            return None
        done: asyncio.Future[None] = loop.create_future()
        self._queue.append((list(rows), done))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return done

    def send(self, rows: Iterable[Row]) -> None:
        """:meth:`submit` without waiting for the commit (a failure is logged, not raised)."""
        done = self.submit(rows)
        if done is not None:
            done.add_done_callback(_logged)

    def delete(self, uids: Iterable[str]) -> asyncio.Future[None] | None:
        """Delete every event of the session incarnations ``uids`` (in the next group commit)."""
        return self.submit([(uid, "", "-delete", b"") for uid in uids])

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._queue = self._queue, []
        if batch:
            self._commit(batch)

    def _commit(self, batch: list[tuple[list[Row], asyncio.Future[None] | None]]) -> None:
        db = self._db
        inserts = []
        deletes = []
        checkpoint = False
        for rows, _ in batch:
            for uid, key, kind, body in rows:
                if kind == "-delete":
                    deletes.append((uid,))
                elif kind == "-checkpoint":
                    checkpoint = True
                else:
                    inserts.append((uid, key, kind, body, zlib.crc32(body)))
        error: StoreFullError | None = None
        try:
            db.execute("BEGIN IMMEDIATE")
            if inserts:
                db.executemany("INSERT INTO events (uid, key, kind, body, crc) VALUES (?, ?, ?, ?, ?)", inserts)
            if deletes:
                db.executemany("DELETE FROM events WHERE uid = ?", deletes)
            db.execute("COMMIT")
            self.commits += 1
            self.rows += len(inserts)
            if checkpoint:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            pages, free, size = (
                db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count", "page_size")
            )
            self.used = (pages - free) * size
        except sqlite3.Error as exc:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            error = StoreFullError(self.path, f"the write failed and was rolled back whole: {exc}")
        for _, done in batch:
            if done is None:
                if error is not None:
                    raise error
            elif not done.done():
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)

    def checkpoint(self) -> None:
        """Move the write-ahead log into the file and truncate it (the store's size then counts rows only)."""
        self._flush()
        self._commit([([("", "", "-checkpoint", b"")], None)])

    def events_of(self, uid: str) -> list[tuple[int, str, str, str, bytes]]:
        """The events of one session incarnation, oldest first, read on a connection of their own."""
        if self._reader is None:
            self._reader = sqlite3.connect(self.path, check_same_thread=False)
        rows = self._reader.execute(
            "SELECT seq, uid, key, kind, body, crc FROM events WHERE uid = ? ORDER BY seq", (uid,)
        ).fetchall()
        for seq, _, key, kind, body, crc in rows:
            if zlib.crc32(body) != crc:
                raise StoreCorruptError(self.path, seq, f"the {kind!r} event of session {key!r} fails its CRC32")
        return [(seq, u, key, kind, body) for seq, u, key, kind, body, _ in rows]

    def close(self) -> None:
        """Commit what is queued, then close the file."""
        if self._closing:
            return
        try:
            self._flush()
        finally:
            self._closing = True
            self._db.close()
        if self._reader is not None:
            self._reader.close()


def _logged(done: asyncio.Future[None]) -> None:
    """A write nobody waited for: its failure logged."""
    if not done.cancelled() and done.exception() is not None:
        log.error("%s", done.exception())

"""SQLite ledger of GPU reservations: compare-and-swap writes so no GPU slot is booked twice.

Every write runs under ``BEGIN IMMEDIATE`` (one writer at a time across processes) and bumps a
version number. A reservation is accepted only if the ledger is still at the version the placer
decided on; otherwise the caller re-reads and decides again. Reservations carry an owner and a lease
expiry, so the GPUs of a crashed worker come back; releasing is idempotent. The caller passes the
time in: the ledger reads no clock.
"""

from __future__ import annotations

import json
import math
import operator
import os
import sqlite3
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from horus_airflow.errors import LedgerConflictError
from horus_airflow.placement.queue import Waiting
from horus_airflow.placement.state import Resident, Signature, crashed_pair
from horus_airflow.predictor.demand import Demand

Now = float | Callable[[], float]
"""A write's time: a number, or a clock the ledger reads once it holds the write lock, so that the times
it stamps order its rows as it committed them (a clock read before waiting for the lock could stamp a
write earlier than one that committed before it)."""


def _at(now: Now) -> float:
    return now() if callable(now) else now

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger_version (id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER NOT NULL,
    changes INTEGER NOT NULL DEFAULT 0);
INSERT OR IGNORE INTO ledger_version (id, version) VALUES (0, 0);
CREATE TABLE IF NOT EXISTS reservations (
    reservation_id TEXT NOT NULL,
    gpu_id TEXT NOT NULL,
    job_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    util REAL NOT NULL,
    util_p90 REAL NOT NULL,
    mem_mib REAL NOT NULL,
    created_at REAL NOT NULL,
    lease_expires_at REAL NOT NULL,
    released_at REAL,
    signature TEXT NOT NULL DEFAULT '',
    changed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (reservation_id, gpu_id)
);
CREATE INDEX IF NOT EXISTS reservations_active ON reservations (released_at, lease_expires_at);
CREATE TABLE IF NOT EXISTS crashed_pairs (
    signature_a TEXT NOT NULL,
    signature_b TEXT NOT NULL,
    recorded_at REAL NOT NULL,
    PRIMARY KEY (signature_a, signature_b)
);
CREATE TABLE IF NOT EXISTS decisions (
    reservation_id TEXT PRIMARY KEY,
    profile TEXT NOT NULL,
    reason TEXT NOT NULL,
    explanation TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS queue (
    entry_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    job_id TEXT NOT NULL,
    demand TEXT NOT NULL,
    profile TEXT NOT NULL,
    pool TEXT NOT NULL,
    enqueued_at REAL NOT NULL,
    lease_expires_at REAL NOT NULL,
    expected_runtime_s REAL,
    skips INTEGER NOT NULL DEFAULT 0,
    reason TEXT NOT NULL DEFAULT '',
    reservation_id TEXT,
    round TEXT,
    left_at REAL,
    priority INTEGER NOT NULL DEFAULT 0,
    changed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS queue_waiting ON queue (left_at, reservation_id, enqueued_at);
CREATE INDEX IF NOT EXISTS queue_reservation ON queue (reservation_id);
"""
_ACTIVE = (  # a booking made by a round ends, as expected, its runtime after it was booked
    "SELECT r.gpu_id, r.job_id, r.util, r.util_p90, r.mem_mib, r.signature, r.created_at + q.expected_runtime_s "
    "FROM reservations r LEFT JOIN queue q ON q.reservation_id = r.reservation_id "
    "WHERE r.released_at IS NULL AND r.lease_expires_at > ? ORDER BY r.created_at"
)
_BOOKED_ROWS = (
    "SELECT r.rowid, r.gpu_id, r.job_id, r.util, r.util_p90, r.mem_mib, r.signature, r.created_at + q.expected_runtime_s, "
    "r.created_at, r.lease_expires_at, r.released_at FROM reservations r LEFT JOIN queue q ON q.reservation_id = r.reservation_id "
)
_LIVE_ROWS = _BOOKED_ROWS + "WHERE r.released_at IS NULL AND r.lease_expires_at > ?"
_CHANGED_ROWS = _BOOKED_ROWS + "WHERE r.changed > ?"


@dataclass(frozen=True)
class Booking:
    """One GPU slot a reservation asks for, with the demand it is placed with."""

    gpu_id: str
    util: float
    util_p90: float
    mem_mib: float
    signature: tuple[float, ...] = ()


@dataclass(frozen=True)
class DecisionNote:
    """Why a reservation was made, journaled beside it so the UI can explain placements later:
    ``explanation`` is the decision's JSON (chosen GPUs and the next best candidates)."""

    profile: str
    reason: str
    explanation: str


@dataclass(frozen=True)
class JournalEntry:
    """One reservation as the ledger remembers it, live or long released."""

    reservation_id: str
    job_id: str
    owner: str
    created_at: float
    lease_expires_at: float
    released_at: float | None
    bookings: tuple[Booking, ...]
    note: DecisionNote | None

    def status(self, now: float) -> str:
        if self.released_at is not None:
            return "released"
        return "live" if self.lease_expires_at > now else "expired"


@dataclass(frozen=True)
class Reservation:
    reservation_id: str
    job_id: str
    owner: str
    gpu_ids: tuple[str, ...]
    lease_expires_at: float


@dataclass(frozen=True)
class QueueEntry:
    """A task waiting for GPUs: its demand, the profile it is placed with, its credit ``pool`` and its
    ``priority`` (higher goes first in every queue policy). ``reason`` says why the last round left it waiting; ``reservation_id`` is set once a round booked it
    (``round`` names that round); ``left_at`` once it left the queue, booked and taken or given up."""

    entry_id: str
    owner: str
    demand: Demand
    profile: str
    pool: str
    enqueued_at: float
    lease_expires_at: float
    expected_runtime_s: float | None = None
    skips: int = 0
    reason: str = ""
    reservation_id: str | None = None
    round: str | None = None
    left_at: float | None = None
    priority: int = 0

    def to_json(self) -> str:
        """The entry as a ledger that keeps JSON stores it (the Kubernetes backend's ConfigMap)."""
        return json.dumps({**asdict(self), "demand": self.demand.to_dict()}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> QueueEntry:
        raw = json.loads(text)
        return cls(**{**raw, "demand": Demand.from_dict(raw["demand"])})

    def waiting(self, now: float) -> Waiting:
        """The entry as the queue policies see it."""
        return Waiting(self.demand, self.enqueued_at, now - self.enqueued_at, self.skips, self.expected_runtime_s, self.pool,
                       self.priority)

    def status(self, now: float) -> str:
        if self.reservation_id is not None:
            return "booked"
        if self.left_at is not None:
            return "left"
        return "waiting" if self.lease_expires_at > now else "expired"


@dataclass(frozen=True)
class RoundBooking:
    """What a scheduling round books for one queued entry."""

    entry_id: str
    bookings: tuple[Booking, ...]
    note: DecisionNote


@dataclass(frozen=True)
class BookedRow:
    """One GPU slot of a reservation as the ledger holds it, with the resident it puts on the GPU."""

    rowid: int
    gpu_id: str
    resident: Resident
    created_at: float
    lease_expires_at: float
    released_at: float | None

    def live(self, now: float) -> bool:
        return self.released_at is None and self.lease_expires_at > now


@dataclass(frozen=True)
class BookedRows:
    """What :meth:`SqliteLedger.bookings_since` read: the rows written since a change count (``full``:
    every live row instead), at ledger ``version`` and change count ``change``."""

    version: int
    change: int
    full: bool
    rows: tuple[BookedRow, ...]


class LiveBookings:
    """The live bookings of a ledger as one process last read them, kept current by reading only the
    rows written since: a round on thousands of GPUs would otherwise read and rebuild every booking each
    time, and most of its time went there. A lease that runs out changes no row, so the earliest lease
    is remembered and, once the clock passes it, every row is checked again."""

    def __init__(self) -> None:
        self.change: int | None = None
        self._by_gpu: dict[str, dict[int, BookedRow]] = {}
        self._earliest_expiry = math.inf

    def update(self, read: BookedRows, now: float) -> set[str]:
        """Apply what the ledger returned; the GPUs whose residents may have changed."""
        touched: set[str] = set()
        if read.full:
            touched.update(self._by_gpu)
            self._by_gpu, self._earliest_expiry = {}, math.inf
        for row in read.rows:
            on_gpu = self._by_gpu.setdefault(row.gpu_id, {})
            if row.live(now):
                on_gpu[row.rowid] = row
                self._earliest_expiry = min(self._earliest_expiry, row.lease_expires_at)
            else:
                on_gpu.pop(row.rowid, None)
            touched.add(row.gpu_id)
        if now >= self._earliest_expiry:
            touched.update(self._drop_expired(now))
        self.change = read.change
        return touched

    def residents(self, gpu_id: str) -> tuple[Resident, ...]:
        """The GPU's residents in booking order, as :meth:`SqliteLedger.active` lists them."""
        rows = sorted(self._by_gpu.get(gpu_id, {}).values(), key=lambda r: (r.created_at, r.rowid))
        return tuple(r.resident for r in rows)

    def _drop_expired(self, now: float) -> set[str]:
        expired_on: set[str] = set()
        self._earliest_expiry = math.inf
        for gpu_id, on_gpu in self._by_gpu.items():
            for rowid in [rowid for rowid, row in on_gpu.items() if not row.live(now)]:
                del on_gpu[rowid]
                expired_on.add(gpu_id)
            self._earliest_expiry = min([self._earliest_expiry, *(r.lease_expires_at for r in on_gpu.values())])
        return expired_on


_QUEUE_COLUMNS = ("entry_id, owner, demand, profile, pool, enqueued_at, lease_expires_at, expected_runtime_s, skips, "
                  "reason, reservation_id, round, left_at, priority")
_WAITING_WHERE = "WHERE left_at IS NULL AND reservation_id IS NULL AND lease_expires_at > ? ORDER BY enqueued_at, entry_id"
_WAITING = f"SELECT {_QUEUE_COLUMNS} FROM queue {_WAITING_WHERE}"
_BUT_DEMAND = _QUEUE_COLUMNS.replace(" demand,", "")  # a demand never changes: a long-lived read reads each once
_WAITING_BUT_DEMAND = f"SELECT {_BUT_DEMAND} FROM queue {_WAITING_WHERE}"
_CHANGED_BUT_DEMAND = f"SELECT {_BUT_DEMAND} FROM queue WHERE changed > ?"
_RESERVATION, _LEFT = (_BUT_DEMAND.split(", ").index(column) for column in ("reservation_id", "left_at"))
_QUEUE_ORDER = operator.attrgetter("enqueued_at", "entry_id")
_INHERITED: list[sqlite3.Connection] = []
"""Connections a process got from its parent without the fork hook below, kept so this process never
closes them: closing one would drop every POSIX lock this process holds on the ledger's files, its new
connection's included."""


@dataclass(eq=False)
class _Kept:
    """A thread's connection to a ledger file, kept between calls."""

    conn: sqlite3.Connection
    pid: int
    inode: tuple[int, int] | None
    in_use: int = 0  # calls of the owning thread inside it now
    closed: bool = False


_KEPT: weakref.WeakSet[_Kept] = weakref.WeakSet()
_KEPT_LOCK = threading.Lock()


def _close_idle_before_fork() -> None:
    """A child must not start with SQLite's state for a connection of its parent: it would believe it holds
    the parent's locks, take none of its own, and the parent's last close would delete the WAL under it.
    Connections in use at the fork stay (the child sets them aside); the others are reopened when next used."""
    _KEPT_LOCK.acquire()
    for kept in list(_KEPT):
        if not kept.in_use and not kept.closed:
            kept.conn.close()
            kept.closed = True


os.register_at_fork(before=_close_idle_before_fork, after_in_parent=_KEPT_LOCK.release,
                    after_in_child=_KEPT_LOCK.release)

_EXPIRED_KEPT_S = 3600.0  # how long a long-lived read keeps an entry whose lease ran out
_IN_CHUNK = 500  # ids per IN (...) query, under SQLite's bound on parameters


class SqliteLedger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._waiting: dict[str, QueueEntry] = {}  # the entries queued and not left or booked, as last read
        self._queue_change: int | None = None  # the change count of that read
        self._opened = threading.local()  # each thread's _Kept connection
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connection() as conn:
            conn.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
            conn.execute("BEGIN IMMEDIATE")  # one process migrates; the others then see the columns
            _add_missing_columns(conn)
            conn.execute("CREATE INDEX IF NOT EXISTS reservations_changed ON reservations (changed)")
            conn.execute("CREATE INDEX IF NOT EXISTS queue_changed ON queue (changed)")
            conn.execute("COMMIT")

    def active(self, now: float) -> tuple[int, dict[str, list[Resident]]]:
        """The ledger version and the live residents of every GPU (expired leases do not count)."""
        with self._connection() as conn:
            return _active(conn, now)

    def bookings_since(self, change: int | None, now: float) -> BookedRows:
        """The ledger version and every booking row written after ``change`` (its change count from an
        earlier read), released or not; with no ``change``, or one this ledger never reached (the file
        was replaced), the live rows: what :class:`LiveBookings` needs to stay current cheaply."""
        with self._connection() as conn:
            conn.execute("BEGIN")
            version, changes = conn.execute("SELECT version, changes FROM ledger_version").fetchone()
            full = change is None or change > changes
            rows = conn.execute(_LIVE_ROWS if full else _CHANGED_ROWS, (now,) if full else (change,)).fetchall()
            conn.execute("COMMIT")
        return BookedRows(int(version), int(changes), full, tuple(_booked_row(row) for row in rows))

    def reserve(
        self, expected_version: int, job_id: str, owner: str, bookings: list[Booking], now: Now, lease_s: float,
        note: DecisionNote | None = None,
    ) -> Reservation:
        """Book every slot or none, journaling ``note`` with them; raise LedgerConflictError if anyone
        wrote since ``expected_version``."""
        with self._write() as conn:
            now = _at(now)
            _check_version(conn, expected_version)
            reservation = _insert_reservation(conn, job_id, owner, bookings, now, now + lease_s, note)
            conn.execute("UPDATE ledger_version SET version = version + 1")
        return reservation

    def enqueue(self, owner: str, demand: Demand, profile: str, pool: str, now: Now, lease_s: float,
                expected_runtime_s: float | None = None, priority: int = 0) -> QueueEntry:
        """Queue ``owner``'s demand; an entry an earlier try of the owner left waiting leaves the queue.
        Bumps the version, so a round decided without this entry decides again."""
        with self._write() as conn:
            now = _at(now)
            entry = QueueEntry(uuid.uuid4().hex, owner, demand, profile, pool, now, now + lease_s, expected_runtime_s,
                               priority=priority)
            change = _next_change(conn)
            conn.execute("UPDATE queue SET left_at = ?, reason = 'replaced by a later try', changed = ? "
                         "WHERE owner = ? AND left_at IS NULL AND reservation_id IS NULL", (now, change, owner))
            conn.execute(f"INSERT INTO queue (job_id, changed, {_QUEUE_COLUMNS}) VALUES ({', '.join('?' * 16)})",
                         (demand.job_id, change, entry.entry_id, owner, json.dumps(demand.to_dict()), profile, pool, now,
                          entry.lease_expires_at, expected_runtime_s, 0, "", None, None, None, priority))
            conn.execute("UPDATE ledger_version SET version = version + 1")
        return entry

    def queue(self, now: float) -> tuple[int, list[QueueEntry]]:
        """The ledger version and the entries waiting now (unbooked, not left, lease live), oldest first.
        The ledger keeps the entries it read and, after the first read, reads only the rows written
        since (every queue write stamps its rows with the change count), and each demand once."""
        with self._connection() as conn:
            conn.execute("BEGIN")
            version, changes = conn.execute("SELECT version, changes FROM ledger_version").fetchone()
            full = self._queue_change is None or self._queue_change > changes  # a count never reached: a new file
            rows = conn.execute(_WAITING_BUT_DEMAND if full else _CHANGED_BUT_DEMAND,
                                (now,) if full else (self._queue_change,)).fetchall()
            if full:
                self._waiting = {}
            waiting = [row for row in rows if row[_RESERVATION] is None and row[_LEFT] is None]
            demands = {str(row[0]): self._waiting[str(row[0])].demand for row in waiting if str(row[0]) in self._waiting}
            unseen = [str(row[0]) for row in waiting if str(row[0]) not in demands]
            for start in range(0, len(unseen), _IN_CHUNK):
                chunk = unseen[start:start + _IN_CHUNK]
                for entry_id, demand in conn.execute(
                        f"SELECT entry_id, demand FROM queue WHERE entry_id IN ({', '.join('?' * len(chunk))})", chunk):
                    demands[str(entry_id)] = Demand.from_dict(json.loads(str(demand)))
            conn.execute("COMMIT")
        self._queue_change = int(changes)
        for row in rows:  # booked or left: out; still waiting: as written now
            self._waiting.pop(str(row[0]), None)
        self._waiting.update((str(row[0]), _queue_entry(row, demands[str(row[0])])) for row in waiting)
        for entry_id in [e.entry_id for e in self._waiting.values() if e.lease_expires_at < now - _EXPIRED_KEPT_S]:
            del self._waiting[entry_id]  # long dead: no write can bring it back (a renewal needs a live lease)
        live = [e for e in self._waiting.values() if e.lease_expires_at > now]
        return int(version), sorted(live, key=_QUEUE_ORDER)

    def queue_entry(self, entry_id: str) -> QueueEntry | None:
        with self._connection() as conn:
            row = conn.execute(f"SELECT {_QUEUE_COLUMNS} FROM queue WHERE entry_id = ?", (entry_id,)).fetchone()
        return _entry(row) if row else None

    def book_round(self, expected_version: int, round_id: str, bookings: list[RoundBooking], held: dict[str, str],
                   skips: dict[str, int], now: Now, lease_s: float) -> list[Reservation]:
        """Book every entry a round chose, and note why the others wait, in one compare-and-swap: raise
        LedgerConflictError if anyone wrote since ``expected_version`` (the round is then run again)."""
        with self._write() as conn:
            now = _at(now)
            _check_version(conn, expected_version)
            reservations = []
            change = _next_change(conn)
            for chosen in bookings:
                entry = _entry(conn.execute(f"SELECT {_QUEUE_COLUMNS} FROM queue WHERE entry_id = ?",
                                            (chosen.entry_id,)).fetchone())
                reservation = _insert_reservation(conn, entry.demand.job_id, entry.owner, list(chosen.bookings), now,
                                                  now + lease_s, chosen.note)
                conn.execute("UPDATE queue SET reservation_id = ?, round = ?, reason = ?, changed = ? WHERE entry_id = ?",
                             (reservation.reservation_id, round_id, chosen.note.reason, change, chosen.entry_id))
                reservations.append(reservation)
            conn.executemany("UPDATE queue SET reason = ?, skips = ?, changed = ? WHERE entry_id = ?",
                             [(reason, skips.get(entry_id, 0), change, entry_id) for entry_id, reason in held.items()])
            if reservations:
                conn.execute("UPDATE ledger_version SET version = version + 1")
        return reservations

    def waits(self, now: float, since: float) -> dict[str, list[float]]:
        """Seconds each pool's entries queued since ``since`` waited: until booked, or until now for
        those still waiting (entries that gave up are left out)."""
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT q.pool, q.enqueued_at, r.created_at FROM queue q LEFT JOIN "
                "(SELECT reservation_id, MIN(created_at) AS created_at FROM reservations GROUP BY reservation_id) r "
                "USING (reservation_id) WHERE q.enqueued_at > ? AND (q.reservation_id IS NOT NULL OR "
                "(q.left_at IS NULL AND q.lease_expires_at > ?))", (since, now)).fetchall()
        waits: dict[str, list[float]] = {}
        for pool, enqueued, booked in rows:
            waits.setdefault(str(pool), []).append((now if booked is None else float(booked)) - float(enqueued))
        return waits

    def reservation(self, reservation_id: str) -> Reservation | None:
        with self._connection() as conn:
            rows = conn.execute("SELECT job_id, owner, gpu_id, lease_expires_at FROM reservations WHERE reservation_id = ? "
                                "ORDER BY rowid", (reservation_id,)).fetchall()
        if not rows:
            return None
        return Reservation(reservation_id, rows[0][0], rows[0][1], tuple(r[2] for r in rows), float(rows[0][3]))

    def renew_entry(self, entry_id: str, now: Now, lease_s: float) -> bool:
        """Keep a waiting entry alive; False if it was booked, left or had expired."""
        with self._write() as conn:
            now = _at(now)
            cursor = conn.execute("UPDATE queue SET lease_expires_at = ?, changed = ? WHERE entry_id = ? AND left_at IS NULL "
                                  "AND reservation_id IS NULL AND lease_expires_at > ?",
                                  (now + lease_s, _next_change(conn), entry_id, now))
            return cursor.rowcount > 0

    def take(self, entry_id: str, now: Now) -> None:
        """The entry's task has its booking: it leaves the queue (idempotent)."""
        with self._write() as conn:
            now = _at(now)
            conn.execute("UPDATE queue SET left_at = ?, changed = ? WHERE entry_id = ? AND left_at IS NULL",
                         (now, _next_change(conn), entry_id))

    def leave(self, entry_id: str, now: Now, reason: str) -> bool:
        """The entry's task gives up (killed, cleared, timed out): it leaves the queue, and a booking a
        round made for it that it never took is released. True if this call changed anything."""
        with self._write() as conn:
            now = _at(now)
            row = conn.execute("SELECT reservation_id FROM queue WHERE entry_id = ? AND left_at IS NULL",
                               (entry_id,)).fetchone()
            if row is None:
                return False
            conn.execute("UPDATE queue SET left_at = ?, reason = ?, changed = ? WHERE entry_id = ?",
                         (now, reason, _next_change(conn), entry_id))
            if row[0] is not None:
                conn.execute("UPDATE reservations SET released_at = ?, changed = ? WHERE reservation_id = ? "
                             "AND released_at IS NULL", (now, _next_change(conn), row[0]))
            conn.execute("UPDATE ledger_version SET version = version + 1")
            return True

    def renew(self, reservation_id: str, now: Now, lease_s: float) -> bool:
        """Extend a live lease; False if it was released or had already expired."""
        with self._write() as conn:
            now = _at(now)
            cursor = conn.execute(
                "UPDATE reservations SET lease_expires_at = ?, changed = ? "
                "WHERE reservation_id = ? AND released_at IS NULL AND lease_expires_at > ?",
                (now + lease_s, _next_change(conn), reservation_id, now),
            )
            return cursor.rowcount > 0

    def release(self, reservation_id: str, now: Now) -> bool:
        """Idempotent: True the first time, False when there was nothing left to release."""
        with self._write() as conn:
            now = _at(now)
            cursor = conn.execute(
                "UPDATE reservations SET released_at = ?, changed = ? WHERE reservation_id = ? AND released_at IS NULL",
                (now, _next_change(conn), reservation_id),
            )
            if cursor.rowcount:
                conn.execute("UPDATE ledger_version SET version = version + 1")
            return cursor.rowcount > 0

    def release_owner(self, owner: str, now: Now) -> list[str]:
        """Release every reservation ``owner`` still holds; returns their ids (none: an empty list)."""
        with self._write() as conn:
            now = _at(now)
            held = [row[0] for row in conn.execute(
                "SELECT DISTINCT reservation_id FROM reservations WHERE owner = ? AND released_at IS NULL", (owner,))]
            if held:
                conn.execute("UPDATE reservations SET released_at = ?, changed = ? WHERE owner = ? AND released_at IS NULL",
                             (now, _next_change(conn), owner))
                conn.execute("UPDATE ledger_version SET version = version + 1")
            return held

    def record_crashed_pairs(self, pairs: set[tuple[Signature, Signature]], now: float) -> int:
        """Remember that these pairs of job signatures crashed out of memory on one GPU, so the
        ``oom-anti-affinity`` filter keeps them apart from now on; returns how many were new. Bumps the
        version: a placer that decided without them decides again."""
        rows = [(_text(a), _text(b), now) for a, b in (crashed_pair(*pair) for pair in pairs) if a and b]
        if not rows:
            return 0
        with self._write() as conn:
            before = conn.total_changes
            conn.executemany("INSERT OR IGNORE INTO crashed_pairs (signature_a, signature_b, recorded_at) VALUES (?, ?, ?)", rows)
            added = conn.total_changes - before
            if added:
                conn.execute("UPDATE ledger_version SET version = version + 1")
            return added

    def crashed_pairs(self) -> frozenset[tuple[Signature, Signature]]:
        with self._connection() as conn:
            rows = conn.execute("SELECT signature_a, signature_b FROM crashed_pairs").fetchall()
        return frozenset((_signature(a), _signature(b)) for a, b in rows)

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, opened once and kept: closing the last connection to a WAL database
        checkpoints it, and a round's booking took twice as long with a connection per call. A connection is
        never used across a fork (SQLite forbids it: see ``_close_idle_before_fork``) or on a file that
        replaced the ledger (it would keep writing to the old one), and a transaction an error left open
        is rolled back."""
        kept: _Kept | None = getattr(self._opened, "kept", None)
        where = os.getpid(), _inode(self.path)
        if kept is None or (kept.pid, kept.inode) != where:
            if kept is not None and kept.pid != where[0]:
                _INHERITED.append(kept.conn)
            elif kept is not None:
                kept.conn.close()
            kept = self._opened.kept = _Kept(_connect(self.path), *where)
            with _KEPT_LOCK:
                _KEPT.add(kept)
        with _KEPT_LOCK:  # in use, a fork leaves it open
            reopen, kept.in_use = kept.closed, kept.in_use + 1
        try:
            if reopen:  # a fork closed it
                kept.conn, kept.closed = _connect(self.path), False
            yield kept.conn
        except BaseException:
            if not kept.closed and kept.conn.in_transaction:
                kept.conn.execute("ROLLBACK")
            raise
        finally:
            kept.in_use -= 1

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._connection() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")


class LedgerReader:
    """The ledger opened read-only (SQLite ``mode=ro``): what the UI reads. It never creates the file,
    migrates it or takes a write lock, so viewing cannot change a placement."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def exists(self) -> bool:
        return self.path.is_file()

    def active(self, now: float) -> tuple[int, dict[str, list[Resident]]]:
        """As :meth:`SqliteLedger.active`; an absent ledger is empty at version 0."""
        if not self.exists:
            return 0, {}
        with closing(self._connect()) as conn:
            return _active(conn, now)

    def journal(self, limit: int, before: float | None = None, owner_prefix: str = "") -> list[JournalEntry]:
        """The ``limit`` most recent reservations (made before ``before``, by owners starting with
        ``owner_prefix``, when given), newest first."""
        return self._entries("created_at < ? AND substr(owner, 1, ?) = ?",
                             (math.inf if before is None else before, len(owner_prefix), owner_prefix), limit)

    def live(self, now: float) -> list[JournalEntry]:
        """The reservations holding GPUs now, newest first."""
        return self._entries("released_at IS NULL AND lease_expires_at > ?", (now,), -1)

    def entry(self, reservation_id: str) -> JournalEntry | None:
        found = self._entries("reservation_id = ?", (reservation_id,), 1)
        return found[0] if found else None

    def queue(self, now: float) -> list[QueueEntry]:
        """The entries waiting now, oldest first (none in a ledger written before the queue existed; priority
        0 in one written before priorities)."""
        if not self.exists:
            return []
        with closing(self._connect()) as conn:
            columns = {row[1] for row in conn.execute("PRAGMA table_info(queue)")}
            if not columns:
                return []
            rows = conn.execute(_WAITING if "priority" in columns else _WAITING.replace(", priority", ", 0"), (now,)).fetchall()
        return [_entry(row) for row in rows]

    def _entries(self, where: str, params: tuple[object, ...], limit: int) -> list[JournalEntry]:
        if not self.exists:
            return []
        with closing(self._connect()) as conn:
            journaled = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'decisions'").fetchone()
            # a ledger no worker has opened since decisions were journaled has no such table
            note_columns = "d.profile, d.reason, d.explanation" if journaled else "NULL, NULL, NULL"
            join = "LEFT JOIN decisions d USING (reservation_id)" if journaled else ""
            rows = conn.execute(
                f"""WITH chosen AS (
                        SELECT reservation_id, MIN(created_at) AS created_at FROM reservations
                        WHERE {where} GROUP BY reservation_id ORDER BY created_at DESC LIMIT ?)
                    SELECT r.reservation_id, r.job_id, r.owner, r.created_at, r.lease_expires_at, r.released_at,
                           r.gpu_id, r.util, r.util_p90, r.mem_mib, {note_columns}
                    FROM chosen JOIN reservations r USING (reservation_id) {join}
                    ORDER BY r.created_at DESC, r.reservation_id, r.rowid""",
                (*params, limit),
            ).fetchall()
        entries: dict[str, JournalEntry] = {}
        for rid, job, owner, created, expires, released, gpu, util, p90, mem, profile, reason, explanation in rows:
            booking = Booking(gpu, util, p90, mem)
            if rid in entries:
                entries[rid] = replace(entries[rid], bookings=(*entries[rid].bookings, booking))
                continue
            note = DecisionNote(profile, reason, explanation) if profile is not None else None
            entries[rid] = JournalEntry(rid, job, owner, created, expires, released, (booking,), note)
        return list(entries.values())

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=5000")
        return conn


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)  # a fork closes it
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def _inode(path: Path) -> tuple[int, int] | None:
    """Which file the path names now. An open connection keeps its file's inode in use, so a file that
    replaced it has another."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


def _active(conn: sqlite3.Connection, now: float) -> tuple[int, dict[str, list[Resident]]]:
    conn.execute("BEGIN")
    version = conn.execute("SELECT version FROM ledger_version").fetchone()[0]
    rows = conn.execute(_ACTIVE, (now,)).fetchall()
    conn.execute("COMMIT")
    residents: dict[str, list[Resident]] = {}
    for gpu_id, job_id, util, util_p90, mem, signature, ends_at in rows:
        residents.setdefault(gpu_id, []).append(Resident(job_id, util, util_p90, mem, _signature(signature), ends_at))
    return version, residents


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    """Columns a ledger written by an earlier release lacks: interference signatures, change counts,
    queue priorities."""
    for table, column, kind in (("reservations", "signature", "TEXT NOT NULL DEFAULT ''"),
                                ("reservations", "changed", "INTEGER NOT NULL DEFAULT 0"),
                                ("queue", "priority", "INTEGER NOT NULL DEFAULT 0"),
                                ("queue", "changed", "INTEGER NOT NULL DEFAULT 0"),
                                ("ledger_version", "changes", "INTEGER NOT NULL DEFAULT 0")):
        if column not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def _next_change(conn: sqlite3.Connection) -> int:
    """Count one more write to the reservations or the queue, for the rows this write stamps: readers
    then read only the rows stamped after their last read (:meth:`SqliteLedger.bookings_since`,
    :meth:`SqliteLedger.queue`)."""
    conn.execute("UPDATE ledger_version SET changes = changes + 1")
    return int(conn.execute("SELECT changes FROM ledger_version").fetchone()[0])


def _booked_row(row: tuple[object, ...]) -> BookedRow:
    rowid, gpu_id, job_id, util, util_p90, mem, signature, ends_at, created, expires, released = row
    resident = Resident(str(job_id), float(util), float(util_p90), float(mem), _signature(str(signature)),
                        None if ends_at is None else float(ends_at))
    return BookedRow(int(rowid), str(gpu_id), resident, float(created), float(expires),
                     None if released is None else float(released))


def _check_version(conn: sqlite3.Connection, expected_version: int) -> None:
    version = conn.execute("SELECT version FROM ledger_version").fetchone()[0]
    if version != expected_version:
        raise LedgerConflictError(f"ledger at version {version}, decision made at {expected_version}")


def _insert_reservation(conn: sqlite3.Connection, job_id: str, owner: str, bookings: list[Booking], now: float,
                        expires: float, note: DecisionNote | None) -> Reservation:
    reservation_id, change = uuid.uuid4().hex, _next_change(conn)
    conn.executemany(
        "INSERT INTO reservations (reservation_id, gpu_id, job_id, owner, util, util_p90, mem_mib, created_at, "
        "lease_expires_at, signature, changed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(reservation_id, b.gpu_id, job_id, owner, b.util, b.util_p90, b.mem_mib, now, expires, _text(b.signature), change)
         for b in bookings],
    )
    if note is not None:
        conn.execute("INSERT INTO decisions (reservation_id, profile, reason, explanation) VALUES (?, ?, ?, ?)",
                     (reservation_id, note.profile, note.reason, note.explanation))
    return Reservation(reservation_id, job_id, owner, tuple(b.gpu_id for b in bookings), expires)


def _entry(row: tuple[object, ...]) -> QueueEntry:
    """A queue row (``_QUEUE_COLUMNS``) as an entry."""
    return _queue_entry(row[:2] + row[3:], Demand.from_dict(json.loads(str(row[2]))))


def _queue_entry(columns: tuple[object, ...], demand: Demand) -> QueueEntry:
    """An entry from its queue columns but the demand, and the demand (parsed once by whoever keeps it)."""
    entry_id, owner, profile, pool, enqueued, expires, runtime, skips, reason, reservation_id, round_id, left_at, priority = columns
    return QueueEntry(str(entry_id), str(owner), demand, str(profile), str(pool),
                      float(enqueued), float(expires), None if runtime is None else float(runtime), int(skips),
                      str(reason), None if reservation_id is None else str(reservation_id),
                      None if round_id is None else str(round_id), None if left_at is None else float(left_at), int(priority))


def _text(signature: Signature) -> str:
    """A signature as stored: its numbers' reprs, comma-separated, so it reads back exactly."""
    return ",".join(repr(x) for x in signature)


def _signature(text: str) -> Signature:
    return tuple(float(x) for x in text.split(",")) if text else ()

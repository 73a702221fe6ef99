"""SQLite ledger of GPU reservations: compare-and-swap writes so no GPU slot is booked twice.

Every write runs under ``BEGIN IMMEDIATE`` (one writer at a time across processes) and bumps a
version number. A reservation is accepted only if the ledger is still at the version the placer
decided on; otherwise the caller re-reads and decides again. Reservations carry an owner and a lease
expiry, so the GPUs of a crashed worker come back; releasing is idempotent. The caller passes the
time in: the ledger reads no clock.
"""

from __future__ import annotations

import sqlite3
import uuid
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from horus_airflow.errors import LedgerConflictError
from horus_airflow.placement.state import Resident

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger_version (id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER NOT NULL);
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
    PRIMARY KEY (reservation_id, gpu_id)
);
CREATE INDEX IF NOT EXISTS reservations_active ON reservations (released_at, lease_expires_at);
"""


@dataclass(frozen=True)
class Booking:
    """One GPU slot a reservation asks for, with the demand it is placed with."""

    gpu_id: str
    util: float
    util_p90: float
    mem_mib: float
    signature: tuple[float, ...] = ()


@dataclass(frozen=True)
class Reservation:
    reservation_id: str
    job_id: str
    owner: str
    gpu_ids: tuple[str, ...]
    lease_expires_at: float


class SqliteLedger:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as conn:
            conn.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
            columns = {row[1] for row in conn.execute("PRAGMA table_info(reservations)")}
            if "signature" not in columns:  # a ledger written before interference signatures existed
                conn.execute("ALTER TABLE reservations ADD COLUMN signature TEXT NOT NULL DEFAULT ''")

    def active(self, now: float) -> tuple[int, dict[str, list[Resident]]]:
        """The ledger version and the live residents of every GPU (expired leases do not count)."""
        with closing(self._connect()) as conn:
            conn.execute("BEGIN")
            version = conn.execute("SELECT version FROM ledger_version").fetchone()[0]
            rows = conn.execute(
                "SELECT gpu_id, job_id, util, util_p90, mem_mib, signature FROM reservations "
                "WHERE released_at IS NULL AND lease_expires_at > ? ORDER BY created_at",
                (now,),
            ).fetchall()
            conn.execute("COMMIT")
        residents: dict[str, list[Resident]] = {}
        for gpu_id, job_id, util, util_p90, mem, signature in rows:
            values = tuple(float(x) for x in signature.split(",")) if signature else ()
            residents.setdefault(gpu_id, []).append(Resident(job_id, util, util_p90, mem, values))
        return version, residents

    def reserve(
        self, expected_version: int, job_id: str, owner: str, bookings: list[Booking], now: float, lease_s: float
    ) -> Reservation:
        """Book every slot or none; raise LedgerConflictError if anyone wrote since ``expected_version``."""
        reservation_id = uuid.uuid4().hex
        expires = now + lease_s
        with self._write() as conn:
            version = conn.execute("SELECT version FROM ledger_version").fetchone()[0]
            if version != expected_version:
                raise LedgerConflictError(f"ledger at version {version}, decision made at {expected_version}")
            conn.executemany(
                "INSERT INTO reservations (reservation_id, gpu_id, job_id, owner, util, util_p90, mem_mib, created_at, "
                "lease_expires_at, signature) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (reservation_id, b.gpu_id, job_id, owner, b.util, b.util_p90, b.mem_mib, now, expires,
                     ",".join(repr(x) for x in b.signature))
                    for b in bookings
                ],
            )
            conn.execute("UPDATE ledger_version SET version = version + 1")
        return Reservation(reservation_id, job_id, owner, tuple(b.gpu_id for b in bookings), expires)

    def renew(self, reservation_id: str, now: float, lease_s: float) -> bool:
        """Extend a live lease; False if it was released or had already expired."""
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE reservations SET lease_expires_at = ? "
                "WHERE reservation_id = ? AND released_at IS NULL AND lease_expires_at > ?",
                (now + lease_s, reservation_id, now),
            )
            return cursor.rowcount > 0

    def release(self, reservation_id: str, now: float) -> bool:
        """Idempotent: True the first time, False when there was nothing left to release."""
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE reservations SET released_at = ? WHERE reservation_id = ? AND released_at IS NULL",
                (now, reservation_id),
            )
            if cursor.rowcount:
                conn.execute("UPDATE ledger_version SET version = version + 1")
            return cursor.rowcount > 0

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with closing(self._connect()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

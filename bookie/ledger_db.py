"""On-disk database of a bookie's ledger storage: SQLite schema, migration,
the group-commit transaction, incremental vacuum, and the queries of the
write connection.

BookKeeper concepts: this is the bookie's *LedgerStorage* proper (entry log
plus ledger index; here one SQLite database, ``<data dir>/ledgers.db``, WAL
mode): table ``entries`` ((ledger id, entry id) -> payload and CRC32C, a
WITHOUT ROWID b-tree in id order), table ``ledgers`` (the per-ledger records
of :mod:`bookie.ledger_records`) and table ``bookie_instance`` (the cookie's
instance id, see :mod:`bookie.cookie`). The journal (:mod:`bookie.journal`)
writes it in group commits; :class:`bookie.storage.LedgerStorage` opens it and
serves reads from a second, read-only connection.

Space of deleted ledgers (vacuum policy): new databases use
``auto_vacuum=INCREMENTAL`` (an older database is converted by one VACUUM at
open, :func:`migrate`). Pages freed by a delete are reused by later adds at
once; after a delete, the journal thread also runs ``PRAGMA
incremental_vacuum`` in steps of ``VACUUM_STEP_PAGES`` (4 MiB,
:func:`vacuum_step`), one step at a time between group commits, until the
free list is empty, then checkpoints the WAL, which truncates the file: the
filesystem gets the space back.
"""

from __future__ import annotations

import logging
import sqlite3

from bookie.ledger_records import _Ledger

__all__ = ["DB_FILE_NAME", "PAGE_SIZE_BYTES", "VACUUM_STEP_PAGES", "init_schema", "migrate", "write_group",
           "vacuum_step", "load_ledgers", "last_stored_entry", "fetch_possible_duplicates", "apply_journal_records"]

log = logging.getLogger("bookie.storage")   # the storage's logger, as before this module was split off

DB_FILE_NAME = "ledgers.db"
# 16 KiB pages keep entries of up to ~4 KB inline in the WITHOUT ROWID b-tree
# (with 4 KiB pages a 1 KB entry spills to an overflow page: 3x slower).
PAGE_SIZE_BYTES = 16384
# Pages (16 KiB) returned to the filesystem per incremental-vacuum step after deletes (4 MiB:
# adds queued meanwhile wait for one step only).
VACUUM_STEP_PAGES = 256

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    ledger_id INTEGER NOT NULL,
    entry_id  INTEGER NOT NULL,
    payload   BLOB    NOT NULL,
    crc       INTEGER,
    PRIMARY KEY (ledger_id, entry_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledgers (
    ledger_id     INTEGER PRIMARY KEY,
    master_key    BLOB    NOT NULL,
    fenced        INTEGER NOT NULL DEFAULT 0,
    lac           INTEGER NOT NULL DEFAULT -1,
    last_entry_id INTEGER NOT NULL DEFAULT -1
);
CREATE TABLE IF NOT EXISTS bookie_instance (
    id          INTEGER PRIMARY KEY CHECK (id = 0),
    instance_id TEXT    NOT NULL,
    created_ms  INTEGER NOT NULL
);
"""

_INSERT_ENTRY = "INSERT INTO entries (ledger_id, entry_id, payload, crc) VALUES (?, ?, ?, ?)"
_UPSERT_LEDGER = (
    "INSERT OR REPLACE INTO ledgers (ledger_id, master_key, fenced, lac, last_entry_id) "
    "VALUES (?, ?, ?, ?, ?)"
)


def init_schema(db: sqlite3.Connection, db_path: str, max_db_size_bytes: int | None) -> bool:
    """Create the tables if missing, :func:`migrate` an older database, and cap the
    database at ``max_db_size_bytes`` (SQLite ``max_page_count``; None or 0: no cap).

    ``db``: the write connection; ``db_path``: its file, for the log. Returns
    True when the database has ``auto_vacuum=INCREMENTAL``. Raises ``sqlite3.Error``."""
    db.executescript(_SCHEMA)
    incremental_vacuum = migrate(db, db_path)
    if max_db_size_bytes:
        db.execute(f"PRAGMA max_page_count={max(1, max_db_size_bytes // PAGE_SIZE_BYTES)}")
    return incremental_vacuum


def migrate(db: sqlite3.Connection, db_path: str) -> bool:
    """Bring a database of an older version up to date: the ``crc`` column, and
    auto_vacuum=INCREMENTAL (one VACUUM; skipped with a warning if it fails).

    Returns True when the database has ``auto_vacuum=INCREMENTAL`` afterwards.
    Raises ``sqlite3.Error`` (not for a failed VACUUM)."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(entries)")}
    if "crc" not in columns:
        db.execute("ALTER TABLE entries ADD COLUMN crc INTEGER")
    if db.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
        log.info("converting %s to auto_vacuum=INCREMENTAL (one-time VACUUM)", db_path)
        try:
            db.execute("VACUUM")
        except sqlite3.Error as exc:
            log.warning("VACUUM of %s failed (%s): deleted ledgers' pages are reused but the file "
                        "will not shrink", db_path, exc)
    return db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2


def write_group(db: sqlite3.Connection, deletes: list, rows: list, ledger_rows: list) -> None:
    """One group commit: BEGIN, deletes, inserts, ledger records, COMMIT
    (fsynced with journal_sync). Rolls back and re-raises on error.

    ``deletes``: ledger ids whose entries and record go; ``rows``: ``entries``
    rows ``(ledger_id, entry_id, payload bytes, crc32c or None)``;
    ``ledger_rows``: ``ledgers`` rows (``_Ledger.row``). Raises ``sqlite3.Error``
    (SQLITE_FULL when the disk or ``max_page_count`` is full)."""
    db.execute("BEGIN")
    try:
        for ledger_id in deletes:
            db.execute("DELETE FROM entries WHERE ledger_id = ?", (ledger_id,))
            db.execute("DELETE FROM ledgers WHERE ledger_id = ?", (ledger_id,))
        if rows:
            db.executemany(_INSERT_ENTRY, rows)
        if ledger_rows:
            db.executemany(_UPSERT_LEDGER, ledger_rows)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


_REPLAY_ENTRY = "INSERT OR IGNORE INTO entries (ledger_id, entry_id, payload, crc) VALUES (?, ?, ?, ?)"
REPLAY_BATCH_RECORDS = 20_000


def apply_journal_records(db: sqlite3.Connection, records) -> int:
    """Apply journal records (start-up replay, :func:`bookie.checkpoint.replay`) in order,
    idempotently: ``("add", ledger id, entry id, payload, crc or None)`` inserts the
    entry unless it is already stored (entries are immutable); ``("ledger", row)`` sets
    the ledger's row; ``("delete", ledger id)`` deletes its entries and row. Commits every
    ``REPLAY_BATCH_RECORDS`` records (not synced). Returns how many records were applied.
    Raises ``sqlite3.Error`` (rolled back to the last batch; replaying again is safe)."""
    n = 0
    db.execute("BEGIN")
    try:
        for record in records:
            kind = record[0]
            if kind == "add":
                db.execute(_REPLAY_ENTRY, record[1:])
            elif kind == "ledger":
                db.execute(_UPSERT_LEDGER, record[1])
            else:
                db.execute("DELETE FROM entries WHERE ledger_id = ?", (record[1],))
                db.execute("DELETE FROM ledgers WHERE ledger_id = ?", (record[1],))
            n += 1
            if n % REPLAY_BATCH_RECORDS == 0:
                db.execute("COMMIT")
                db.execute("BEGIN")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return n


def vacuum_step(db: sqlite3.Connection, pages: int) -> bool:
    """Return up to ``pages`` free pages (of PAGE_SIZE_BYTES) to the filesystem; True if free
    pages remain. The last step checkpoints the WAL (PASSIVE), which truncates the database
    file. Runs on the journal thread; raises ``sqlite3.Error``."""
    db.executescript(f"PRAGMA incremental_vacuum({pages});")  # executescript: runs every step
    if db.execute("PRAGMA freelist_count").fetchone()[0] > 0:
        return True
    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    return False


def load_ledgers(db: sqlite3.Connection) -> dict[int, _Ledger]:
    """Every ledger record of table ``ledgers``: {ledger id: record}, each with its last
    entry id taken from table ``entries`` when the row's is behind. Raises ``sqlite3.Error``."""
    rows = db.execute("SELECT ledger_id, master_key, fenced, lac, last_entry_id FROM ledgers").fetchall()
    ledgers = {}
    for ledger_id, key, fenced, lac, last in rows:
        # the row's last entry id may be behind: adds do not rewrite it (bookie.ledger_records)
        ledgers[ledger_id] = _Ledger(bytes(key), bool(fenced), lac, max(last, last_stored_entry(db, ledger_id)))
    return ledgers


def last_stored_entry(db: sqlite3.Connection, ledger_id: int) -> int:
    """The highest entry id of ``ledger_id`` in table ``entries`` (-1 for none); one
    b-tree descent of the (ledger_id, entry_id) primary key. Raises ``sqlite3.Error``."""
    row = db.execute("SELECT max(entry_id) FROM entries WHERE ledger_id = ?", (ledger_id,)).fetchone()
    return -1 if row is None or row[0] is None else row[0]


def fetch_possible_duplicates(db: sqlite3.Connection, ledgers: dict, group: list) -> dict[tuple[int, int], bytes]:
    """Load stored payloads of adds whose id is not above the ledger's last entry.

    Entries above ``last_entry_id`` cannot be stored yet (the common,
    append-only case) and need no lookup. ``ledgers``: the records ({ledger id:
    record}); ``group``: the journal's queued items (only ``("add", ops, ...)``
    ones are looked at). Returns {(ledger id, entry id): payload bytes}, in
    queries of at most 500 ids. Raises ``sqlite3.Error``.
    """
    wanted: dict[int, set[int]] = {}
    for item in group:
        if item[0] != "add":
            continue
        for op in item[1]:
            st = ledgers.get(op[0])
            if st is not None and op[1] <= st.last_entry_id:
                wanted.setdefault(op[0], set()).add(op[1])
    found: dict[tuple[int, int], bytes] = {}
    for ledger_id, ids in wanted.items():
        id_list = sorted(ids)
        for i in range(0, len(id_list), 500):
            chunk = id_list[i : i + 500]
            marks = ",".join("?" * len(chunk))
            rows = db.execute(
                f"SELECT entry_id, payload FROM entries WHERE ledger_id = ? AND entry_id IN ({marks})",
                (ledger_id, *chunk),
            ).fetchall()
            for entry_id, payload in rows:
                found[(ledger_id, entry_id)] = payload
    return found

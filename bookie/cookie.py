"""Bookie cookies: a bookie refuses a data dir that lost (or swapped) its ledger data.

BookKeeper's rule (``Cookie``, ``LegacyCookieValidation.checkCookies``): at its
first start a bookie stamps a *cookie* (an instance id and its address) into its
directories (and into the metadata store); on every later start the directories
must hold that cookie, otherwise the bookie does not come up. A bookie whose
disk was wiped or replaced would otherwise rejoin silently and answer "no such
entry" for entries it acknowledged, and ledger recovery would then close
ledgers short, deleting acknowledged data.

The local half, made stronger by a second copy of the id *inside* the ledger
database, is below. The metadata-store half (BookKeeper's cookie under
``/ledgers/cookies/<bookie-id>``) applies to a bookie with ``metadata_store_url``:
it writes its cookie there at registration (:mod:`bookie.registration`), and at the
next start :func:`check_stored_cookie` refuses a data dir without a cookie (wiped)
or with another instance's while the store has one; ``--format`` replaces it.

* ``<data_dir>/COOKIE`` (JSON: layout version, ``instance_id`` = random 128-bit
  hex, ``bookie_address`` host:port at the first start, ``created_ms``), written
  atomically (tmp file, fsync, rename, fsync of the dir);
* table ``bookie_instance`` of ``ledgers.db`` holds the same ``instance_id``.

At start (:func:`validate`), with D = "the database exists" and C = "the cookie exists":

* neither: a new bookie. The database is created with a new id, then the cookie.
* both: the ids must be equal and the database file must not be shorter than its
  header says (truncated). Otherwise refuse: the database was replaced,
  truncated or belongs to another bookie.
* D without C: refuse when the database holds any ledger (the cookie was
  deleted, or the data was copied in), unless it is empty (a first start that
  died between the two writes: nothing can be lost).
* C without D: refuse (the database was deleted).

A refusal raises :class:`InvalidCookieError`, whose message says what to do; the
``python -m bookie`` process then exits with status 3 before serving.

Re-initializing a bookie on purpose (BookKeeper's ``bookieformat``): start it once
with ``--format``: every ledger on it is deleted and a new cookie is written.
Its old entries are gone for good, so do it only for a bookie whose ledgers are
replicated elsewhere or no longer needed. ``--create-cookie`` adopts an existing
database that has no cookie (a data dir from a minipulsar version before cookies).

Without a metadata store (or after ``--format``), a data dir wiped *entirely*
(cookie and database) looks like a new bookie. Against that, the bookie reports
its instance id (``GetBookieInfo``, ``ReadLastAddConfirmed``, ``Fence``), ledger
metadata records the instance id of every bookie of its ensembles
(``bookie_instance_ids``), and ledger recovery does not count "no such entry" (nor
a fence) from a bookie that is another instance now (:mod:`bookie.ledger_recovery`);
the bookie client also distrusts "no such entry" answers from an address whose
instance id changed while it knew it (see :class:`bookie.connection.BookieConnection`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sqlite3
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

COOKIE_FILE_NAME = "COOKIE"
COOKIE_LAYOUT_VERSION = 1
# Files of the ledger database (SQLite + its WAL and shared-memory index).
_SQLITE_MAGIC = b"SQLite format 3\x00"

# The database's copy of the instance id (also in bookie.storage's schema).
_INSTANCE_TABLE = """CREATE TABLE IF NOT EXISTS bookie_instance (
    id          INTEGER PRIMARY KEY CHECK (id = 0),
    instance_id TEXT    NOT NULL,
    created_ms  INTEGER NOT NULL
)"""

_HOW_TO_FORMAT = ("To re-initialize this bookie on purpose (every ledger on it is deleted; do it only when its "
                  "ledgers are replicated on other bookies or no longer needed), start it once with --format.")


# Where the metadata store keeps each bookie's cookie (BookKeeper's /ledgers/cookies/<bookie-id>).
COOKIES_PATH = "/ledgers/cookies"


def stored_cookie_path(bookie_id: str) -> str:
    """Metadata-store path of the cookie of bookie ``bookie_id`` (its advertised ``host:port``)."""
    return f"{COOKIES_PATH}/{bookie_id}"


def cookie_from_json(raw: bytes) -> "Cookie":
    """Parse a cookie's JSON (the ``COOKIE`` file, or the value stored in the metadata store).
    Raises ValueError when it is not one."""
    try:
        data = json.loads(raw)
        instance_id = data["instance_id"]
        if not isinstance(instance_id, str) or not instance_id:
            raise ValueError("empty instance_id")
        return Cookie(instance_id, str(data.get("bookie_address", "")), int(data.get("created_ms", 0)))
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a cookie: {exc!r}") from None


def check_stored_cookie(data_dir: str, local: "Cookie | None", stored: "Cookie | None", bookie_id: str,
                        format: bool) -> None:
    """BookKeeper's cookie check against the metadata store (``Cookie.readFromRegistrationManager``
    in ``LegacyCookieValidation``), before the data dir is opened. ``local``: the data dir's
    cookie (None: none); ``stored``: the one under ``/ledgers/cookies/<bookie_id>`` (None:
    none); ``format``: the operator re-initializes the bookie (``--format``), which replaces
    the stored cookie. Raises InvalidCookieError when the bookie must not start:

    * the store has a cookie and the data dir none: the data dir was wiped or replaced, so the
      entries this bookie acknowledged are gone; starting as a new bookie under the same
      address would let ledger recovery take its "no such entry" for the truth;
    * both exist with different instance ids: the data dir belongs to another bookie."""
    if stored is None or format:
        return
    how = (f"If that is intended (its ledgers are replicated elsewhere or not needed), start it once with "
           f"--format (a new, empty bookie; the stored cookie is replaced), or decommission it first by deleting "
           f"{stored_cookie_path(bookie_id)} from the metadata store (etcdctl del {stored_cookie_path(bookie_id)}).")
    if local is None:
        raise InvalidCookieError(
            f"bookie {bookie_id} is registered in the metadata store (cookie {stored_cookie_path(bookie_id)}: "
            f"instance {stored.instance_id}), but its data dir {data_dir} has no cookie: the data dir was wiped or "
            f"replaced, so the entries this bookie acknowledged are gone. Restore the data dir. {how}")
    if local.instance_id != stored.instance_id:
        raise InvalidCookieError(
            f"cookie mismatch for bookie {bookie_id}: data dir {data_dir} is instance {local.instance_id}, the "
            f"metadata store's cookie {stored_cookie_path(bookie_id)} is instance {stored.instance_id}: this data "
            f"dir is not the one the bookie at this address acknowledged entries from. {how}")


class InvalidCookieError(Exception):
    """The data dir does not belong to this bookie instance (BookKeeper's
    InvalidCookieException): the bookie must not start on it."""


@dataclass(frozen=True)
class Cookie:
    """A bookie's identity stamp (BookKeeper's ``Cookie``): ``instance_id`` (128-bit hex),
    ``bookie_address`` (``host:port`` at the first start, "" when unknown) and
    ``created_ms`` (epoch milliseconds, 0 when unknown)."""

    instance_id: str
    bookie_address: str
    created_ms: int

    def to_json(self) -> str:
        """The ``COOKIE`` file text: a JSON object with ``layout_version`` and the three fields."""
        return json.dumps({"layout_version": COOKIE_LAYOUT_VERSION, "instance_id": self.instance_id,
                           "bookie_address": self.bookie_address, "created_ms": self.created_ms},
                          indent=1) + "\n"


def new_instance_id() -> str:
    """A new random instance id: 16 random bytes as 32 hex characters."""
    return secrets.token_hex(16)


def cookie_path(data_dir: str) -> str:
    """Path of the cookie file in ``data_dir`` (``<data_dir>/COOKIE``)."""
    return os.path.join(data_dir, COOKIE_FILE_NAME)


def read_cookie(data_dir: str) -> Cookie | None:
    """The cookie of ``data_dir``, None when there is none.

    Raises InvalidCookieError when the file exists but is not a valid cookie."""
    path = cookie_path(data_dir)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
        instance_id = data["instance_id"]
        if not isinstance(instance_id, str) or not instance_id:
            raise ValueError("empty instance_id")
        return Cookie(instance_id, str(data.get("bookie_address", "")), int(data.get("created_ms", 0)))
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidCookieError(f"cookie file {path} is unreadable ({exc!r}): the data dir is damaged. "
                                 f"{_HOW_TO_FORMAT}") from None


def write_cookie(data_dir: str, cookie: Cookie) -> None:
    """Write the cookie atomically and durably (tmp file, fsync, rename, fsync of the dir)."""
    path = cookie_path(data_dir)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(cookie.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_db_file(db_path: str) -> None:
    """Refuse a database file that is shorter than its own header says (truncated),
    or that is not an SQLite database. An empty (0-byte) file passes: it reads as a
    database without an instance id, which :func:`validate` judges."""
    size = os.path.getsize(db_path)
    if size == 0:
        return
    with open(db_path, "rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        raise InvalidCookieError(f"ledger database {db_path} is damaged: {size} bytes, "
                                 f"{'truncated inside the header' if len(header) < 100 else 'not an SQLite file'}. "
                                 f"{_HOW_TO_FORMAT}")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    change_counter = int.from_bytes(header[24:28], "big")
    n_pages = int.from_bytes(header[28:32], "big")
    valid_for = int.from_bytes(header[92:96], "big")
    # The in-header size is valid when set and written by the same change (SQLite's rule).
    if n_pages and change_counter == valid_for and size < n_pages * page_size:
        raise InvalidCookieError(f"ledger database {db_path} is truncated: {size} bytes, its header says "
                                 f"{n_pages} pages of {page_size} bytes ({n_pages * page_size} bytes); acknowledged "
                                 f"entries on this bookie are lost. Restore the file, or: {_HOW_TO_FORMAT}")


def validate(data_dir: str, db_path: str, db_existed: bool, db: sqlite3.Connection | None, address: str,
             create_cookie: bool = False) -> str:
    """Check (or stamp, for a new bookie) the cookie of ``data_dir`` against the open
    database ``db`` (schema created); returns the instance id. ``db_existed``: the
    database file existed before it was opened (call with ``db=None`` before creating
    it: a cookie without a database is refused before an empty one takes its place).
    Raises InvalidCookieError."""
    cookie = read_cookie(data_dir)
    if cookie is not None and not db_existed:
        raise InvalidCookieError(
            f"data dir {data_dir} has a cookie (instance {cookie.instance_id}, first started as "
            f"{cookie.bookie_address}) but no ledger database {os.path.basename(db_path)}: the database was deleted, "
            f"so the entries this bookie acknowledged are gone. Restore the database, or: {_HOW_TO_FORMAT}")
    if db is None:
        raise ValueError("validate() needs the open database unless it refuses a missing one")
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise InvalidCookieError(f"ledger database {db_path} is unusable ({exc}). Restore it, or: "
                                 f"{_HOW_TO_FORMAT}") from None
    row = db.execute("SELECT instance_id FROM bookie_instance WHERE id = 0").fetchone() \
        if "bookie_instance" in tables else None
    db_id = row[0] if row else None
    if cookie is not None:
        if create_cookie:
            raise InvalidCookieError(f"--create-cookie: data dir {data_dir} already has a cookie "
                                     f"(instance {cookie.instance_id}); start without --create-cookie")
        if db_id != cookie.instance_id:
            what = "no instance id (replaced by another or an empty file, or truncated)" if db_id is None \
                else f"instance id {db_id} (it belongs to another bookie)"
            raise InvalidCookieError(
                f"cookie mismatch in {data_dir}: the cookie says instance {cookie.instance_id} but the ledger "
                f"database has {what}; this is not the data this bookie acknowledged. Restore the database, "
                f"or: {_HOW_TO_FORMAT}")
        if cookie.bookie_address and address and cookie.bookie_address != address:
            log.warning("bookie instance %s first started as %s now listens on %s: ledger metadata names bookies "
                        "by address, so ledgers written to the old address do not find their entries here",
                        cookie.instance_id, cookie.bookie_address, address)
        return cookie.instance_id
    has_data = any(db.execute(f"SELECT EXISTS (SELECT 1 FROM {t})").fetchone()[0]
                   for t in ("ledgers", "entries") if t in tables)
    if has_data and not create_cookie:
        n = db.execute("SELECT COUNT(*) FROM ledgers").fetchone()[0] if "ledgers" in tables else 0
        raise InvalidCookieError(
            f"data dir {data_dir} has a ledger database with {n} ledger(s) but no cookie file "
            f"{COOKIE_FILE_NAME}: the cookie was deleted or the database copied in, so this bookie cannot tell "
            f"whether it holds the data it acknowledged. If the database is this bookie's own (e.g. a data dir "
            f"from a minipulsar version before cookies), start once with --create-cookie. {_HOW_TO_FORMAT}")
    instance_id = db_id or new_instance_id()
    if db_id is None:
        db.execute(_INSTANCE_TABLE)
        db.execute("INSERT OR REPLACE INTO bookie_instance (id, instance_id, created_ms) VALUES (0, ?, ?)",
                   (instance_id, int(time.time() * 1000)))
    write_cookie(data_dir, Cookie(instance_id, address, int(time.time() * 1000)))
    log.info("stamped cookie: bookie instance %s at %s in %s%s", instance_id, address, data_dir,
             " (adopted the existing database)" if has_data else "")
    return instance_id

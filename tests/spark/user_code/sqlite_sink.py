"""A sink of the user's own: each batch's rows into a SQLite table (the file the environment
names in ``STORE``), idempotent by batch id, and its undo."""

import os
import sqlite3


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ["STORE"])
    db.execute("CREATE TABLE IF NOT EXISTS out (batch INTEGER, row TEXT)")
    return db


def write(df, batch_id):
    rows = [(batch_id, repr(tuple(r))) for r in df.collect()]
    with _db() as db:  # one transaction: a batch written again replaces itself
        db.execute("DELETE FROM out WHERE batch = ?", (batch_id,))
        db.executemany("INSERT INTO out VALUES (?, ?)", rows)


def undo(after_batch):
    with _db() as db:
        db.execute("DELETE FROM out WHERE batch > ?", (after_batch,))

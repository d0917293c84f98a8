"""Statements that PostgreSQL plans once a connection.

For the statements every rank sends every few seconds (a metric batch,
jobs/metrics/ingest.py; a heartbeat, jobs/worker_api/heartbeats.py): planning either cost
PostgreSQL about as much as running it for a batch of 10 points.

Django turns psycopg's preparing off for every connection (its default
`prepare_threshold` is None, so that its own queries pass through
transaction-pooling proxies), and with it even `prepare=True`; settings give
a threshold that no statement reaches by count instead, so only what asks
here is prepared. PgBouncer carries protocol-level prepared statements in
transaction mode since 1.21 (max_prepared_statements).

The cursor binds on the server, so a statement's parameters are typed by
psycopg, not spelled into its text: give each a cast where PostgreSQL
cannot tell its type (a None among them).
"""

from __future__ import annotations

import psycopg


class PreparedCursor(psycopg.Cursor):
    """A server-side binding cursor that prepares what it runs."""

    def execute(self, query, params=None, *, prepare=None, binary=None):
        return super().execute(query, params, prepare=True, binary=binary)

    def _convert_query(self, query, params=None):
        # psycopg keeps the converted query for Django's query log (which
        # reads `_query`) only where it runs the statement unprepared.
        self._query = super()._convert_query(query, params)
        return self._query


def prepared_cursor(connection):
    """A cursor of the Django `connection` that prepares its statements,
    wrapped as Django wraps its own: errors are Django's, and the statements
    are seen by query logging and counting. Use it as a context manager."""
    connection.ensure_connection()
    return connection._prepare_cursor(PreparedCursor(connection.connection))

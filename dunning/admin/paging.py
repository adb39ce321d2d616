"""A cheap paginator for the big append-only tables: an unfiltered changelist reads the row
estimate PostgreSQL keeps in pg_class instead of counting millions of rows."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.db import connections
from django.utils.functional import cached_property

EXACT_BELOW = 10_000


class EstimatedCountPaginator(Paginator):
    @cached_property
    def count(self) -> int:
        qs = self.object_list
        query = getattr(qs, "query", None)
        if query is not None and not query.where:
            conn = connections[qs.db]
            if conn.vendor == "postgresql":
                with conn.cursor() as cursor:
                    cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = %s",
                                   [qs.model._meta.db_table])
                    row = cursor.fetchone()
                if row and row[0] and row[0] >= EXACT_BELOW:
                    return int(row[0])
        return super().count

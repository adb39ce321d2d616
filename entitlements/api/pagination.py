"""Cursor pagination, newest first: stable under concurrent inserts into append-only tables."""

from __future__ import annotations

from rest_framework.pagination import CursorPagination


class NewestFirstCursorPagination(CursorPagination):
    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200

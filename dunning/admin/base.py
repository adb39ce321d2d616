"""Admin building blocks: protected and evidence models are view-only here. Changes go through
the acceptance service (admin actions arrive with the support console)."""

from __future__ import annotations

from django.contrib import admin


class _NoWrites:
    """Refuses add, change and delete, so the admin (or inline) only shows the rows."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class ViewOnlyAdmin(_NoWrites, admin.ModelAdmin):
    pass


class ViewOnlyInline(_NoWrites, admin.TabularInline):
    extra = 0
    show_change_link = True

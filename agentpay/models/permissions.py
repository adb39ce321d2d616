"""Permissions of AgentPay's support actions, carried by a table-less model (as dunning does)
and granted to the "Billing leads" group by migration."""

from __future__ import annotations

from django.db import models


class AgentPayConsole(models.Model):
    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("resolve_review", "Take ownership of and resolve a needs-review AgentPay intent"),
            ("credit_wallet", "Credit a tenant wallet (staff credit with a reason and a ticket)"),
        ]

    def __str__(self) -> str:
        return "AgentPay console permissions"

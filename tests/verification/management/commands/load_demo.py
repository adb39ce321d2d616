"""manage.py load_demo — publish the shipped policies, load the demo data set and print an admin login."""

from __future__ import annotations

import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from dunning.models import DunningPolicy
from dunning.policy.publishing import policy_publish
from subscriptions.models import Customer
from subscriptions.providers.labels import provider_label
from tests.verification.demo import load_demo

POLICY_DIR = Path(settings.BASE_DIR) / "dunning" / "policy" / "shipped"


class Command(BaseCommand):
    help = "Load the demo data set (idempotent) and print a fresh admin password."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument("--no-password-reset", action="store_true",
                            help="Keep an existing admin's password (nothing is printed for it).")

    def handle(self, *args, username: str, no_password_reset: bool, **options):
        if not DunningPolicy.objects.exists():
            for path in sorted(POLICY_DIR.glob("*.yaml")):
                policy_publish(text=path.read_text(encoding="utf-8"))
        subscriptions = load_demo()
        self.stdout.write(f"Demo data: {len(subscriptions)} subscriptions")
        for sub in subscriptions:
            blocking = sub.cycles.exclude(state__in=["CURRENT", "RECOVERED", "CLOSED_VOID"]).count()
            self.stdout.write(f"  {sub.provider_subscription_id:<22} {sub.customer.email:<22} "
                              f"{sub.entitlement_profile:<24} generation {sub.entitlement_generation}, "
                              f"{blocking} open dunning cycle(s), {provider_label(sub.provider)}")
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(
            username=username, defaults={"is_staff": True, "is_superuser": True, "email": "admin@example.com"}
        )
        if created or not no_password_reset:
            password = secrets.token_urlsafe(12)
            user.set_password(password)
            user.is_staff = user.is_superuser = True
            user.save()
            self.stdout.write(self.style.SUCCESS(f"Admin login: username {username!r}  password {password!r}"))
            self._role_logins()

    def _role_logins(self) -> None:
        """Daily work needs no superuser: a support agent, a billing lead, and one customer."""
        user_model = get_user_model()
        for name, group in (("agent", "Support agents"), ("lead", "Billing leads")):
            user, _ = user_model.objects.get_or_create(username=name, defaults={"is_staff": True})
            password = secrets.token_urlsafe(9)
            user.set_password(password)
            user.save()
            user.groups.add(Group.objects.get(name=group))
            self.stdout.write(f"{group[:-1]} login: username {name!r}  password {password!r}  (/admin/)")
        customer = Customer.objects.filter(email="rita@example.com").first()
        if customer is not None:
            user, _ = user_model.objects.get_or_create(username="rita", defaults={"email": customer.email})
            password = secrets.token_urlsafe(9)
            user.set_password(password)
            user.save()
            if customer.user_id != user.pk:
                Customer.objects.filter(pk=customer.pk).update(user=user)
            self.stdout.write(f"Customer login: username 'rita'  password {password!r}  (/billing/)")

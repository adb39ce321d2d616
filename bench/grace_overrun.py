"""Grace overrun: how long access stays at the grace profile after grace ends, when the provider's
own retries run past the grace deadline (SPEC §5: grace is a deadline).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/dunning_sim .venv/bin/python -m bench.grace_overrun
    … --tree /tmp/before     # the same run on another checkout's code (the "before" figure)

N subscriptions (default 20) on a P7D-grace, provider-authority policy (``bench-grace-overrun@1``,
``maxAttempts: 8``, published by the bench) renew on a card that declines every time
(``insufficient_funds`` by default: a retryable decline, so the provider keeps retrying; a hard
decline such as ``stolen_card`` stops the provider's retries at once, and grace then ends on
time with either code). The Stripe-compatible simulator retries each invoice Smart-Retries-like:
8 tries spread over 14 days (1, 1, 2, 2, 2, 3, 3 days apart), most of them after the grace end.
The scheduler runs every ``--tick`` seconds of simulated time (default 300) with the jobs that
decide access (every job except alerts, reconciliation, outbox_relay, entitlement_push and
reminders), each at its own cadence; webhooks are delivered as soon as the provider emits them.

It prints, per subscription, how long after ``grace_expires_at`` its access stayed at the grace
profile (or FULL) before the restricted profile was issued, and how long it would have stayed had
only the provider's retry outcome ended grace (its last automatic attempt failing); then the max
and p50 of both.

Only ``StripeSimulator(retry_schedule=..., max_attempts=...)`` and the webhook, job and policy
services are used, so it runs on code from before the contract line too: put a checkout of it
first on the import path with ``--tree`` (e.g. ``git worktree add /tmp/before ef7bc5c``, or
``git archive ef7bc5c | tar -x -C /tmp/before``). Each run works in its own database, created next
to the one DATABASE_URL names (``<name>_grace_overrun``, migrated with the tree's own migrations)
and dropped at the end unless ``--keep-db``; DATABASE_URL must name a database whose name contains
``sim``, like ``manage.py simulate``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

DAY = 86400
SMART_RETRIES = (DAY, DAY, 2 * DAY, 2 * DAY, 2 * DAY, 3 * DAY, 3 * DAY)  # 8 tries over 14 days
EPOCH = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
ACCOUNT = "acct_demo"
SECRET = "whsec_grace_overrun"
PRICE = "price_bench_grace_overrun"
POLICY = f"""
schema: subscription.dunningPolicy.v1
policy: bench-grace-overrun@1
provider: {{name: stripe, account: {ACCOUNT}}}
applies_to: {{prices: [{PRICE}], cohort: default}}
invoice_status_mapping: {{open: BLOCKING, uncollectible: BLOCKING, void: CLOSED, paid: CLOSED}}
dispute_lost: BLOCKING
retryAuthority: PAYMENT_PROVIDER
maxAttempts: 8
failure_classes: {{insufficient_funds: RETRYABLE, processing_error: RETRYABLE, expired_card: CUSTOMER_ACTION,
                  stolen_card: NON_RETRYABLE}}
grace: {{starts: FIRST_FAILURE, duration: P7D, profile: READ_EXPORT_NO_NEW_JOBS}}
restrictAfter: GRACE_EXPIRED_AND_INVOICE_OPEN
restricted_profile: SUSPENDED
recoverOn: INVOICE_PAID_RECEIPT
recover_with_remaining_debt: false
cancelAfter: MANUAL_ONLY
notifications: {{template_generation: 3, reminders_before_grace_end: []}}
exceptions: {{max_duration: P14D, requires: [owner, reason, ticket]}}
clock: APPLICATION
mode: ENFORCE
rollout: {{percent: 100, cohort: default}}
"""
RESTRICTED = "SUSPENDED"
# Jobs that do not decide access (and would only slow the run down).
SKIPPED_JOBS = frozenset({"alerts", "reconciliation", "outbox_relay", "entitlement_push", "reminders"})
_T0 = time.monotonic()


def say(message: str) -> None:
    elapsed = int(time.monotonic() - _T0)
    print(f"[grace_overrun {elapsed // 60:02d}:{elapsed % 60:02d}] {message}", flush=True)


def hours(delta: timedelta | None) -> str:
    return "-" if delta is None else f"{delta.total_seconds() / 3600:7.2f} h"


# ---- the scratch database -----------------------------------------------------------------------

def _admin(url: str):  # noqa: ANN202 - a psycopg connection to the server's maintenance database
    import psycopg

    parts = urlsplit(url)
    return psycopg.connect(host=parts.hostname or "127.0.0.1", port=parts.port or 5432,
                           user=parts.username or "postgres", password=parts.password, dbname="postgres",
                           autocommit=True)


@contextlib.contextmanager
def scratch_database(url: str, *, keep: bool) -> Iterator[str]:
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if "sim" not in name.lower():
        raise SystemExit(f"refusing to run on database {name!r}: DATABASE_URL must name a database whose name "
                         "contains 'sim' (e.g. postgres://postgres@127.0.0.1:5432/dunning_sim)")
    scratch = f"{name}_grace_overrun"[:63]
    with _admin(url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{scratch}"')
    try:
        yield urlunsplit(parts._replace(path=f"/{scratch}"))
    finally:
        from django.db import connections

        connections.close_all()
        if keep:
            say(f"kept database {scratch}")
        else:
            with _admin(url) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


def tree_revision(tree: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %s"], capture_output=True,
                             text=True, timeout=10, check=False)
        head = out.stdout.strip()[:100]
        dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=False).stdout.strip()
        return f"{head}{' + uncommitted changes' if dirty else ''}" if head else "not a git checkout"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# ---- the run ------------------------------------------------------------------------------------

class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.provider_end: dict[str, datetime] = {}  # invoice -> the provider's last automatic attempt failed
        self.retries_after: dict[str, int] = {}  # invoice -> provider attempts after its grace end
        self.invoice_of: dict[str, str] = {}  # subscription -> renewal invoice
        self.failed_at: dict[str, datetime] = {}
        self.last_job: dict[str, datetime] = {}
        self.counters = {"webhooks": 0, "provider_attempts": 0, "job_runs": 0}

    def now(self) -> datetime:
        from django.utils import timezone

        return timezone.now()

    def post(self, body: bytes, headers: dict[str, str]) -> int:
        self.counters["webhooks"] += 1
        response = self.client.post("/webhooks/stripe/", data=body, content_type="application/json",
                                    HTTP_STRIPE_SIGNATURE=headers["Stripe-Signature"])
        return response.status_code

    @contextlib.contextmanager
    def world(self) -> Iterator[None]:
        from unittest import mock

        import stripe
        import time_machine
        from django.conf import settings
        from django.test import Client, override_settings

        from config.celery import app as celery_app
        from tests.verification.fake_stripe import StripeSimulator
        from tests.verification.fake_stripe.api import StripeApi
        from tests.verification.simulation.transport import client_factory

        with contextlib.ExitStack() as stack:
            self.clock = stack.enter_context(time_machine.travel(EPOCH, tick=False))
            self.sim = StripeSimulator(account=ACCOUNT, webhook_secrets=[SECRET], sink=self.post, auto_deliver=False,
                                       retry_schedule=SMART_RETRIES, max_attempts=len(SMART_RETRIES) + 1)
            base = "http://grace-overrun.invalid"
            self.sim.renderer.hosted_base = base
            stack.enter_context(mock.patch.object(stripe, "RequestsClient", client_factory(StripeApi(self.sim))))
            stack.enter_context(override_settings(
                STRIPE_API_BASE=base, STRIPE_WEBHOOK_SECRETS=[SECRET], STRIPE_ACCOUNT=ACCOUNT,
                STRIPE_API_KEY="sk_test_grace_overrun", STRIPE_TIMEOUT_SECONDS=5.0, STRIPE_API_VERSION="",
                DUNNING_UNKNOWN_PAYMENT_QUEUE_USER="", DUNNING_CLOCK_OVERRIDE="APPLICATION",
                EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend",
                ALLOWED_HOSTS=[*settings.ALLOWED_HOSTS, "testserver"],
            ))
            previous = celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates
            celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates = True, True
            stack.callback(lambda: setattr(celery_app.conf, "task_always_eager", previous[0]))
            stack.callback(lambda: setattr(celery_app.conf, "task_eager_propagates", previous[1]))
            self.client = Client()
            yield

    def setup(self) -> None:
        from dunning.policy.publishing import policy_publish

        policy_publish(text=POLICY)
        n = self.args.subscriptions
        self.subscriptions: list[str] = []
        for i in range(n):
            customer = self.sim.create_customer(f"grace-overrun-{i}@example.com", card="ok")
            self.subscriptions.append(self.sim.create_subscription(customer, PRICE, "month", amount=4900))
            self.clock.shift(timedelta(seconds=1))
        self.sim.deliver_all()
        say(f"{n} subscriptions on {PRICE} (policy bench-grace-overrun@1: P7D grace, provider retries, "
            f"maxAttempts 8); renewals decline with {self.args.decline}")
        for i, sub in enumerate(self.subscriptions):  # renewals spread over the first hour
            self.clock.move_to(EPOCH + timedelta(minutes=5, seconds=37 + i * 3600 // max(n, 1)))
            self.sim.set_card(self.sim.get(sub)["customer"], self.args.decline)
            invoice = self.sim.create_renewal_invoice(sub)
            self.sim.provider_attempt(invoice)
            self.invoice_of[sub] = invoice
            self.failed_at[invoice] = self.now()
            self._note_provider(invoice)
            self.sim.deliver_all()

    def _note_provider(self, invoice: str) -> None:
        inv = self.sim.get(invoice)
        if inv["status"] == "open" and not inv["next_payment_attempt"] and invoice not in self.provider_end:
            self.provider_end[invoice] = self.now()

    def provider_acts(self) -> None:
        now = self.now()
        for invoice in self.invoice_of.values():
            inv = self.sim.get(invoice)
            due = inv["next_payment_attempt"]
            if inv["status"] == "open" and inv.get("auto_advance", True) and due and due <= now.timestamp():
                self.sim.provider_attempt(invoice)
                self.counters["provider_attempts"] += 1
                self._note_provider(invoice)
        self.sim.deliver_all()

    def run_jobs(self) -> None:
        from dunning.jobs.framework import job_run
        from dunning.jobs.schedule import CATCH_UP_ORDER, JOB_CADENCE

        now = self.now()
        for name in CATCH_UP_ORDER:
            last = self.last_job.get(name)
            if name in SKIPPED_JOBS or (last is not None and (now - last).total_seconds() < JOB_CADENCE[name]):
                continue
            self.last_job[name] = now
            job_run(name, now=now)
            self.counters["job_runs"] += 1

    def loop(self) -> None:
        from entitlements.models import EntitlementSnapshot

        tick = timedelta(seconds=self.args.tick)
        end = max(self.failed_at.values()) + timedelta(days=self.args.horizon_days)
        at = EPOCH + tick * (int((max(self.failed_at.values()) - EPOCH) / tick) + 1)
        say(f"scheduler every {self.args.tick} s of simulated time until {end:%Y-%m-%d %H:%M} "
            f"({self.args.horizon_days} days after the last renewal failed)")
        next_report = at + timedelta(days=1)
        while at <= end:
            self.clock.move_to(at)
            self.provider_acts()
            self.run_jobs()
            if at >= next_report:
                restricted = (EntitlementSnapshot.objects.filter(profile=RESTRICTED)
                              .values("subscription").distinct().count())
                open_retries = sum(1 for i in self.invoice_of.values() if self.sim.get(i)["next_payment_attempt"])
                say(f"day {(at - EPOCH) / timedelta(days=1):4.1f}: {restricted}/{len(self.subscriptions)} "
                    f"restricted; {self.counters['provider_attempts']} provider retries so far, {open_retries} "
                    f"invoice(s) with a retry still scheduled; {self.counters['job_runs']} job runs")
                next_report += timedelta(days=1)
            at += tick

    def report(self, code: str) -> int:
        from dunning.models import DunningCycle
        from entitlements.models import EntitlementSnapshot

        rows = []
        failures = [(e["data"]["object"]["id"], e["created"])
                    for e in self.sim.events_of_type("invoice.payment_failed")]
        for sub in self.subscriptions:
            invoice = self.invoice_of[sub]
            cycle = DunningCycle.objects.select_related("subscription").get(invoice__provider_invoice_id=invoice)
            grace_end = cycle.grace_expires_at
            restricted = (EntitlementSnapshot.objects.filter(subscription=cycle.subscription, profile=RESTRICTED)
                          .order_by("issued_at").values_list("issued_at", flat=True).first())
            provider_end = self.provider_end.get(invoice)
            attempts_after = sum(1 for inv, created in failures
                                 if inv == invoice and grace_end and created > grace_end.timestamp())
            overrun = (restricted - grace_end) if restricted and grace_end else None
            only_provider = max(provider_end - grace_end, timedelta(0)) if provider_end and grace_end else None
            rows.append((sub, invoice, cycle.state, self.failed_at[invoice], grace_end, attempts_after, provider_end,
                         restricted, overrun, only_provider))
        print()
        print(f"code: {code}")
        print(f"{'subscription':<24} {'failed':<12} {'grace ends':<12} {'retries':>7}  {'provider done':<12} "
              f"{'restricted':<12} {'overrun':>9}  {'provider-only':>13}  state")
        fmt = "%m-%d %H:%M"
        for sub, _inv, state, failed, grace_end, after, provider_end, restricted, overrun, only in rows:
            print(f"{sub:<24} {failed:{fmt}}  {grace_end:{fmt}}  {after:>7}  "
                  f"{provider_end.strftime(fmt) if provider_end else '-':<12} "
                  f"{restricted.strftime(fmt) if restricted else 'never':<12} {hours(overrun):>9}  "
                  f"{hours(only):>13}  {state}")
        overruns = [r[8] for r in rows if r[8] is not None]
        onlys = [r[9] for r in rows if r[9] is not None]
        never = sum(1 for r in rows if r[7] is None)
        print()
        print("'retries': provider attempts after the grace end; 'overrun': restricted profile issued minus "
              "grace_expires_at (access stayed at the grace profile or FULL that long); 'provider-only': how long it "
              "would have stayed had only the provider's retry outcome (its last automatic attempt failing) ended "
              "grace.")
        if overruns:
            print(f"overrun        max {hours(max(overruns))}   p50 {hours(statistics.median(overruns))}   "
                  f"over {len(overruns)} subscription(s)")
        if never:
            print(f"never restricted within {self.args.horizon_days} days: {never} subscription(s)")
        if onlys:
            print(f"provider-only  max {hours(max(onlys))}   p50 {hours(statistics.median(onlys))}")
        print(f"{self.counters['webhooks']} webhooks, {self.counters['provider_attempts']} provider retries, "
              f"{self.counters['job_runs']} job runs")
        return 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.grace_overrun", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--subscriptions", type=int, default=20, help="subscriptions (default 20)")
    parser.add_argument("--tick", type=int, default=300, help="seconds of simulated time between scheduler runs "
                                                              "(default 300)")
    parser.add_argument("--decline", default="insufficient_funds",
                        help="decline code of every attempt (default insufficient_funds, which the provider retries)")
    parser.add_argument("--horizon-days", type=float, default=16.0,
                        help="simulated days after the last renewal failure (default 16: past the 14-day schedule)")
    parser.add_argument("--tree", type=Path, default=None,
                        help="run this checkout's code instead (put first on the import path), e.g. /tmp/before")
    parser.add_argument("--keep-db", action="store_true", help="keep the scratch database")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    tree = (args.tree or Path(__file__).resolve().parent.parent).resolve()
    if args.tree is not None:
        if not (tree / "dunning").is_dir():
            raise SystemExit(f"--tree {tree}: no dunning/ package there")
        sys.path.insert(0, str(tree))
        os.chdir(tree)  # Celery puts the working directory first on sys.path when the app loads
        for name in [m for m in sys.modules if m.split(".")[0] in ("config", "dunning", "subscriptions", "tests",
                                                                     "entitlements")]:
            del sys.modules[name]
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("DATABASE_URL must point at PostgreSQL, e.g. postgres://postgres@127.0.0.1:5432/dunning_sim")
    code = f"{tree} ({tree_revision(tree)})"
    say(f"code from {code}")
    with scratch_database(url, keep=args.keep_db) as scratch:
        os.environ["DATABASE_URL"] = scratch
        os.environ["DUNNING_CLOCK_OVERRIDE"] = "APPLICATION"
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        import logging

        import django
        from django.core.management import call_command

        django.setup()
        logging.disable(logging.WARNING)
        import dunning

        if Path(dunning.__file__).resolve().parent.parent != tree:
            raise SystemExit(f"imported dunning from {dunning.__file__}, not from {tree}")
        from dunning import states

        deadline = "GRACE_DEADLINE_STATES" in vars(states)
        say(f"migrating {urlsplit(scratch).path.lstrip('/')} with the tree's migrations …")
        call_command("migrate", verbosity=0)
        say("grace ends at its deadline whatever the retry schedule says (GRACE_DEADLINE_STATES)" if deadline else
            "this code expires only GRACE_ACTIVE (no GRACE_DEADLINE_STATES): a scheduled retry holds grace")
        run = Run(args)
        with run.world():
            run.setup()
            run.loop()
            return run.report(code)


if __name__ == "__main__":
    sys.exit(main())

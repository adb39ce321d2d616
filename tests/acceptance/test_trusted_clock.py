"""One trusted clock (SPEC §5, §6): a policy's `clock: DATABASE` reads PostgreSQL's clock, and no
time-guarded edge is taken at a `now` the trusted clock has not reached."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from dunning.clock import CLOCK_TOLERANCE, clock_now, database_now, now_is_not_ahead
from dunning.models import TransitionReceipt
from tests.support.builders import make_policy, make_subscription, open_cycle, reload
from tests.support.paths import Walker


@pytest.fixture
def database_clock(settings):
    settings.DUNNING_CLOCK_OVERRIDE = ""  # the policies' own clock (the suite pins APPLICATION)


def test_the_database_clock_is_postgresql_s_and_ignores_the_application_s(db, database_clock, time_machine):
    assert connection.vendor == "postgresql"
    time_machine.move_to("2031-06-01T00:00:00Z", tick=False)  # the application's clock is wrong
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        before = cursor.fetchone()[0]
    read = database_now()
    assert read.year != 2031 and abs(read - before) < timedelta(seconds=5)
    assert clock_now("DATABASE") != timezone.now() and clock_now("APPLICATION") == timezone.now()
    ok, _ = now_is_not_ahead(timezone.now(), "DATABASE")
    assert not ok, "an application clock years ahead of the database is not trusted"


def test_a_database_clock_policy_refuses_a_step_its_clock_has_not_reached(db, database_clock, time_machine):
    make_policy(clock="DATABASE")
    walker = Walker(open_cycle(make_subscription()), now=database_now()).to_grace()
    deadline = reload(walker.cycle).grace_expires_at
    # The application's clock (and the caller's `now`) are past the deadline; PostgreSQL's is not.
    time_machine.move_to(deadline + timedelta(hours=1), tick=True)
    from dunning.acceptance.inputs import Cause, Expect
    from dunning.acceptance.transitions import cycle_accept_transition

    cycle = reload(walker.cycle)
    result = cycle_accept_transition(cycle_pk=cycle.pk, edge="expire_grace", expect=Expect.from_cycle(cycle),
                                     cause=Cause.job("grace_expiry"), now=deadline + timedelta(seconds=1))
    assert not result.accepted and result.reason == "NOW_AFTER_TRUSTED_CLOCK"
    receipt = TransitionReceipt.objects.get(pk=result.receipt_id)
    assert "trusted clock reads" in receipt.detail and reload(cycle).state == "GRACE_ACTIVE"


def test_an_application_clock_policy_takes_a_now_within_the_tolerance_and_not_beyond(db, database_clock):
    from dunning.acceptance.inputs import Cause, Expect
    from dunning.acceptance.transitions import cycle_accept_transition

    make_policy(clock="APPLICATION")
    walker = Walker(open_cycle(make_subscription()), now=timezone.now() - timedelta(days=8)).to_grace()
    cycle = reload(walker.cycle)
    assert cycle.grace_expires_at < timezone.now()

    def expire(now):
        fresh = reload(cycle)
        return cycle_accept_transition(cycle_pk=cycle.pk, edge="expire_grace", expect=Expect.from_cycle(fresh),
                                       cause=Cause.job("grace_expiry"), now=now)

    beyond = expire(timezone.now() + timedelta(minutes=1))
    assert not beyond.accepted and beyond.reason == "NOW_AFTER_TRUSTED_CLOCK"
    within = expire(timezone.now() + CLOCK_TOLERANCE / 2)
    assert within.accepted, within

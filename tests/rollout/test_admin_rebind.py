"""The rollout page's forward rebind: refused before anything is queued, or queued after commit
as the Celery task that runs the recorded job."""

from __future__ import annotations

import pytest
from django.urls import reverse

from dunning.models import JobRun
from subscriptions.models import Subscription
from tests.rollout.conftest import PASSWORD, publish
from tests.support.builders import make_subscription

URL = "admin:dunning_rollout_rebind"


def post(client, user, **fields):
    client.login(username=user.username, password=PASSWORD)
    data = {f"rebind-{k}": v for k, v in {"cohort": "default", "reason": "ship v2", "ticket": "ROLL-7",
                                           **fields}.items()}
    return client.post(reverse(URL), data)


def test_a_lead_queues_the_rebind_after_commit_and_the_job_moves_the_cohort(db, client, lead,
                                                                              django_capture_on_commit_callbacks):
    publish(1)
    subs = [make_subscription() for _ in range(3)]
    v2 = publish(2)
    with django_capture_on_commit_callbacks(execute=False) as queued:
        answer = post(client, lead, policy="test-monthly@2")
    assert answer.status_code == 302
    assert len(queued) == 1 and not JobRun.objects.filter(job="rollout_rebind_forward").exists(), \
        "nothing runs before the request's transaction commits"
    queued[0]()  # the commit: the task runs (in process in tests)
    run = JobRun.objects.get(job="rollout_rebind_forward")
    assert (run.status, run.examined, run.changed, run.refused) == ("OK", 3, 3, 0)
    assert set(Subscription.objects.filter(pk__in=[s.pk for s in subs]).values_list("policy", flat=True)) == {v2.pk}


@pytest.mark.parametrize(("fields", "code"), [
    ({"policy": "test-monthly@9"}, "UNKNOWN_POLICY"),
    ({"policy": "test-monthly@2", "cohort": "   "}, "cohort"),  # the form's own "required"
    ({"policy": "test-monthly@2", "ticket": "  "}, "ticket"),
])
def test_bad_input_is_refused_on_the_page_and_queues_nothing(db, client, lead, fields, code,
                                                              django_capture_on_commit_callbacks):
    publish(1)
    make_subscription()
    publish(2)
    with django_capture_on_commit_callbacks(execute=True) as queued:
        answer = post(client, lead, **fields)
    assert answer.status_code == 400
    assert queued == [] and not JobRun.objects.exists()
    assert code.lower() in answer.content.decode().lower()
    assert Subscription.objects.filter(policy__version=1).count() == 1


def test_a_support_agent_may_read_the_page_but_not_rebind(db, client, agent):
    publish(1)
    publish(2)
    assert post(client, agent, policy="test-monthly@2").status_code == 403
    assert not JobRun.objects.exists()

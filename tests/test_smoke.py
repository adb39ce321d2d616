from tests.support.builders import accept, fail_first_payment, make_subscription, open_cycle, paid_evidence, reload


def test_failure_grace_and_recovery_issue_generations(policy):
    sub = make_subscription()
    assert sub.entitlement_generation == 1 and sub.entitlement_profile == "FULL"
    cycle = open_cycle(sub)
    fail_first_payment(cycle)
    sub.refresh_from_db()
    assert sub.entitlement_profile == "READ_EXPORT_NO_NEW_JOBS"
    assert sub.entitlement_generation == 2
    result = accept(cycle, "recover", evidence=paid_evidence(reload(cycle)))
    assert result.accepted, result
    sub.refresh_from_db()
    assert (sub.entitlement_profile, sub.entitlement_generation) == ("FULL", 3)

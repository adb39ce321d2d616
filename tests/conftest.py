import pytest

from tests.builders import make_policy


@pytest.fixture
def policy(db):
    return make_policy()


@pytest.fixture
def staff(db, django_user_model):
    return django_user_model.objects.create_user("agent", password="x", is_staff=True)

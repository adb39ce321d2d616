import pytest

from config.celery import app as celery_app
from tests.builders import make_policy


@pytest.fixture(autouse=True)
def celery_in_process():
    """Tasks run in the test's process unless a test starts a real worker itself."""
    previous = celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates
    celery_app.conf.task_always_eager = True
    celery_app.conf.task_eager_propagates = True
    yield
    celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates = previous


@pytest.fixture
def policy(db):
    return make_policy()


@pytest.fixture
def staff(db, django_user_model):
    return django_user_model.objects.create_user("agent", password="x", is_staff=True)

"""Customer billing page routes."""

urlpatterns: list = []

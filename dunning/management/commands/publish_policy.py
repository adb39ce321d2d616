"""manage.py publish_policy FILE [FILE ...] — validate and publish dunning policies (SPEC §4)."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from dunning.policy.document import PolicyValidationError
from dunning.policy.publishing import PolicyConflict, policy_publish


class Command(BaseCommand):
    help = "Validate and publish subscription.dunningPolicy.v1 documents (YAML or JSON). Re-publishing the same " \
           "document is a no-op; a changed document needs a new version."

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="+", help="Policy files (.yaml, .yml or .json)")

    def handle(self, *args, files: list[str], **options):
        failures = 0
        for name in files:
            path = Path(name)
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                self.stderr.write(f"{name}: cannot read: {exc.strerror or exc}")
                failures += 1
                continue
            try:
                policy, created = policy_publish(text=text)
            except PolicyValidationError as exc:
                failures += 1
                self.stderr.write(f"{name}: not published, {len(exc.errors)} problem(s):")
                for message in exc.errors:
                    self.stderr.write(f"  - {message}")
                continue
            except PolicyConflict as exc:
                failures += 1
                self.stderr.write(f"{name}: not published: {exc}")
                continue
            verb = "published" if created else "already published (same content)"
            self.stdout.write(f"{name}: {verb} {policy.identity} [{policy.mode}, {policy.retry_authority}]")
        if failures:
            raise CommandError(f"{failures} of {len(files)} file(s) were not published")

"""How the admin shows a stored provider body: the desensitised form as stored (never raw PII,
which is not stored at all: dunning.privacy), or that the retention job purged it and when."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.utils.html import format_html


def _pretty(body: Any) -> str:
    if isinstance(body, (bytes, memoryview)):
        text = bytes(body).decode("utf-8", errors="replace")
        try:
            return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except ValueError:
            return text  # a rejected body that was not JSON, masked textually
    return json.dumps(body, indent=2, ensure_ascii=False)


class StoredBodyMixin:
    """For a view-only admin of a model with `RAW_BODY_FIELD` and `body_purged_at`: the body field
    itself is replaced by `stored_body`, which says "purged on …" once it was purged."""

    def get_exclude(self, request, obj=None):  # noqa: ANN001, ANN201
        return (*(super().get_exclude(request, obj) or ()), self.model.RAW_BODY_FIELD)

    def get_readonly_fields(self, request, obj=None):  # noqa: ANN001, ANN201
        return (*super().get_readonly_fields(request, obj), "stored_body")

    @admin.display(description="body (desensitised)")
    def stored_body(self, obj: Any) -> str:
        if obj.body_purged_at is not None:
            remains = ""
            if obj.RAW_BODY_FIELD == "payload":
                remains = format_html("<pre>{}</pre>", _pretty(obj.payload))
            return format_html('<p class="body-purged"><strong>Purged on {} UTC</strong> by the retention job '
                               '(RAW_BODY_RETENTION_DAYS); digests, receipts and facts are kept.</p>{}',
                               f"{obj.body_purged_at:%Y-%m-%d %H:%M}", remains)
        return format_html('<pre class="stored-body">{}</pre>', _pretty(getattr(obj, obj.RAW_BODY_FIELD)))

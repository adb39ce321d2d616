"""A request refused for a named reason: the one shape the services' refusal exceptions share.

`code` names the reason for callers that branch on it (an API status, a quarantine reason);
`detail` says it in plain words. Imports nothing of the project, so any layer may raise one.
"""

from __future__ import annotations

from typing import ClassVar


class CodedRefusal(Exception):
    # True: str() reads "CODE: detail" (for logs and quarantine notes); False: the detail alone,
    # for refusals whose text is shown to staff as it stands.
    code_in_message: ClassVar[bool] = False

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}" if self.code_in_message else detail)
        self.code = code
        self.detail = detail

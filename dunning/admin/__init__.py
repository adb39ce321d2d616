"""The support console: every admin page of the dunning product, the subscription page included.

Django's admin autodiscovery imports `dunning.admin`; each module below registers its pages."""

from dunning.admin import (  # noqa: F401  (registers the pages)
    alert_deliveries,
    alipay_records,
    duties,
    operations,
    records,
    rollout_page,
    subscription_page,
    usage_section,
)

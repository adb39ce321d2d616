"""Support console and customer billing page settings (SPEC §11, §12). Imported at the end of
config/settings.py."""

# Customers sign in to the billing pages with Django's own login (Customer.user links the two);
# staff use the admin's login.
LOGIN_URL = "billing-login"
LOGIN_REDIRECT_URL = "billing-home"
LOGOUT_REDIRECT_URL = "billing-login"

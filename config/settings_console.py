"""Support console and customer billing page settings (SPEC §11, §12). Imported at the end of
config/settings.py."""

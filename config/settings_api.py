"""REST API settings (SPEC §13). Imported at the end of config/settings.py."""

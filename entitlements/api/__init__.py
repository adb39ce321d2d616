"""The REST API for runtime services and staff (SPEC §13)."""

"""Customer billing pages (SPEC §12)."""

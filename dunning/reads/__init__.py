"""Reads: the cycle read, the review input and its pure verdicts."""

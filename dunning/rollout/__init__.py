"""The rollout as a program (SPEC §15, issue 19 item 1): status, promotion, rollback, forward
rebinding and the shadow report. Every write goes through these services."""

"""The acceptance service: its entry points (transitions, opening, subscription changes), the edges and
their guards, settlement (aggregate, snapshot, receipts, outbox), its input and result types, and
the pure rules it applies (aggregate, contract line)."""

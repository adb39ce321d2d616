"""Evidence: webhook intake, event processing and reprocessing, provider receipts and fresh fetches,
from a fresh invoice to a cycle's next edge, subscription import."""

"""Throughput, latency and scale bench for the dunning service (see bench/README.md)."""

"""The prompt cache's disk tier: snapshots that survive restarts (file format, index, writer)."""

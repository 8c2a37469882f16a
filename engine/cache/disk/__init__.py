"""The prompt cache's disk tier: snapshots that survive restarts.

format.py (file format, validation), index.py (the index), files.py (fsync, hashing),
hooks.py (writer observation points for tests), tier.py (`DiskCache`: API and writer thread).
"""

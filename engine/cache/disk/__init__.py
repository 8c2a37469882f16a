"""The prompt cache's disk tier: snapshots that survive restarts.

tier.py (`DiskCache`: API, opening a folder, reading), writer.py (its writer thread),
format.py (file format, validation), index.py (the index), files.py (fsync, hashing),
hooks.py (writer observation points for tests).
"""

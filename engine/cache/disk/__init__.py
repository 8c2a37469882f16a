"""The prompt cache's disk tier: snapshots that survive restarts.

tier.py (`DiskCache`: API, opening a folder, reading), writer.py (its writer thread),
pack.py (pack files of shared blocks, manifests), format.py (encodings, validation),
index.py (the index: manifests, packs, who uses what), files.py (fsync, hashing),
hooks.py (writer observation points for tests).
"""

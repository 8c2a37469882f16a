"""The prompt cache's disk tier: snapshots that survive restarts (tier.py's module doc has the
layout, the invariants and the threads).

tier.py (`DiskCache`: the front the prompt cache calls), folder.py (opening a folder: lock,
index file, stray files), index.py (the index and its frozen views: manifests, packs, who names
what; pure data), store.py (`DiskStore`: the index's one owner and the writer thread that does
its tasks), plan.py (what a save writes, pack ids), writer.py (`WriteQueue`: the writer's tasks
and the holds on them; it calls nothing of the store), packfiles.py (write, fsync, rename, read,
verify, delete; `PackMissing`, `BadPack`), reader.py (a snapshot read back), pack.py (pack files
of shared blocks, manifests), format.py (encodings, validation), files.py (fsync, hashing),
report.py (counters, warnings), hooks.py (writer observation points for tests).
"""

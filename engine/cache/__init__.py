"""The prompt cache: the exactness planner (planner.py), each cache class's rules (families.py),
snapshots (snapshot.py), block names (blocks.py), the front with the memory tier
(prompt_cache.py) and the disk tier's block store (disk/)."""

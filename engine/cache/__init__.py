"""The prompt cache: the exactness planner (planner.py) and snapshot metadata (meta.py), each
cache class's rules (families.py), snapshots (snapshot.py), the block idea (blocks.py: which
layers are kept in blocks, block names, how a save splits into packs) and blocks in memory
(block_state.py), the compute environment (env.py), the eviction order (eviction.py), cache
keys per namespace (namespace.py), the memory tier (memory_tier.py), the front over both
tiers (prompt_cache.py) and the disk tier (disk/)."""

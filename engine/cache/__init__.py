"""The prompt cache: the exactness planner, snapshots, the memory tier and the disk tier."""

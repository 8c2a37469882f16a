"""One model across several processes (machines) on MLX's distributed backend.

Started by `mlx.launch` (ring over TCP/Thunderbolt, JACCL over RDMA): every rank runs
`python -m engine serve`; rank 0 serves HTTP and leads, the others follow in lockstep.

Modules: group.py (the group, control collectives, the watchdog), shard.py (tensor/pipeline
sharding and why a model cannot be sharded), agree.py (the ranks agree on one restore point),
lockstep.py (the leader's executor, the followers' loop, the synced cancel flag),
report.py (each rank's cache report, gathered to rank 0), serve.py (the `serve` command).
"""

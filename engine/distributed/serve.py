"""`python -m engine serve` when started by mlx.launch on several ranks.

    mlx.launch -n 3 --backend ring -- python -m engine serve --model demo --cache-dir D

Every rank: join the group, load the model (rank 0 resolves it first, so a GGUF such as the
demo is imported once), shard it, check that all ranks hold the same model, keep its prompt
cache in D/rank-R-of-N. Rank 0 then serves HTTP through a `Leader`; the others `follow`.
Exit status: 0 after a clean stop (SIGINT/SIGTERM on any rank stops all), 2 when the model
cannot be loaded or sharded (every rank says why), 3 when the group failed (a peer died or
hung): then every rank exits non-zero. A rank whose parent (mlx.launch, or the ssh session it
runs in) is gone stops by itself within `PARENT_POLL_S` or so, as after a SIGTERM: a launcher
killed on its own leaves no rank behind serving.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Optional, Sequence, TypeVar

from engine.distributed.agree import AgreedPromptCache
from engine.distributed.group import EXIT_GROUP_FAILED, Group, GroupError, init_group, launched, rank_cache_dir
from engine.distributed.links import PeerLinks
from engine.distributed.lockstep import Leader, follow
from engine.distributed.shard import shard_model
from engine.errors import EngineError, VerbatimError

T = TypeVar("T")
PARENT_POLL_S = 1.0  # how often a rank checks that its launcher is still there


def watch_parent(on_gone: Callable[[], None], poll_s: float = PARENT_POLL_S) -> None:
    """Call `on_gone` once, from a daemon thread, when this process's parent has exited (the
    process was re-parented: getppid() changed)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)  # a poll, not a spin: the rank sleeps in between
        on_gone()

    threading.Thread(target=watch, name="verbatim-parent-watch", daemon=True).start()


def maybe_serve_distributed(args: argparse.Namespace, keys: Sequence[str] = ()) -> Optional[int]:
    """Serve as one rank of several when launched so; None when this is a single process.
    `keys`: the API keys rank 0's server accepts (each its own cache namespace)."""
    if not launched():
        return None
    try:
        group = init_group(args.rank_timeout)
    except GroupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if group.size == 1:
        return None
    return serve_rank(args, group, keys)


def _say(group: Group, msg: str) -> None:
    try:
        print(f"[rank {group.rank}/{group.size}] {msg}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # the launcher that read our output is gone: say nothing, go on
        pass


def on_every_rank(group: Group, fn: Callable[[], T], what: str) -> T:
    """Run `fn` on every rank; if it failed on any, raise on every rank (naming the rank)."""
    err = ""
    value: Any = None
    try:
        value = fn()
    except VerbatimError as e:
        err = str(e)
    except Exception as e:  # noqa: BLE001 - mlx-lm raises many kinds; all are reported
        err = f"{type(e).__name__}: {e}"
    failed = [(r, m.decode()) for r, m in enumerate(group.gather_bytes(err.encode(), what)) if m]
    if failed:
        r, m = failed[0]
        raise EngineError(m if r == group.rank else f"rank {r}: {m}")
    return value


def load_everywhere(group: Group, engine: Any, spec: str) -> Any:
    """The coordinated load: rank 0 resolves first, then every rank loads and shards; the
    ranks must end with the same model key (the same weights, options and sharding)."""
    from engine.models.resolve import resolve_model

    on_every_rank(group, lambda: resolve_model(spec) if group.rank == 0 else None, "resolve")
    info = on_every_rank(group, lambda: engine.load(spec), "load")
    keys = {k.decode() for k in group.gather_bytes(info.key.encode(), "model key")}
    if len(keys) > 1:
        raise EngineError(f"the ranks loaded different models ({len(keys)} model keys): every machine "
                          f"needs the same files for {spec!r}")
    return info


def _make_engine(args: argparse.Namespace, group: Group) -> Callable[[], Any]:
    from engine.engine import Engine
    from engine.paths import prompt_cache_dir

    root = args.cache_dir if args.cache_dir is not None else prompt_cache_dir()

    def make() -> Any:
        engine = Engine(cache_dir=rank_cache_dir(root, group.rank, group.size), use_disk=not args.no_cache,
                        chunk=args.chunk, context_length=args.context_length,
                        shard=lambda model: shard_model(model, group.group))
        # The same tiers, with a fetch that agrees on the restore point with the other ranks.
        engine.cache = AgreedPromptCache(group, engine.cache.budget_bytes, engine.cache.disk, engine.cache.memory.policy)
        return engine

    return make


def _close_stdin() -> None:
    """A rank reads nothing from its stdin: make it /dev/null, so a launcher that relays input
    to us sees its pipe closed (launch.py `_quiet_launcher`) instead of spinning on it."""
    try:
        fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
    except OSError:
        pass


def serve_rank(args: argparse.Namespace, group: Group, keys: Sequence[str] = ()) -> int:
    _close_stdin()
    if group.rank == 0:
        return _lead(args, group, keys)
    return _follow(args, group)


def _exit_now(group: Group, message: str) -> None:
    """The group is gone: say so and exit non-zero at once (MLX may hold this rank in a collective)."""
    _say(group, f"error: {message}")
    os._exit(EXIT_GROUP_FAILED)


def _follow(args: argparse.Namespace, group: Group) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    def orphaned() -> None:
        stop.set()  # this rank's stop vote: rank 0 then stops every rank
        _say(group, "the launcher is gone: stopping")

    watch_parent(orphaned)
    engine = _make_engine(args, group)()
    links = PeerLinks(group, lambda why: _exit_now(group, why))
    try:
        try:
            load_everywhere(group, engine, args.model)
        except EngineError as e:
            _say(group, f"error: {e}")
            return 2
        links.start()
        group.start_watchdog()
        _say(group, f"following rank 0 ({engine.info.name})")
        why = follow(group, engine, stop.is_set, links)
        _say(group, f"stopped: {why}")
        return 0
    except GroupError as e:
        _say(group, f"error: {e}")
        return EXIT_GROUP_FAILED
    finally:
        engine.close()
        import mlx.core as mx

        mx.clear_streams()  # as the engine thread does: MLX aborts at exit on streams left alive


def _lead(args: argparse.Namespace, group: Group, keys: Sequence[str]) -> int:
    from engine.serve.app import CONFIG_KEY
    from engine.serve.schema import ServedModel
    from engine.serve.server import ServeError, ServerHandle, serve_until_stopped

    stop_server: list[Callable[[], None]] = []
    links = PeerLinks(group, lambda why: None)

    def orphaned() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the clean stop a SIGTERM makes (serve_until_stopped)
        _say(group, "the launcher is gone: stopping")

    watch_parent(orphaned)

    def startup(engine: Any) -> Any:  # on the engine thread, before its first tick
        info = load_everywhere(group, engine, args.model)
        links.start()
        return info

    leader = Leader(group, _make_engine(args, group), startup, lambda error: [fn() for fn in stop_server],
                    links=links)
    # A follower's link closing fails the job in flight at once (the engine thread may be stuck).
    links.on_lost = lambda why: leader.fail(GroupError(f"the distributed group failed: {why}"))
    links.on_stop = leader.peer_stop
    try:
        info = leader.ready.result()
    except GroupError as e:
        _say(group, f"error: {e}")
        return EXIT_GROUP_FAILED
    except EngineError as e:
        _say(group, f"error: {e}")
        return 2
    group.start_watchdog(lambda why: leader.fail(GroupError(f"the distributed group failed: {why}")))
    try:
        handle = ServerHandle(leader, replace(ServedModel.of(info, args.model), chunk=args.chunk), args.host, args.port, None,
                              args.queue_limit, api_keys=keys, allow_origins=args.allow_origin, mode=args.mode, seed=args.seed,
                              max_body=args.max_body_mb << 20)
    except ServeError as e:
        _say(group, f"error: {e}")
        leader.shutdown(10)
        return 2
    handle.app[CONFIG_KEY].extra_status.update({"world_size": group.size, "rank_host": group.host})

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def stop_soon() -> None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the server has stopped already
                pass

        stop_server.append(stop_soon)
        if leader.error is not None:  # failed before the server could be told
            stop.set()

        def announce(url: str) -> None:
            _say(group, f"Verbatim server: {info.name} on {group.size} ranks at {url} (Ctrl-C to stop)")

        await serve_until_stopped(handle, announce, stop)

    code = 0
    try:
        asyncio.run(run())
    except ServeError as e:  # e.g. the port is taken: every rank stops
        _say(group, f"error: {e}")
        code = 2
    if leader.error is not None:  # the engine thread may be blocked in a collective for good
        _exit_now(group, str(leader.error))
    leader.shutdown(group.timeout_s)
    if leader.error is not None:
        _exit_now(group, str(leader.error))
    _say(group, "stopped")
    return code

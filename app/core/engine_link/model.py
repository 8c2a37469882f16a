"""The engine the window talks to (no Qt): the model loaded (or loading), the engine's prefill
chunk, and where it runs: in this process, or on a Verbatim server (`server`, a ServerLink,
watched while attached: is it still there, and with the same model?). Also the prompt cache's
numbers and the process's memory (engine/memory.py: the split, and the memory tier's budget the
user sets: `set_memory_budget`, applied at once and again after every load). The model picker, the status bar and the debug panel's store box bind
to its signals; the load, the connection and the watch are its own methods, so every decision
about these fields is made here.

Attached to a server, the engine on the engine thread is a `RemoteEngine` (engine/remote.py,
swapped in by `EngineExecutor.swap`): every other flow runs as it does in process. Loading a
local model swaps the in-process Engine back first.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from psygnal import Signal

from app.core.engine_link.models import discover, entry_name, entry_spec, model_label
from app.core.engine_link.template_default import default_system_prompt
from app.core.jobs import EngineJobs, mlx_memory, user_message
from app.core.notices import Notices
from app.core.store.session import ChatSession, ModelIdentity, ReplyMaker
from engine import remote
from engine.bridge import engine_swap
from engine.engine import ModelInfo
from engine.errors import Cancelled
from engine.memory import MemoryReport, default_memory_budget
from engine.models.resolve import ModelEntry
from engine.serve.schema import template_reads

log = logging.getLogger(__name__)

LINK_INTERVAL_S = 2.0  # how often a window attached to a server asks whether it still answers
NOT_SENT = "Not sent: "  # how the explanation of a send the unreachable server stopped begins


@dataclass(frozen=True)
class ServerLink:
    """The window's engine is a Verbatim server (engine/remote.py): where, and whether it answers."""

    url: str
    api_key: Optional[str]
    where: str  # "3 ranks at 127.0.0.1:8765" (RemoteEngine.placement)
    environment: dict[str, str] = field(default_factory=dict)  # the server's: its replies' receipts name it
    up: bool = True
    error: str = ""  # why it is not reachable (when not `up`)


class EngineLink:
    loading = Signal(str, str)  # spec (or a server's address), the name shown while it loads
    progress = Signal(float, str)  # fraction, what it is doing
    loaded = Signal(str, str, object)  # spec, name, ModelInfo: it answers from now on
    failed = Signal(str, str)  # why, the title of the error
    server_changed = Signal(object)  # Optional[ServerLink]: attached / reachability changed / detached
    stats_changed = Signal(dict, object)  # the prompt cache's numbers, MLX's memory (None: not read)
    models_found = Signal(list)  # list[ModelEntry]: the models found on this machine
    memory_changed = Signal(object)  # Optional[MemoryReport]: where the memory is (None: on a server, its own)

    def __init__(self, jobs: EngineJobs, session: ChatSession, notices: Notices, chunk: int = 512) -> None:
        self.jobs, self.session, self.notices = jobs, session, notices
        self.chunk = chunk  # the window's own prefill chunk (the in-process engine's)
        self.spec = ""
        self.name = ""
        self.info: Optional[ModelInfo] = None
        self.ready = False
        self.engine_chunk: Optional[int] = None  # the loaded engine's own (a server's may differ)
        self.template_reads: tuple[str, ...] = ()  # the request options the loaded model's template reads
        # The loaded model's template's own system prompt ('' none; None not known yet): what the
        # model gets when the conversation sets none (app/core/engine_link/template_default.py).
        self.template_system: Optional[str] = None
        self.server: Optional[ServerLink] = None  # set while the engine is a server
        self.interval = LINK_INTERVAL_S
        self.stats: dict[str, Any] = {}
        self.models: list[ModelEntry] = []  # found on this machine (discover): the picker, and "which model would"
        self.memory = 0  # MLX's active memory, as last read
        self.memory_report: Optional[MemoryReport] = None  # the process's memory split, as last read
        self.memory_budget: Optional[int] = None  # the memory tier's budget asked for (None: the engine's default)
        # Builds the in-process engine again after a server (the window's factory), and what to
        # load here when a server cannot be reached and no model is loaded (the window's last).
        self.make_local: Optional[Callable[[], Any]] = None
        self.fallback_spec: Optional[str] = None
        self._watching: Optional[object] = None  # the attachment the server's watch belongs to

    # ------------------------------------------------------------------------------ reading
    @property
    def maker(self) -> ReplyMaker:
        """What a reply made now is saved as made by: the model's name and key, the engine's chunk."""
        return ReplyMaker(self.name, self.info.key if self.info is not None else "", self.engine_chunk or self.chunk)

    @property
    def reachable(self) -> bool:
        """Whether a reply can start: not while the server the window is attached to is away."""
        return self.server is None or self.server.up

    def identity(self) -> Optional[ModelIdentity]:
        """The loaded model as a receipt names it (None while none is loaded)."""
        info = self.info
        if info is None or not self.ready:
            return None
        env = dict(self.server.environment) if self.server is not None and self.server.environment else None
        return ModelIdentity(self.spec, info.key, info.name, info.dequantized, env)

    def longer_context(self, tokens: int) -> Optional[tuple[str, int]]:
        """A model found on this machine whose context holds `tokens` (the shortest such, as its
        name and context length), other than the one loaded; None: none is."""
        loaded = self.info.context_length if self.info is not None else None
        fits = sorted((e.context_length, entry_name(e)) for e in self.models
                      if e.context_length and e.context_length >= tokens and entry_spec(e) != self.spec
                      and e.context_length != loaded)  # fmt: skip
        return (fits[0][1], fits[0][0]) if fits else None

    async def discover(self, extra_dirs: list[str]) -> None:
        """Find the models on this machine (reading files: a worker thread, never the engine's)."""
        try:
            found = await self.jobs.in_thread(discover, extra_dirs)
        except Exception as e:
            log.info("model discovery failed: %s", user_message(e))
            return
        if not self.jobs.closed:
            self.models = list(found)
            self.models_found.emit(list(found))

    # ------------------------------------------------------------------------------ loading
    def use_engines(self, make_local: Callable[[], Any], fallback_spec: Optional[str]) -> None:
        """How to build the in-process engine again after a server, and what to load here when a
        server cannot be reached and no model is loaded."""
        self.make_local, self.fallback_spec = make_local, fallback_spec

    def load(self, spec: str, name: Optional[str] = None, api_key: Optional[str] = None) -> None:
        """Load a model on the engine thread (a reply in progress is stopped first: `loading`);
        a spec that is a server's address (http://host:port) attaches to that server instead
        (`api_key`: its key)."""
        if remote.is_server_address(spec):
            self.connect(spec, api_key)
            return
        self.spec, self.name, self.ready, self.template_system = spec, name or model_label(spec), False, None
        self.loading.emit(spec, self.name)
        self.jobs.spawn(self._load(spec))

    async def _load(self, spec: str) -> None:
        loop = self.jobs.loop
        cancel = self.jobs.cancel_token()

        def progress(fraction: float, message: str) -> None:  # engine thread: every step goes to the loop
            try:
                loop.call_soon_threadsafe(self._progressed, float(fraction), str(message))
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

        budget = self.memory_budget

        def job(engine: Any) -> tuple[ModelInfo, dict[str, Any], int, Optional[int], tuple[str, ...]]:
            info = engine.load(spec, progress=progress, cancel=cancel)
            if budget is not None:  # an engine built again after a server starts with its default
                engine.set_memory_budget(budget)
            # The request options (reasoning_effort, ...) its chat template reads: the local server's.
            reads = template_reads(getattr(getattr(engine, "lm", None), "tokenizer", None))
            return info, engine.cache_stats(), mlx_memory(), getattr(engine, "chunk", None), reads

        try:
            if self.server is not None:  # attached to a server: the in-process engine comes back first
                await self._detach()
            info, stats, memory, chunk, reads = await self.jobs.call(job)
        except Exception as e:
            if not self.jobs.closed:
                self.ready, self.info = False, None
                self.failed.emit("loading cancelled" if isinstance(e, Cancelled) else user_message(e),
                                 "Cannot load the model")
            return
        finally:
            self.jobs.release(cancel)
        if self.jobs.closed:
            return
        self.spec, self.info, self.engine_chunk, self.ready = spec, info, chunk, True
        self.template_reads = reads
        self.fallback_spec = spec  # what a window whose server is gone at start loads instead
        self.jobs.spawn(self.preload_documents())  # the documents' states from disk, while nothing is asked
        # Move everything alive now (Qt, MLX, transformers: ~100k objects) out of the cyclic GC's
        # reach, so the full collections the GC pacer runs between replies stay short. Collect first
        # (once, while nothing is streaming) so the loader's garbage is freed rather than frozen.
        gc.collect()
        gc.freeze()
        self.loaded.emit(spec, self.name, info)
        self.jobs.spawn(self._find_template_system())
        self._show_stats(stats, memory)
        self.jobs.spawn(self.refresh_stats())  # the memory split with the model's weights in it

    def _progressed(self, fraction: float, message: str) -> None:
        if not self.jobs.closed:
            self.progress.emit(fraction, message)

    async def preload_documents(self) -> int:
        """After a load: the states of the documents this store's conversations have are read from
        the disk into memory (engine thread), so the first question about one after a restart
        restores it from memory; how many were read."""
        in_use = self.session.store.document_digests()
        if not in_use:
            return 0
        try:
            return int(await self.jobs.call(lambda engine: (engine.keep_documents(in_use),
                                                            engine.preload_documents())[1]))
        except Exception:  # another model, or no disk tier: nothing read ahead, nothing lost
            return 0

    async def _find_template_system(self) -> None:
        """Render the loaded model's template without a system message (engine thread): its own
        default system prompt, what Settings' placeholder shows the model gets."""
        try:
            text = await self.jobs.call(default_system_prompt)
        except Exception:
            text = None
        if not self.jobs.closed and self.ready:
            self.template_system = text

    # ------------------------------------------------------------------------------ a server
    def connect(self, url: str, api_key: Optional[str] = None) -> None:
        """Attach to the Verbatim server at `url`: from then on its model answers (one process or
        several ranks), through the same flows. If it cannot be reached, the model loaded before
        stays (and says so)."""
        previous = (self.spec, self.name, self.info) if self.ready else None
        self.ready, self.template_system = False, None
        self.loading.emit(url, f"the server at {url}")
        self.jobs.spawn(self._connect(url, api_key or None, previous))

    async def _connect(self, url: str, api_key: Optional[str],
                       previous: Optional[tuple[str, str, Optional[ModelInfo]]]) -> None:  # fmt: skip
        try:  # on the engine thread: connect; only then is the old engine closed and this one used
            engine = await engine_swap(self.jobs.executor, lambda: remote.connect(url, api_key), self.jobs.loop)
        except Exception as e:
            if not self.jobs.closed:
                self._not_connected(user_message(e), previous)
            return
        if self.jobs.closed:
            return
        info: ModelInfo = engine.info
        self.server = ServerLink(url, api_key, engine.placement, dict(engine.environment))
        # Named as here ("demo" -> "SmolLM2-135M-Instruct (demo)"): one label for the model's replies,
        # made here or on the server, and no header that changes when a regenerate runs on the other.
        self.spec, self.name, self.info = url, model_label(info.name), info
        self.engine_chunk = engine.chunk  # the server's chunk (None: one that does not say)
        self.ready = True
        self.loaded.emit(url, self.name, info)
        self.server_changed.emit(self.server)
        self.jobs.spawn(self._find_template_system())
        self.jobs.spawn(self.refresh_stats())
        self._watching = attachment = object()
        self.jobs.spawn(self._watch(self.server, attachment))

    def _not_connected(self, why: str, previous: Optional[tuple[str, str, Optional[ModelInfo]]]) -> None:
        if "(401)" in why:  # what to do here, not what an HTTP client sends
            why += ": enter the server's API key in Models → Connect to a Verbatim server…"
        if previous is not None and previous[2] is not None:  # still loaded: say so, keep it
            self.spec, self.name, self.info = previous
            self.ready = True
            self.loaded.emit(self.spec, self.name, self.info)
            self.notices.error("Cannot connect to the server", why)
        elif self.fallback_spec:  # e.g. at start, the remembered server is gone: work here meanwhile
            name = model_label(self.fallback_spec)
            self.notices.error("Cannot connect to the server", f"{why}. Using {name} on this computer "
                               "instead; Models → Connect to a Verbatim server… tries again.")
            self.load(self.fallback_spec, name)
        else:
            self.failed.emit(why, "Cannot connect to the server")

    async def _detach(self) -> None:
        assert self.make_local is not None, "the window gives the engine link its engine factory"
        await engine_swap(self.jobs.executor, self.make_local, self.jobs.loop)
        self.server, self._watching = None, None  # the server's watch ends by itself
        self.server_changed.emit(None)

    async def _watch(self, link: ServerLink, attachment: object) -> None:
        """Ask the server which model it serves every `interval` seconds, on a worker thread
        (never the engine thread: it is busy for a whole reply), until the window is closed or
        attached elsewhere; each change of reachability is told (`server_changed`)."""
        loop = self.jobs.loop

        def attached() -> bool:
            return not self.jobs.closed and self._watching is attachment and self.server is not None

        while attached():
            tick = loop.create_future()  # a timer on the loop (Qt may drive it: no running loop)
            loop.call_later(self.interval, lambda: tick.done() or tick.set_result(None))
            await tick
            if not attached():
                return
            try:
                key = await loop.run_in_executor(None, remote.probe, link.url, link.api_key)
            except Exception as e:
                self.link_down(user_message(e))
                continue
            if not attached():
                return
            assert self.server is not None
            served = self.info.key if self.info is not None else ""
            if key != served:  # restarted with another model: the replies would not be its
                self.link_down(f"the server at {link.url} now serves another model; "
                               "connect again (Models → Connect to a Verbatim server…)")
                continue
            if not self.server.up:
                self._link_up()

    def link_down(self, why: str) -> None:
        """The server stopped answering: Send waits (what is typed stays in the composer)."""
        s = self.server
        if s is not None and (s.up or s.error != why):
            self.server = replace(s, up=False, error=why)
            self.server_changed.emit(self.server)

    def _link_up(self) -> None:
        assert self.server is not None
        self.server = replace(self.server, up=True, error="")
        if self.notices.notice.startswith(NOT_SENT):  # it answers again: that explanation is stale
            self.notices.tell("")
        self.server_changed.emit(self.server)

    # ------------------------------------------------------------------------------ the cache
    async def refresh_stats(self, clear: bool = False) -> None:
        """The prompt cache's numbers and MLX's memory, from the engine thread (after `clear`ing
        the cache when asked)."""
        def job(engine: Any) -> tuple[dict[str, Any], int, Optional[MemoryReport]]:
            if clear:
                engine.clear_cache()
            return engine.cache_stats(), mlx_memory(), engine.memory_report()

        try:
            stats, memory, report = await self.jobs.call(job)
        except Exception:
            return  # no engine (it could not start, or it is closing): nothing to show
        self._show_stats(stats, memory)
        self._show_memory(report)

    def _show_memory(self, report: Optional[MemoryReport]) -> None:
        if self.jobs.closed:
            return
        self.memory_report = report
        self.memory_changed.emit(report)

    def set_memory_budget(self, budget: Optional[int]) -> None:
        """The memory tier's budget from now on, in bytes (None: the engine's default, sized to
        the machine): applied at once on the engine thread (a smaller one evicts at once) and after
        every load. A server's memory is its own: attached to one, this says so and changes nothing."""
        if self.server is not None:
            why = "The memory of a server is managed on that server: this window cannot change its budget."
            self.notices.status(why, 5000)
            self.notices.tell(why)
            return
        self.memory_budget = budget
        self.jobs.spawn(self._apply_memory_budget(budget))

    async def _apply_memory_budget(self, budget: Optional[int]) -> None:
        try:
            await self.jobs.call(lambda engine: engine.set_memory_budget(
                budget if budget is not None else default_memory_budget()))
        except Exception as e:
            if not self.jobs.closed:
                self.notices.error("The memory budget could not be changed", user_message(e))
            return
        await self.refresh_stats()

    def _show_stats(self, stats: dict[str, Any], memory: Optional[int]) -> None:
        if self.jobs.closed:
            return
        self.stats = stats
        if memory is not None:
            self.memory = memory
        self.stats_changed.emit(stats, memory)

    def clear_cache(self) -> None:
        if self.server is not None:
            why = "The prompt cache of a server is managed on that server: this window cannot clear it."
            self.notices.status(why, 5000)
            self.notices.tell(why)
            return
        self.jobs.spawn(self.refresh_stats(clear=True))
        self.notices.status("Prompt cache cleared", 3000)

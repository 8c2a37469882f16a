"""The chat's state in one Qt-free model, the events it tells, and the flows that wait on the
engine (the operations the widgets call on it, send, regenerate, edit, stop…, are in ops.py).

`ChatModel` holds what the window shows: the open conversation and its active path (as view
models, with each reply's runs), the *selected reply* (what Regenerate, Compare and Receipt act
on: the one clicked, else the last), the pending reply and its streamed text, the loaded model
and where it runs (in this process, or on a Verbatim server: `link`, app/core/engine_link/server_link.py).
It emits what changed (app/core/evented.py); widgets subscribe and send intents; nothing is
read back from a widget. Its fields are written by its own methods only (the flows in
engine_flows.py and the window call them), so every writer of a field is in the class. One reply:

    ops.send(chat, text)  session.begin_send (user message + placeholder committed first)
    -> _generate          engine_batches(executor, request, observe=ReplyRecorder)
                            engine thread: ReplyRecorder saves text + tokens every few seconds,
                            then the reply and its run (session.finish)
                            loop: each batch -> emit STREAM / PREFILL; the Done -> emit PATH
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, Optional

from app.core.composer.attachments import Attachments, token_cost
from app.core.generation.continuing import earlier_of, whole_result
from app.core.composer.context_budget import ContextBudget, budget_requests, measure_budget, refusal_text
from app.core.evented import Evented
from app.core.generation.replay import Replay, expect
from app.core.generation.reply_recorder import ReplyRecorder
from app.core.session import ChatSession, ChatSettings, PendingReply
from app.core.store import StoreError
from app.core.conversation.view_models import MessageVM, finished_text, progress_text, run_shown
from app.core.wording import hidden_note, user_message
from engine.bridge import Done, engine_batches, engine_call
from engine.documents.extract import Document
from engine.engine import ModelInfo
from engine.errors import ContextLengthError, ServerUnreachable
from engine.executor import EngineExecutor
from engine.types import CancelToken, GenerationResult, PrefillProgress, TokenEvent

DRAFT_DEBOUNCE_S = 0.3  # a draft is counted once typing pauses this long
LINK_INTERVAL_S = 2.0  # how often a window attached to a server asks whether it still answers
NOT_SENT = "Not sent: "  # how the explanation of a send the unreachable server stopped begins
COLD_RUNS_KEPT = 4  # the last cold runs (Verify's, Compare's): the other one reuses them

# Events (emit name, arguments):
PATH = "path"  # (vms): the active path changed (conversation opened, reply started or saved, variant)
SELECTED = "selected"  # (vm or None): the reply Regenerate / Compare / Receipt act on
PENDING = "pending"  # (PendingReply or None): a reply started / ended
STREAM = "stream"  # (reply_id, text, tokens): the pending reply's text so far (one per batch)
PREFILL = "prefill"  # (reply_id, done, total): prompt tokens in the cache so far
FINISHED = "finished"  # (PendingReply, GenerationResult): a reply ended and was saved
STATUS = "status"  # (text, ms)
ERROR = "error"  # (title, text)
BANNER = "banner"  # (text)
CONVERSATIONS = "conversations"  # (): titles or the list changed
STATS = "stats"  # (cache stats, MLX memory or None): after a reply, a load, a clear
DRAFT = "draft"  # (ContextBudget or None): the next prompt (the path shown + the draft) against the limit
LINK = "link"  # (ServerLink or None): attached to a server / its reachability changed / detached
RETURNED = "returned"  # (text): a send the engine refused was taken back: its text goes back to the composer
REPLAY = "replay"  # (reply_id, Replay): a regenerate expected to repeat its reply, as verified so far
RUNS = "runs"  # (dict reply id -> run index): the runs picked changed (the window keeps them for the next start)
NOTICE = "notice"  # (text): an explanation that stays in view, wrapped, until the next reply or conversation ('' clears)


@dataclass
class ServerLink:
    """The window's engine is a Verbatim server (engine/remote.py): where, and whether it answers."""

    url: str
    api_key: Optional[str]
    where: str  # "3 ranks at 127.0.0.1:8765" (RemoteEngine.placement)
    environment: dict[str, str] = field(default_factory=dict)  # the server's: its replies' receipts name it
    up: bool = True
    error: str = ""  # why it is not reachable (when not `up`)


@dataclass
class StreamState:
    """The pending reply as it streams (GUI thread)."""

    text: str = ""
    tokens: int = 0
    prefill: Optional[tuple[int, int]] = None



class ChatModel(Evented):
    """One window's chat: state, events, and the flows that wait on the engine.

    `spawn` runs a coroutine on the GUI's asyncio loop (`loop`); `default_settings` gives the
    settings of a conversation made by a first message."""

    def __init__(self, session: ChatSession, executor: EngineExecutor, loop: asyncio.AbstractEventLoop,
                 spawn: Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"],
                 default_settings: Callable[[], ChatSettings] = ChatSettings, chunk: int = 512,
                 batch_interval: float = 0.05, read_only: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.session = session
        self.executor = executor
        self.loop = loop
        self._spawn_on_loop = spawn
        self.default_settings = default_settings
        self.chunk = chunk
        self.engine_chunk: Optional[int] = None  # the loaded engine's own (a server's may differ)
        self.batch_interval = batch_interval
        self.read_only = read_only
        self.conv_id: Optional[int] = None
        self.vms: list[MessageVM] = []  # the active path
        self.selected_id: Optional[int] = None  # a reply the user picked (None: the last reply)
        self.runs_shown: dict[int, int] = {}  # reply id -> the run picked in its runs menu (else the latest)
        self.pending: Optional[PendingReply] = None
        self.stream = StreamState()
        self.replay: Optional[Replay] = None  # the pending regenerate's verification (app/core/generation/replay.py)
        self._stream_offset = 0  # a Continue: tokens of the reply before it (event indices start after)
        self.model_spec = ""
        self.model_name = ""
        self.model_info: Optional[ModelInfo] = None
        self.model_ready = False
        # The loaded model's template's own system prompt ('' none; None not known yet): what the
        # model gets when the conversation sets none (app/core/engine_link/template_default.py).
        self.template_system: Optional[str] = None
        self.cache_stats: dict[str, Any] = {}
        self.mlx_memory = 0
        self.verifying = False
        # The last cold runs (reply id -> model key, request, result, token texts): Verify's
        # is Compare's B side, and the other way round (app/core/engine_link/flows.py).
        self.cold_runs: dict[int, tuple[str, Any, GenerationResult, list[str]]] = {}
        self.draft = ""
        self.link: Optional[ServerLink] = None  # set while the engine is a server
        self.link_interval = LINK_INTERVAL_S
        # Builds the in-process engine again after the window was attached to a server (the window's).
        self.make_local_engine: Optional[Callable[[], Any]] = None
        # What to load here when a server cannot be reached and no model is loaded (the window's last).
        self.fallback_spec: Optional[str] = None
        self.budget: Optional[ContextBudget] = None  # the last count of the next prompt (DRAFT)
        self.budget_for: tuple[Optional[int], str] = (None, "")  # the conversation and draft it counted
        self._draft_timer: Optional[asyncio.TimerHandle] = None
        self._draft_seq = 0  # counts started; only the latest one's result is told
        # The files attached to the message being written (app/core/composer/attachments.py), and those
        # of the other conversations' composers while another is open (kept until quit).
        self.attachments = Attachments(loop, self._document_tokens, self.recount)
        self._stashed: dict[Optional[int], tuple[Document, ...]] = {}
        self.notice = ""  # the explanation in view (NOTICE): never only in the status bar, which elides
        self.closed = False
        self._cancel = CancelToken()  # the pending reply's
        self._tokens: "weakref.WeakSet[CancelToken]" = weakref.WeakSet()  # every live engine job's
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------------------ state
    @property
    def generating(self) -> bool:
        return self.pending is not None

    @property
    def stream_text(self) -> str:
        return self.stream.text

    @property
    def selected(self) -> Optional[MessageVM]:
        """The reply Regenerate / Compare / Receipt act on: the one picked, else the last one."""
        replies = [vm for vm in self.vms if vm.role == "assistant"]
        picked = next((vm for vm in replies if vm.id == self.selected_id), None)
        return picked or (replies[-1] if replies else None)

    def settings(self) -> ChatSettings:
        """The settings in force for the next send or new variant."""
        if self.conv_id is not None:
            try:
                return self.session.settings(self.conv_id)
            except StoreError:
                pass
        return self.default_settings()

    def cancel_token(self) -> CancelToken:
        """A token for a job on the engine thread; closing the window cancels it."""
        token = CancelToken()
        self._tokens.add(token)
        return token

    def release(self, token: CancelToken) -> None:
        """The job of `token` is over: closing the window need not cancel it."""
        self._tokens.discard(token)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> "asyncio.Task[Any]":
        task = self._spawn_on_loop(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """Await `fn(engine)` on the engine thread (after every job before it)."""
        return engine_call(self.executor, fn, self.loop)

    # ------------------------------------------------------------------------------ changes
    def reload(self) -> list[MessageVM]:
        """Read the active path (and its replies' runs) from the store and tell the views."""
        vms = self.session.view(self.conv_id) if self.conv_id is not None else []
        self.vms = [run_shown(vm, self.runs_shown[vm.id]) if vm.id in self.runs_shown else vm for vm in vms]
        if self.selected_id is not None and not any(vm.id == self.selected_id for vm in self.vms):
            self.selected_id = None
        self.emit(PATH, self.vms)
        self.emit(SELECTED, self.selected)
        self.recount()  # the meter counts this path + the draft
        return self.vms

    def tell(self, text: str) -> None:
        """An explanation the user must be able to read whole (why a send did not go, where a
        regenerate put the later turns): it stays until the next reply or conversation ('' clears)."""
        if text != self.notice:
            self.notice = text
            self.emit(NOTICE, text)

    def open(self, conv_id: Optional[int]) -> None:
        """Show a conversation (None: a new, empty one, made by its first message); the files
        attached in the composer stay with the conversation they were attached in."""
        if conv_id != self.conv_id:
            self.tell("")
            self._stashed[self.conv_id] = self.attachments.documents
            self.attachments.set(self._stashed.pop(conv_id, ()))
            self.spawn(self.attachments.recount())
        self.conv_id = conv_id
        self.selected_id = None  # the runs picked stay picked (reply ids are unique): reopened, shown
        self.reload()

    def follow_variant(self, message_id: int) -> None:
        """A sibling was made active: a picked reply follows it; the path is read again."""
        if self.selected_id is not None:
            self.selected_id = message_id
        self.reload()

    def begin_send(self, text: str) -> PendingReply:
        """Save `text` as a user message with the files attached to it (they leave the composer)
        and the reply's placeholder (session.begin_send; StoreError: nothing saved, nothing left)."""
        pending = self.session.begin_send(self.conv_id, text, self.model_name, self.default_settings(),
                                          documents=self.attachments.documents)
        self.attachments.clear()
        return pending

    def select(self, message_id: Optional[int]) -> None:
        """Pick the reply Regenerate / Compare / Receipt act on (a user message: ignored)."""
        vm = next((vm for vm in self.vms if vm.id == message_id), None)
        if vm is None or vm.role != "assistant" or self.selected_id == vm.id:
            return
        self.selected_id = vm.id
        self.emit(SELECTED, vm)

    def remember_runs(self, picked: dict[int, int]) -> None:
        """The runs picked in an earlier session (the window keeps them): shown as picked then."""
        self.runs_shown.update(picked)

    def show_run(self, reply_id: int, index: int) -> None:
        """Show one of a reply's runs (0: the first): the reply is selected, and its footer,
        badge and the debug panel all show that run until another is picked or a new run ends."""
        vm = next((vm for vm in self.vms if vm.id == reply_id), None)
        if vm is None or not 0 <= index < len(vm.runs):
            return
        self.runs_shown[reply_id] = index
        self.selected_id = reply_id
        self.emit(RUNS, dict(self.runs_shown))
        self.reload()

    # ----------------------------------------------------------------------------------- draft
    def set_draft(self, text: str) -> None:
        """The composer's text, as typed: the next prompt is counted again (`recount`)."""
        self.draft = text
        self.recount()

    def recount(self) -> None:
        """Count the next prompt (the path shown + the draft) once changes pause (DRAFT_DEBOUNCE_S),
        on the engine thread (the tokenizer belongs to the loaded model), against the limit in force
        (the conversation's own, never past the model's); then tell it (DRAFT). Called when the
        draft, the path, the settings or the model change; a count overtaken by a newer one is dropped."""
        if self.closed:
            return
        if self._draft_timer is not None:
            self._draft_timer.cancel()
        self._draft_seq += 1
        seq = self._draft_seq
        self._draft_timer = self.loop.call_later(DRAFT_DEBOUNCE_S, lambda: self.spawn(self._count(seq)))

    async def _count(self, seq: int) -> None:
        if self.closed or seq != self._draft_seq:
            return
        counted = (self.conv_id, self.draft)
        what = budget_requests(self.vms, self.draft, self.settings(), self.attachments.documents)
        budget: Optional[ContextBudget] = None
        if what is not None:
            try:
                budget = await self.call(lambda engine: measure_budget(engine, what))
            except Exception:  # no model loaded yet, or one that cannot render these messages
                budget = None
        if self.closed or seq != self._draft_seq:  # changed meanwhile: a newer count is coming
            return
        self.budget, self.budget_for = budget, counted
        self.emit(DRAFT, budget)

    # ----------------------------------------------------------------------------- documents
    def attach(self, paths: list[str]) -> "asyncio.Task[Any]":
        """Attach files to the message being written (read off the GUI thread; refusals told)."""
        return self.spawn(self.attachments.add(paths, already=self.path_documents()))

    def path_documents(self) -> tuple[Document, ...]:
        """The documents of the conversation shown, in the order the engine places them."""
        return tuple(d for vm in self.vms for d in vm.documents)

    async def _document_tokens(self, document: Document) -> Optional[int]:
        system = self.settings().system_prompt
        try:
            return await self.call(lambda engine: token_cost(engine, document, system))
        except Exception:  # no model loaded yet: the chip shows no count until one is
            return None

    def refusal(self, text: str) -> str:
        """Why sending `text` now would be refused ('' when it would not, as far as the last
        count of this conversation and this very text knows): the meter's warning."""
        b = self.budget
        if b is None or not b.refused or self.budget_for != (self.conv_id, text):
            return ""
        return b.warning

    # ----------------------------------------------------------------------------- one reply
    def _start(self, pending: PendingReply) -> None:
        pending.model_key = self.model_info.key if self.model_info is not None else ""
        pending.chunk = self.engine_chunk or self.chunk  # what the engine prefills with: receipts name it
        self.tell("")  # the next action: an earlier explanation is over
        self.pending = pending
        earlier, _ = earlier_of(pending)  # a Continue streams on from the reply so far
        self.stream = StreamState(pending.earlier_text, len(earlier))
        self._stream_offset = len(earlier)
        self.replay = self._expected_repeat(pending)
        self._cancel = self.cancel_token()
        self.conv_id = pending.conversation_id
        self.selected_id = pending.reply_id  # the new reply is the one shown and acted on
        picked = len(self.runs_shown)
        for rid in (pending.reply_id, pending.previous_id):  # a new run: the latest is shown
            self.runs_shown.pop(rid, None)  # type: ignore[arg-type]
        if len(self.runs_shown) != picked:
            self.emit(RUNS, dict(self.runs_shown))
        self.spawn(self._generate(pending, self._cancel))
        self.emit(PENDING, pending)
        self.emit(CONVERSATIONS)
        self.reload()
        if earlier:
            self.emit(STREAM, pending.reply_id, self.stream.text, self.stream.tokens)
        self.emit(STATUS, progress_text(pending.action, pending.request.sampler.seed), 0)
        if self.replay is not None:  # the previous reply's text, at once; verified as it streams
            self.emit(REPLAY, pending.reply_id, self.replay)

    def _expected_repeat(self, pending: PendingReply) -> Optional[Replay]:
        """The replay of the reply a regenerate should repeat (None: not expected to)."""
        if pending.action != "regenerate" or pending.previous_id is None:
            return None
        try:
            previous = self.session.message(pending.previous_id)
        except StoreError:
            return None
        key = self.model_info.key if self.model_info is not None else ""
        return expect(pending.action, pending.request.mode, key, previous)

    async def _generate(self, pending: PendingReply, cancel: CancelToken) -> None:
        """Generate `pending` on the engine thread (saved there), showing it as it streams."""
        recorder = ReplyRecorder(self.session, pending)
        result: Optional[GenerationResult] = None
        try:
            # Documents' states stay warm while a conversation has them (engine/cache/eviction.py).
            in_use = self.session.store.document_digests()
            await self.call(lambda engine: engine.keep_documents(in_use))
            async for batch in engine_batches(self.executor, pending.request, cancel, loop=self.loop,
                                              interval=self.batch_interval, observe=recorder):
                result = self._apply(pending, batch)
        except Exception as e:
            if not self.closed:
                self._end()
                if isinstance(e, ContextLengthError) and pending.action == "send" and not self.stream.text:
                    self._take_back(pending, e)
                    return
                self.reload()
                if isinstance(e, ServerUnreachable):
                    self.link_down(str(e))
                self.emit(ERROR, "The reply could not be generated", user_message(e))
            return
        finally:
            self.release(cancel)
        if self.closed or result is None:
            return
        result = whole_result(pending, result)
        replay = self.replay
        if replay is not None:  # confirmed (or not) only now that the engine's last token is in
            replay.end(len(result.tokens), result.finish_reason == "cancelled")
            self.emit(REPLAY, pending.reply_id, replay)
        self._end()
        twin = pending.duplicate_of
        self.selected_id = twin if twin is not None else pending.reply_id
        self.reload()
        self.emit(FINISHED, pending, result)
        note = f" · {hidden_note(pending.hidden)}" if pending.hidden else ""
        self.emit(STATUS, finished_text(result, pending.outcome or pending.message.outcome) + note, 8000)  # type: ignore[union-attr]
        if pending.hidden:  # a branch: said where it stays, not only in the status bar (which elides)
            hidden = hidden_note(pending.hidden)
            self.tell(f"{hidden[0].upper()}{hidden[1:]}.")
        if result.report.warnings:  # the engine hands each disk problem over once: keep it in view
            self.emit(BANNER, "Prompt cache: " + "; ".join(result.report.warnings)
                      + " Replies still work; the cache is kept in memory only.")  # fmt: skip
        await self.refresh_stats()

    def _take_back(self, pending: PendingReply, e: ContextLengthError) -> None:
        """The engine refused a send before any prefill (it did not fit; the meter had not
        counted it yet): the user's message leaves the conversation and goes back to the composer."""
        text = str(pending.request.messages[-1].get("content", "")) if pending.request.messages else ""
        mine = pending.request.documents[len(pending.request.documents) - self._own_documents(pending):]
        try:
            if self.session.withdraw(pending):
                self.conv_id = None  # the send had made the conversation: it is gone with it
        except StoreError:
            pass
        self.reload()
        self.emit(CONVERSATIONS)
        self.emit(RETURNED, text)
        if mine:  # the files sent with it go back too
            self.attachments.set(mine)
            self.spawn(self.attachments.recount())
        limit = self.settings().context_length if self.conv_id is not None else self.default_settings().context_length
        model = self.model_info.context_length if self.model_info is not None else None
        self.emit(ERROR, "Not sent", refusal_text(e.prompt_tokens, e.max_tokens, e.context_length, limit, model))

    def _own_documents(self, pending: PendingReply) -> int:
        """How many of the request's documents the user message itself carries."""
        try:
            return len(self.session.store.documents([pending.user_id]).get(pending.user_id, []))
        except StoreError:
            return 0

    async def refresh_stats(self, clear: bool = False) -> None:
        """The prompt cache's numbers and MLX's memory, from the engine thread (after `clear`ing
        the cache when asked)."""
        def job(engine: Any) -> tuple[dict[str, Any], int]:
            if clear:
                engine.clear_cache()
            return engine.cache_stats(), mlx_memory()

        try:
            stats, memory = await self.call(job)
        except Exception:
            return  # no engine (it could not start, or it is closing): nothing to show
        self.show_stats(stats, memory)

    # ------------------------------------------------- the model, its engine and its server
    # Written here only: the flows in app/core/engine_link/flows.py and the window call these.
    def use_engines(self, make_local: Callable[[], Any], fallback_spec: Optional[str]) -> None:
        """How to build the in-process engine again after a server (the window's factory), and
        what to load here when a server cannot be reached and no model is loaded."""
        self.make_local_engine = make_local
        self.fallback_spec = fallback_spec

    def set_fallback(self, spec: str) -> None:
        """The local model a window whose server is gone at start loads instead."""
        self.fallback_spec = spec

    def model_loading(self, spec: str, name: str) -> None:
        """A load (or a connection) began: no model answers until it ends."""
        self.model_spec, self.model_name, self.model_ready = spec, name, False
        self.template_system = None

    def set_template_system(self, text: Optional[str]) -> None:
        """The loaded model's template's own system prompt, once rendered ('' when it adds none)."""
        self.template_system = text

    def model_lost(self) -> None:
        """A load failed or was cancelled: nothing is loaded."""
        self.model_ready, self.model_info = False, None

    def model_loaded(self, spec: str, name: str, info: ModelInfo, chunk: Optional[int]) -> None:
        """`info` answers from now on; `chunk` is its engine's prefill chunk (None: not told)."""
        self.model_spec, self.model_name, self.model_info = spec, name, info
        self.engine_chunk = chunk
        self.model_ready = True
        if self.attachments.items:  # another tokenizer: the chips' counts change
            self.spawn(self.attachments.recount())

    def model_kept(self, spec: str, name: str, info: ModelInfo) -> None:
        """A connection failed and the model loaded before still answers (its chunk unchanged)."""
        self.model_spec, self.model_name, self.model_info = spec, name, info
        self.model_ready = True

    def attached(self, link: ServerLink) -> None:
        """The engine is now the server at `link` (told with the model: LINK after MODEL)."""
        self.link = link

    def detached(self) -> None:
        """The in-process engine is back; the server's watch ends by itself."""
        self.link = None
        self.emit(LINK, None)

    def link_up(self, link: ServerLink) -> None:
        """The server at `link` answers again (with the model the window knows)."""
        if self.link is link:
            link.up, link.error = True, ""
            if self.notice.startswith(NOT_SENT):  # it answers again: that explanation is stale
                self.tell("")
            self.emit(LINK, link)

    def set_verifying(self, verifying: bool) -> None:
        """A cold run of Verify is running (the debug panel's button waits)."""
        self.verifying = verifying

    def keep_cold_run(self, reply_id: int, request: Any, result: GenerationResult, pieces: list[str]) -> None:
        """Keep a reply's cold run (the last COLD_RUNS_KEPT): Verify's is Compare's B side."""
        info = self.model_info
        self.cold_runs.pop(reply_id, None)
        self.cold_runs[reply_id] = (info.key if info is not None else "", request, result, pieces)
        while len(self.cold_runs) > COLD_RUNS_KEPT:
            self.cold_runs.pop(next(iter(self.cold_runs)))

    def link_down(self, why: str) -> None:
        """The server stopped answering: Send waits (what is typed stays in the composer)."""
        link = self.link
        if link is not None and (link.up or link.error != why):
            link.up, link.error = False, why
            self.emit(LINK, link)

    def show_stats(self, stats: dict[str, Any], memory: Optional[int]) -> None:
        if self.closed:
            return
        self.cache_stats = stats
        if memory is not None:
            self.mlx_memory = memory
        self.emit(STATS, stats, memory)

    def _apply(self, pending: PendingReply, batch: list[Any]) -> Optional[GenerationResult]:
        """One batch of events: the streamed text and progress, told once per batch."""
        s = self.stream
        pieces: list[str] = []
        result: Optional[GenerationResult] = None
        replay = self.replay
        for event in batch:
            if isinstance(event, TokenEvent):
                pieces.append(event.text)
                s.tokens = self._stream_offset + event.index + 1
                if replay is not None:
                    replay.feed(event.index, event.token, event.logprob, event.text)
            elif isinstance(event, PrefillProgress):
                s.prefill = (event.done, event.total)
            elif isinstance(event, Done):
                result = event.result
        if self.closed or self.pending is not pending:
            return result
        if pieces:  # the last batch too: what streamed is what was generated
            s.text += "".join(pieces)
            self.emit(STREAM, pending.reply_id, s.text, s.tokens)
            if replay is not None:  # once a batch, as the text: the count shown follows the engine
                self.emit(REPLAY, pending.reply_id, replay)
        elif s.prefill is not None and not s.text:
            self.emit(PREFILL, pending.reply_id, *s.prefill)
        return result

    def _end(self) -> None:
        pending = self.pending
        self.pending = None
        self.stream = StreamState()
        self.replay = None
        self.emit(PENDING, None)
        if pending is not None:
            self.emit(CONVERSATIONS)

    # ----------------------------------------------------------------------------- shutdown
    def shutdown(self, timeout: float) -> bool:
        """Cancel every engine job (a reply in progress is saved as interrupted on the engine
        thread), wait for the engine thread and close the Engine. False if it did not end in time."""
        self.closed = True
        if self._draft_timer is not None:
            self._draft_timer.cancel()
        for token in list(self._tokens):
            token.cancel()
        ended = self.executor.shutdown(timeout)
        for task in list(self._tasks):  # their jobs are over: let the coroutines go
            task.cancel()
        return ended


def mlx_memory() -> int:
    """MLX active memory in bytes (engine thread), 0 if unknown."""
    try:
        import mlx.core as mx

        return int(mx.get_active_memory())
    except Exception:
        return 0

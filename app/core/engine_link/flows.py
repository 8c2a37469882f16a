"""The chat model's other engine work: load a model (or attach to a Verbatim server), verify a
reply cold, clear the cache, the inspector's token texts and cold runs. Functions over `ChatModel`
(app/core/chat.py) that wait on the engine thread through the bridge and tell the views by events.

Attached to a server (`load_model` with an http(s):// spec), the engine on the engine thread is a
`RemoteEngine` (engine/remote.py, swapped in by `EngineExecutor.swap`): every other flow runs as
it does in process. Loading a local model swaps the in-process Engine back first.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Optional

from app.core.engine_link import server_link
from app.core.chat import ERROR, LINK, STATUS, ChatModel, ServerLink, mlx_memory
from app.core.ops import stop
from app.core.engine_link.models import model_label
from app.core.session import ModelIdentity
from app.core.engine_link.template_default import default_system_prompt
from app.core.store import StoreError
from app.core.conversation.view_models import verify_text
from app.core.wording import user_message
from engine.engine import ModelInfo
from engine import remote
from engine.errors import Cancelled
from engine.bridge import engine_swap
from engine.types import Comparison, GenerationRequest, GenerationResult

# Events (emit name, arguments):
MODEL = "model"  # ("loading", spec, name) | ("progress", fraction, message) | ("loaded", spec, name, info)
#                  | ("failed", message[, title])
VERIFY = "verify"  # (reply_id, text): a cold run's verdict; text None while it runs


def load_model(chat: ChatModel, spec: str, name: Optional[str] = None, api_key: Optional[str] = None) -> None:
    """Load a model on the engine thread (a reply in progress is stopped first); a spec that is
    a server's address (http://host:port) attaches to that server instead (`api_key`: its key)."""
    if remote.is_server_address(spec):
        connect_server(chat, spec, api_key)
        return
    stop(chat)  # a reply in progress ends first (saved as interrupted)
    chat.model_loading(spec, name or model_label(spec))
    chat.emit(MODEL, "loading", spec, chat.model_name)
    chat.spawn(_load(chat, spec))


async def _load(chat: ChatModel, spec: str) -> None:
    progress = Throttled(chat.loop, lambda f, m: chat.closed or chat.emit(MODEL, "progress", f, m),
                         chat.batch_interval)
    cancel = chat.cancel_token()

    def job(engine: Any) -> tuple[ModelInfo, dict[str, Any], int, Optional[int]]:
        info = engine.load(spec, progress=progress, cancel=cancel)
        return info, engine.cache_stats(), mlx_memory(), getattr(engine, "chunk", None)

    try:
        if chat.link is not None:  # attached to a server: the in-process engine comes back first
            await _detach(chat)
        info, stats, memory, chunk = await chat.call(job)
    except Exception as e:
        if not chat.closed:
            chat.model_lost()
            chat.emit(MODEL, "failed", "loading cancelled" if isinstance(e, Cancelled) else user_message(e))
        return
    finally:
        chat.release(cancel)
    if chat.closed:
        return
    chat.model_loaded(spec, chat.model_name, info, chunk)
    chat.spawn(preload_documents(chat))  # the documents' states from disk, while nothing is asked yet
    # Move everything alive now (Qt, MLX, transformers: ~100k objects) out of the cyclic GC's
    # reach, so the full collections the GC pacer runs between replies stay short. Collect first
    # (once, while nothing is streaming) so the loader's garbage is freed rather than frozen.
    gc.collect()
    gc.freeze()
    chat.emit(MODEL, "loaded", spec, chat.model_name, info)
    chat.recount()  # the new model's tokenizer and context
    chat.spawn(find_template_system(chat))
    chat.show_stats(stats, memory)


async def preload_documents(chat: ChatModel) -> int:
    """After a load: the states of the documents this store's conversations have are read from
    the disk into memory (engine thread), so the first question about one after a restart
    restores it from memory; how many were read."""
    in_use = chat.session.store.document_digests()
    if not in_use:
        return 0
    try:
        return int(await chat.call(lambda engine: (engine.keep_documents(in_use), engine.preload_documents())[1]))
    except Exception:  # another model, or no disk tier: nothing read ahead, nothing lost
        return 0


async def find_template_system(chat: ChatModel) -> None:
    """Render the loaded model's template without a system message (engine thread): its own
    default system prompt, what Settings' placeholder shows the model gets."""
    try:
        text = await chat.call(default_system_prompt)
    except Exception:
        text = None
    if not chat.closed and chat.model_ready:
        chat.set_template_system(text)


async def _detach(chat: ChatModel) -> None:
    assert chat.make_local_engine is not None, "the window gives the chat model its engine factory"
    await engine_swap(chat.executor, chat.make_local_engine, chat.loop)
    chat.detached()


def connect_server(chat: ChatModel, url: str, api_key: Optional[str] = None) -> None:
    """Attach to the Verbatim server at `url`: from then on its model answers (one process or
    several ranks), through the same flows. If it cannot be reached, the model loaded before
    stays (and says so)."""
    stop(chat)
    previous = (chat.model_spec, chat.model_name, chat.model_info) if chat.model_ready else None
    chat.model_loading(chat.model_spec, chat.model_name)
    chat.emit(MODEL, "loading", url, f"the server at {url}")
    chat.spawn(_connect(chat, url, api_key or None, previous))


async def _connect(chat: ChatModel, url: str, api_key: Optional[str],
                   previous: Optional[tuple[str, str, Optional[ModelInfo]]]) -> None:
    try:  # on the engine thread: connect; only then is the old engine closed and this one used
        engine = await engine_swap(chat.executor, lambda: remote.connect(url, api_key), chat.loop)
    except Exception as e:
        if chat.closed:
            return
        why = user_message(e)
        if "(401)" in why:  # what to do here, not what an HTTP client sends
            why += ": enter the server's API key in Models → Connect to a Verbatim server…"
        if previous is not None and previous[2] is not None:  # still loaded: say so, keep it
            spec, name, kept = previous
            chat.model_kept(spec, name, kept)
            chat.emit(MODEL, "loaded", spec, name, kept)
            chat.emit(ERROR, "Cannot connect to the server", why)
        elif chat.fallback_spec:  # e.g. at start, the remembered server is gone: work here meanwhile
            name = model_label(chat.fallback_spec)
            chat.emit(ERROR, "Cannot connect to the server", f"{why}. Using {name} on this computer "
                      "instead; Models → Connect to a Verbatim server… tries again.")
            load_model(chat, chat.fallback_spec, name)
        else:
            chat.emit(MODEL, "failed", why, "Cannot connect to the server")
        return
    if chat.closed:
        return
    info: ModelInfo = engine.info
    link = ServerLink(url, api_key, engine.placement, dict(engine.environment))
    chat.attached(link)
    # Named as here ("demo" -> "SmolLM2-135M-Instruct (demo)"): one label for the model's replies,
    # made here or on the server, and no header that changes when a regenerate runs on the other.
    name = model_label(info.name)
    chat.model_loaded(url, name, info, engine.chunk)  # the server's chunk (None: one that does not say)
    chat.emit(MODEL, "loaded", url, name, info)
    chat.emit(LINK, link)
    chat.recount()  # the server's tokenizer and context
    chat.spawn(find_template_system(chat))
    chat.spawn(chat.refresh_stats())
    chat.spawn(server_link.watch(chat, link))


class Throttled:
    """A progress callback (fraction, message) for a worker thread (an `engine.types.Progress`):
    `fn` is called on `loop`, at most every `interval` seconds; the last step (fraction 1) always."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fn: Callable[[float, str], Any], interval: float) -> None:
        self.loop, self.fn, self.interval = loop, fn, interval
        self._last = 0.0
        self._lock = threading.Lock()

    def __call__(self, fraction: float, message: str) -> None:
        now = time.perf_counter()
        with self._lock:
            if fraction < 1.0 and now - self._last < self.interval:
                return
            self._last = now
        try:
            self.loop.call_soon_threadsafe(self.fn, float(fraction), str(message))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


def verify(chat: ChatModel, reply_id: int) -> None:
    """Generate a stored reply again with no cache at all and compare token by token."""
    try:
        request, _, _ = chat.session.verify_inputs(reply_id)
        stored = chat.session.message(reply_id).as_result()
    except StoreError as e:
        chat.emit(VERIFY, reply_id, str(e))
        return
    chat.set_verifying(True)
    chat.emit(VERIFY, reply_id, None)
    chat.spawn(_verify(chat, reply_id, request, stored))


async def _verify(chat: ChatModel, reply_id: int, request: GenerationRequest, stored: GenerationResult) -> None:
    """Engine.verify's comparison, made here from its cold run, which Compare then reuses."""
    try:
        cold, _, cancelled = await _run_cold(chat, reply_id, request)
        text = "failed: verification cancelled" if cancelled else \
            verify_text(Comparison.of(stored.tokens, stored.logprobs, cold.tokens, cold.logprobs))
    except Exception as e:
        text = f"failed: {user_message(e)}"
    chat.set_verifying(False)
    if not chat.closed:
        chat.emit(VERIFY, reply_id, text)


async def _run_cold(chat: ChatModel, reply_id: int, request: GenerationRequest
                    ) -> tuple[GenerationResult, list[str], bool]:
    """The one cold-run job (Verify's and Compare's): `request` with no cache at all, on the
    engine thread, and its token texts; kept for the other one unless it was cancelled (the
    window closed). Returns (result, token texts, cancelled)."""
    cancel = chat.cancel_token()

    def job(engine: Any) -> tuple[GenerationResult, list[str]]:
        result = engine.cold_run(request, cancel)
        return result, engine.token_texts(result.tokens)

    try:
        result, pieces = await chat.call(job)
    finally:
        chat.release(cancel)
    if not cancel.cancelled:
        chat.keep_cold_run(reply_id, request, result, pieces)
    return result, pieces, cancel.cancelled


def clear_cache(chat: ChatModel) -> None:
    if chat.link is not None:
        why = "The prompt cache of a server is managed on that server: this window cannot clear it."
        chat.emit(STATUS, why, 5000)
        chat.tell(why)
        return
    chat.spawn(chat.refresh_stats(clear=True))
    chat.emit(STATUS, "Prompt cache cleared", 3000)


# ------------------------------------------------------------------------------- the inspector
def model_identity(chat: ChatModel) -> Optional[ModelIdentity]:
    """The loaded model as a receipt names it (None while none is loaded)."""
    info = chat.model_info
    if info is None or not chat.model_ready:
        return None
    env = dict(chat.link.environment) if chat.link is not None and chat.link.environment else None
    return ModelIdentity(chat.model_spec, info.key, info.name, info.dequantized, env)


async def token_pieces(chat: ChatModel, tokens: list[int], model_key: Optional[str]) -> Optional[list[str]]:
    """Each token's text, when the loaded model made the reply (else None: ids are shown)."""
    model = model_identity(chat)
    if not tokens or model_key is None or model is None or model_key != model.key:
        return None
    try:
        return await chat.call(lambda e: e.token_texts(tokens))
    except Exception:
        return None


def _cold_request(chat: ChatModel, reply_id: int) -> GenerationRequest:
    m = chat.session.message(reply_id)
    key = m.model_key or (m.report.model_key if m.report else None)
    model = model_identity(chat)
    if model is None or key != model.key:
        raise StoreError("a cold run needs the model that made this reply loaded")
    request, _, _ = chat.session.verify_inputs(reply_id)
    if m.status == "interrupted":  # run cold as far as it got
        request = replace(request, context_policy="refuse", context_length=None)
    return request


def has_cold_run(chat: ChatModel, reply_id: int) -> bool:
    """Whether a cold run of this reply's request, by the loaded model, was made already."""
    kept = chat.cold_runs.get(reply_id)
    try:
        return kept is not None and chat.model_info is not None and kept[0] == chat.model_info.key \
            and kept[1] == _cold_request(chat, reply_id)
    except StoreError:
        return False


async def cold_run(chat: ChatModel, reply_id: int) -> tuple[GenerationRequest, GenerationResult, list[str]]:
    """A stored reply's request run with no cache at all (as far as a stopped reply got), and
    its token texts; the one Verify (or a Compare) just made when there is one. Needs the model
    that made the reply."""
    request = _cold_request(chat, reply_id)
    if has_cold_run(chat, reply_id):
        _, _, result, pieces = chat.cold_runs[reply_id]
        return request, result, pieces
    result, pieces, _ = await _run_cold(chat, reply_id, request)
    return request, result, pieces

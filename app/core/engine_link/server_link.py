"""The window attached to a Verbatim server: how the chat model learns that the server stopped
answering, or answers again.

While `chat.link` is set (engine_flows.connect_server), `watch` asks the server which model it
serves every `chat.link_interval` seconds, on a worker thread (never the engine thread: it is
busy for a whole reply), and tells each change as a LINK event: the window then shows the server
as gone, keeps Send waiting (what is typed stays in the composer) and shows it back when it
answers again. A reply that fails because the server went away says so at once
(`ChatModel.link_down`), without waiting for the next probe.
"""

from __future__ import annotations

from app.core.chat import ChatModel, ServerLink
from app.core.wording import user_message
from engine.remote import probe


async def watch(chat: ChatModel, link: ServerLink) -> None:
    """Probe the server of `link` until the chat is closed or attached elsewhere."""
    while not chat.closed and chat.link is link:
        tick = chat.loop.create_future()  # a timer on the chat's loop (Qt may drive it: no running loop)
        chat.loop.call_later(chat.link_interval, lambda: tick.done() or tick.set_result(None))
        await tick
        if chat.closed or chat.link is not link:
            return
        try:
            key = await chat.loop.run_in_executor(None, probe, link.url, link.api_key)
        except Exception as e:
            chat.link_down(user_message(e))
            continue
        if chat.link is not link:
            return
        served = chat.model_info.key if chat.model_info is not None else ""
        if key != served:  # restarted with another model: the replies would not be its
            chat.link_down(f"the server at {link.url} now serves another model; "
                           "connect again (Models → Connect to a Verbatim server…)")
            continue
        if not link.up:
            chat.link_up(link)
            chat.recount()

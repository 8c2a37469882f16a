"""What an error message may repeat of the request: a short, escaped prefix (`quote`).

An error names what was wrong ("the model 'x' does not exist"), but never echoes the input
whole: a 2 MB model name must not come back as 6 MB of escapes, nor any control character or
markup come back raw. Also the checks on the fields inside a chat message (`message_fields`).
"""

from __future__ import annotations

from typing import Any, Optional

QUOTE_CHARS = 64  # characters of client input an error message repeats at most


def _escaped(text: str, limit: int) -> tuple[str, bool]:
    """The longest prefix of `text` whose escaped form (printable ASCII) fits `limit` characters."""
    out, n = [], 0
    for ch in text[: limit + 1]:
        e = ascii(ch)[1:-1]
        if n + len(e) > limit:
            return "".join(out), True
        out.append(e)
        n += len(e)
    return "".join(out), False


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """`value` as a short printable-ASCII literal: 'abc', 'é' as '\\xe9', long ones cut ('...')."""
    text, cut = _escaped(value if isinstance(value, str) else repr(value), limit)
    return f"'{text}'" + ("... (cut)" if cut else "")


def bare(value: Any, limit: int = QUOTE_CHARS) -> str:
    """A field name for a message or `param`: `quote` without the quotes ('x...' for long ones)."""
    text, cut = _escaped(value if isinstance(value, str) else repr(value), limit)
    return text + ("..." if cut else "")


def clip(message: str, limit: int = 4 * QUOTE_CHARS) -> str:
    """An error message from deeper down (the engine's checks quote what they were given):
    escaped to printable ASCII and cut, as `quote` does for one value."""
    text, cut = _escaped(message, limit)
    return text + ("... (cut)" if cut else "")


# The fields a chat message may carry here: an assistant's `tool_calls` and a tool result's
# `tool_call_id` are rendered by the chat template (engine/serve/tools.py checks them), and so is
# `name` (OpenAI: the participant's name) by templates that use it. Any other would change the
# prompt the model sees and is not rendered: refused, naming the field, rather than silently dropped.
MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")  # the last two: tools.py checks them


def message_fields(m: dict[str, Any], i: int) -> Optional[tuple[str, str]]:
    """(message, param) of a 400 naming the first field of messages[i] not in MESSAGE_FIELDS; None if there is none (schema.py raises it: this module imports nothing of ours)."""
    extra = sorted(k for k in m if k not in MESSAGE_FIELDS)
    if not extra:
        return None
    name = f"messages[{i}].{bare(extra[0])}"
    return (f"{name} is not supported by this server (a message carries only 'role', 'content', 'name', "
            "and 'tool_calls' or 'tool_call_id' here)",
            name)

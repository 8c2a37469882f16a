"""Tools and structured output in a request (issue 30): OpenAI's chat fields in.

`tools`, `tool_choice`, `parallel_tool_calls`, `response_format` become the request's
`Constraint` (engine/constraint.py checks them, naming the field); assistant messages with
`tool_calls` and `tool` messages are read into the conversation, and every tool result must
answer a call made before it. All refused with a 400 before the engine sees the request. The
other wire formats (engine/serve/formats/) write their own tools in this shape first. The
reply's calls are read out of its text by engine/serve/reply.py.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from engine.constraint import Constraint, check_tool_results, tool_message_keys
from engine.errors import RequestError


def constraint_of(body: dict[str, Any]) -> Optional[Constraint]:
    """The request's tools and response format, checked (RequestError naming the field: the
    schema answers it as a 400)."""
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise RequestError(f"'{legacy}' (OpenAI's deprecated function calling) is not supported: "
                               "send 'tools' and 'tool_choice'", legacy)
    return Constraint.of(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"),
                         body.get("response_format"))


def message_extras(m: dict[str, Any], i: int) -> dict[str, Any]:
    """An assistant message's `tool_calls` or a tool message's `tool_call_id`, checked."""
    return tool_message_keys(m, i)


def check_results(messages: Sequence[dict[str, Any]]) -> None:
    """Every tool result answers a call made before it."""
    check_tool_results(messages)

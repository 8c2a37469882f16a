"""What system prompt the model gets when the conversation sets none: its chat template's own
default, found by rendering the template (no Qt; the engine thread runs `default_system_prompt`).

Some templates put a system message in when the messages have none (SmolLM2's: "You are a helpful
AI assistant named SmolLM, trained by Hugging Face"); most add nothing. Rendered twice, once with
a system message and once without, the text where the system message goes is that default.
"""

from __future__ import annotations

from typing import Any, Optional

SYSTEM_MARK = "QQSYSTEMQQ"  # plain letters: every tokenizer gives them back as written
USER_MARK = "QQUSERQQ"


def rendered(engine: Any, messages: list[dict[str, str]]) -> str:
    """The prompt text the template makes of `messages` (through token ids: local or on a server)."""
    return "".join(engine.token_texts(engine.prompt_ids(messages)))


def default_system_prompt(engine: Any) -> Optional[str]:
    """The template's own system prompt ('' when it adds none); None when it cannot be told
    (a template that refuses a system message, no model loaded)."""
    try:
        without = rendered(engine, [{"role": "user", "content": USER_MARK}])
        with_ = rendered(engine, [{"role": "system", "content": SYSTEM_MARK}, {"role": "user", "content": USER_MARK}])
    except Exception:
        return None
    if SYSTEM_MARK not in with_ or USER_MARK not in with_ or USER_MARK not in without:
        return None
    before, _, after = with_.partition(SYSTEM_MARK)
    between = after.partition(USER_MARK)[0]  # the system message's end and the user's header
    head = without.partition(USER_MARK)[0]
    if not head.startswith(before) or not head.endswith(between) or len(head) < len(before) + len(between):
        return ""  # no system block where the system message would go: the template adds none
    return head[len(before):len(head) - len(between)].strip()


def placeholder(default: Optional[str]) -> str:
    """The Settings system-prompt field's placeholder: what the model gets while it is empty."""
    if default is None:
        return "None set: the model gets what its chat template adds, if anything"
    if not default:
        return "None set: the model gets no system prompt (its chat template adds none)"
    return f"None set: the model's chat template adds its own: “{default}”"

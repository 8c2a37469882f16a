"""What a generation is asked to do: sampler settings and the request itself."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Mode = Literal["exact", "fast"]
Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}

ROLES = ("system", "user", "assistant")
DEFAULT_CHUNK = 512


@dataclass(frozen=True)
class SamplerSettings:
    """Sampling knobs. temperature == 0 is greedy; the seed fixes every random draw."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_context: int = 64
    seed: int = 0
    max_tokens: int = 256

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SamplerSettings":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


@dataclass(frozen=True)
class GenerationRequest:
    """One reply to generate for a whole conversation (`messages` ends with a user turn)."""

    messages: list[Message]
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    mode: Mode = "exact"
    use_cache: bool = True  # False: neither look up nor store (a cold run)
    stop: tuple[str, ...] = ()


class RequestError(ValueError):
    """Bad input a user can cause (unknown role, empty conversation...): shown as one line."""


def validate_messages(messages: Any) -> list[Message]:
    """Check an OpenAI-style message list and return it normalised; raise RequestError if bad."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects")
    out: list[Message] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise RequestError(f"message {i} must be an object with 'role' and 'content'")
        if m["role"] not in ROLES:
            raise RequestError(f"message {i} has unknown role {m['role']!r} (expected one of {', '.join(ROLES)})")
        if not isinstance(m["content"], str):
            raise RequestError(f"message {i} content must be a string")
        out.append({"role": m["role"], "content": m["content"]})
    return out

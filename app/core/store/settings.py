"""A conversation's settings (stored in its row: system prompt, sampler, seed, mode, context), and
the fresh seed a new reply draws."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Optional

from engine.types import SamplerSettings


def fresh_seed() -> int:
    """A new random seed for a reply (31 bits: fits everywhere, prints short)."""
    return random.SystemRandom().randrange(1, 2**31)


@dataclass(frozen=True)
class ChatSettings:
    """Per-conversation settings (stored in the conversation row)."""

    system_prompt: str = ""
    # Small local models ramble when greedy decoding loops; a mild temperature with a light
    # repetition penalty reads better, and the promise (regenerate is identical) holds at any T.
    sampler: SamplerSettings = field(
        default_factory=lambda: SamplerSettings(temperature=0.6, top_p=0.9, repetition_penalty=1.1, max_tokens=512)
    )
    random_seed: bool = True  # False: every new reply uses sampler.seed
    mode: str = "exact"  # "exact" | "fast"
    # A conversation longer than the model's context: leave out the oldest turns (marked in the
    # chat), or refuse to send. Deterministic either way, so regenerate stays identical.
    context_policy: str = "truncate"  # "truncate" | "refuse"
    context_length: int = 0  # use at most this many tokens of context; 0: the model's own


    def to_dict(self) -> dict[str, Any]:
        return {
            "system_prompt": self.system_prompt,
            "sampler": self.sampler.to_dict(),
            "random_seed": self.random_seed,
            "mode": self.mode,
            "context_policy": self.context_policy,
            "context_length": self.context_length,
        }

    @classmethod
    def from_dict(cls, d: Optional[dict[str, Any]]) -> "ChatSettings":
        d = d or {}
        base = cls()
        sampler = SamplerSettings.from_dict(d["sampler"]) if isinstance(d.get("sampler"), dict) else base.sampler
        mode = d.get("mode") if d.get("mode") in ("exact", "fast") else base.mode
        policy = d.get("context_policy") if d.get("context_policy") in ("truncate", "refuse") else base.context_policy
        return cls(
            system_prompt=str(d.get("system_prompt") or ""),
            sampler=sampler,
            random_seed=bool(d.get("random_seed", base.random_seed)),
            mode=mode,
            context_policy=policy,
            context_length=max(int(d.get("context_length") or 0), 0),
        )

    def seed_for_new_reply(self) -> int:
        return fresh_seed() if self.random_seed else self.sampler.seed

    @property
    def fixed_seed(self) -> Optional[int]:
        """The seed every new reply uses (None: a fresh one each): what the window's local server
        gives a request that names none (`engine serve --seed`)."""
        return None if self.random_seed else self.sampler.seed

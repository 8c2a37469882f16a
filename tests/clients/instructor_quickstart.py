"""instructor's quickstart against a Verbatim server, run in instructor's own environment.

instructor 1.17 needs `jiter<0.15` and so an openai release (3.3) older than the one the main
test environment pins; tests/serve/test_agent_clients.py runs this file with .venv-instructor's Python
(scripts/client_envs.sh) and reads what it prints: one JSON object, each mode's validated reply.

    python instructor_quickstart.py BASE_URL MODEL SEED
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Literal

import instructor
from openai import OpenAI
from pydantic import BaseModel, ConfigDict, Field


class Forecast(BaseModel):
    """The weather in a city, for a few days."""
    # No keys beyond these (additionalProperties: false): a schema that allows extra keys lets a
    # random-weight model write them until max_tokens, as the schema permits.
    model_config = ConfigDict(extra="forbid")
    city: Literal["Paris", "Rome", "Oslo"]
    days: Annotated[int, Field(ge=1, le=7)]
    sunny: bool


def main() -> None:
    url, model, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    out = {}
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(OpenAI(base_url=url, api_key="unused", max_retries=0), mode=mode)
        reply = client.chat.completions.create(model=model, response_model=Forecast, messages=ask,
                                               max_retries=0, temperature=1.0, seed=seed, max_tokens=80)
        out[mode.value] = reply.model_dump()
    print(json.dumps({"instructor": instructor.__version__ if hasattr(instructor, "__version__") else "?",
                      "replies": out}))


if __name__ == "__main__":
    main()

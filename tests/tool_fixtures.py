"""The tools and the response schema that the constraint tests and the server's tool tests send
(OpenAI's shapes): a weather tool with an enum and bounds, a clock tool, a weather JSON schema,
and the check that an object fits that schema."""

from __future__ import annotations

from typing import Any

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 6}},
                                       "required": ["zone"], "additionalProperties": False}}}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                           "temp": {"type": "integer", "minimum": -20, "maximum": 45},
                                           "sunny": {"type": "boolean"}},
          "required": ["city", "temp", "sunny"], "additionalProperties": False}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "weather", "strict": True, "schema": SCHEMA}}


def valid_weather(obj: Any) -> bool:
    return (isinstance(obj, dict) and set(obj) == {"city", "temp", "sunny"} and isinstance(obj["city"], str)
            and len(obj["city"]) <= 8 and isinstance(obj["temp"], int) and -20 <= obj["temp"] <= 45
            and isinstance(obj["sunny"], bool))

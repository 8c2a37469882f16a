"""What a chat template receives besides the roles and contents (issue 47): `template_options`
(keyword arguments, as gpt-oss's `reasoning_effort`) and a message's `name`.

A template that reads one renders it; a template that does not renders the prompt exactly as
without it (the same token ids: nothing cached changes). Options are part of the request's
identity: a receipt records them (version 4) and a replay renders the same prompt.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest

from engine import receipts
from engine.engine import Engine
from engine.errors import RequestError
from engine.generate.templating import render_prompt
from engine.receipts import ReceiptModel
from engine.types import GenerationRequest, SamplerSettings, normalize_template_options, validate_messages
from tests.engine_helpers import make_engine
from tests.tiny_models import CHATML_TEMPLATE, OPTIONS_TEMPLATE, build_templated_model, build_tokenizer

CHAT = [{"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Why is the sky blue?", "name": "ada"}]
HIGH = (("reasoning_effort", "high"),)


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Engine]]:
    """One engine on a model whose template reads options and names, one on plain ChatML."""
    root = tmp_path_factory.mktemp("template-inputs")
    out = {"reads": make_engine(build_templated_model(root / "reads", OPTIONS_TEMPLATE)),
           "chatml": make_engine(build_templated_model(root / "chatml", CHATML_TEMPLATE))}
    yield out
    for eng in out.values():
        eng.close()


def _req(messages: list[dict[str, Any]], **kw: Any) -> GenerationRequest:
    return GenerationRequest(messages, SamplerSettings(max_tokens=4), **kw)


def _text(eng: Engine, req: GenerationRequest) -> str:
    return eng.lm.tokenizer.decode(eng.prepare(req).prompt)


def test_template_options_reach_the_template(engines: dict[str, Engine]) -> None:
    eng = engines["reads"]
    assert "Reasoning: medium" in _text(eng, _req(CHAT))
    with_high = _req(CHAT, template_options=HIGH)
    assert "Reasoning: high" in _text(eng, with_high)
    result = eng.generate(with_high)
    tok = eng.lm.tokenizer
    assert result.prompt_ids == render_prompt(tok, validate_messages(CHAT), options=HIGH)
    assert result.prompt_ids != render_prompt(tok, validate_messages(CHAT))
    # measure() counts the prompt prepare() runs
    assert eng.measure(with_high).prompt_tokens == len(result.prompt_ids)


def test_a_template_that_reads_no_option_renders_the_same_prompt(engines: dict[str, Engine]) -> None:
    eng = engines["chatml"]
    plain = eng.prepare(_req(CHAT)).prompt
    assert eng.prepare(_req(CHAT, template_options=HIGH)).prompt == plain


def test_template_options_are_sorted_pairs_and_checked() -> None:
    req = _req(CHAT, template_options={"b_opt": "2", "a_opt": "1"})  # a dict, as a server builds it
    assert req.template_options == (("a_opt", "1"), ("b_opt", "2"))
    assert replace(req, template_options=[("b_opt", "2"), ("a_opt", "1")]).template_options == req.template_options
    for bad, words in [({"tools": "x"}, "set by the engine"), ({"add_generation_prompt": "1"}, "set by the engine"),
                       ({"eos_token": "x"}, "set by the engine"), ({"enable_thinking": "false"}, "set by the engine"),
                       ({"1st": "x"}, "not a name"), ({"has space": "x"}, "not a name"),
                       ({"effort": 3}, "must be a string"), ({"effort": "x" * 2000}, "must be a string"),
                       ([("a", "1"), ("a", "2")], "given twice"), (["ab"], "map names to strings"),
                       ("reasoning_effort", "map names to strings")]:
        with pytest.raises(RequestError, match=words) as e:
            normalize_template_options(bad)
        assert e.value.param == "template_options"


def test_template_options_need_a_chat(engines: dict[str, Engine]) -> None:
    with pytest.raises(RequestError, match="need a chat") as e:
        engines["reads"].prepare(GenerationRequest([], SamplerSettings(max_tokens=4), prompt="Once upon a time",
                                                   template_options=HIGH))
    assert e.value.param == "template_options"


def test_a_receipt_records_the_options_and_replays_them(engines: dict[str, Engine], tmp_path: Path) -> None:
    eng = engines["reads"]
    req = _req(CHAT, template_options=HIGH)
    result = eng.generate(req)
    info = eng.info
    receipt = receipts.build(req, result, ReceiptModel(info.path, info.key, info.name, info.dequantized), eng.chunk)
    d = json.loads(receipt.to_json())
    assert d["version"] == receipts.RECEIPT_VERSION_TEMPLATE_OPTIONS
    assert d["template_options"] == {"reasoning_effort": "high"}
    assert d["messages"][1]["name"] == "ada"
    back = receipts.Receipt.from_dict(d)
    assert back.template_options == HIGH and back.request().template_options == HIGH
    verdict = receipts.replay(back, eng, use_cache=False)
    assert verdict.comparison.identical, verdict.comparison.detail
    # Without the options the same file would replay another prompt: an edited one is refused.
    d.pop("template_options")
    with pytest.raises(receipts.ReceiptError, match="records template options"):
        receipts.Receipt.from_dict(d)
    # A receipt without options is the version it was before.
    plain = receipts.build(_req(CHAT), eng.generate(_req(CHAT)), receipt.model, eng.chunk)
    assert plain.to_dict()["version"] == receipts.RECEIPT_VERSION and "template_options" not in plain.to_dict()


def test_names_reach_a_template_that_renders_them(engines: dict[str, Engine]) -> None:
    assert validate_messages(CHAT)[1] == {"role": "user", "content": "Why is the sky blue?", "name": "ada"}
    assert "name" not in validate_messages([{**CHAT[1], "name": None}])[0]  # null: no name
    assert "<|im_start|>user (ada)\n" in _text(engines["reads"], _req(CHAT))
    eng = engines["chatml"]
    unnamed = [{k: v for k, v in m.items() if k != "name"} for m in CHAT]
    assert eng.prepare(_req(CHAT)).prompt == eng.prepare(_req(unnamed)).prompt


@pytest.mark.parametrize("name", ["", "two words", "a<b", "x|y", "a/b", "a\\b", "x" * 65, 7])
def test_a_malformed_name_is_refused(name: Any) -> None:
    with pytest.raises(RequestError, match=r"messages\[1\].name") as e:
        validate_messages([CHAT[0], {**CHAT[1], "name": name}])
    assert e.value.param == "messages[1].name"


def test_a_name_holding_a_control_token_is_refused(tmp_path: Path) -> None:
    """OpenAI's pattern keeps < | / > out of names; a template's marker without them (Mistral's
    [INST]) would still become the control token where a template writes the name: refused."""
    from mlx_lm.utils import load_tokenizer

    template = ("{% for message in messages %}[INST]{{ message.name }}: {{ message['content'] }}[/INST]"
                "{% endfor %}")
    folder = tmp_path / "inst"
    folder.mkdir()
    build_tokenizer(folder, template, added=["[INST]", "[/INST]"])
    tok = load_tokenizer(folder)
    ok = validate_messages([{"role": "user", "content": "hi", "name": "ada"}])
    assert "[INST]ada: hi" in tok.decode(render_prompt(tok, ok))
    named = validate_messages([{"role": "user", "content": "hi", "name": "x[INST]"}])  # the pattern lets it by
    with pytest.raises(RequestError, match="control token '\\[INST\\]'") as e:
        render_prompt(tok, named)
    assert e.value.param == "messages[0].name"

"""Each turn keeps the request's template settings and the mismatch comparator renders
the canonical sequence with them: a session in a family's non-default thinking mode
reports no false mismatch."""

from __future__ import annotations

import pytest
from helpers.fakes import ModelEngine
from helpers.inproc import asgi_client, new_session
from helpers.support import tokenizer_dir

from tito.config import ServerConfig
from tito.render import build_renderer
from tito.render.families import family_module
from tito.samples import decode_samples
from tito.server.gateway import Gateway


@pytest.mark.slow
@pytest.mark.parametrize(("family", "thinking"), [
    ("glm47", False), ("nemotron3", False), ("deepseek_v32", True), ("deepseek_v4", True),
])
@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_no_false_mismatch_in_a_non_default_thinking_mode(
        family: str, thinking: bool, version: str) -> None:
    fixture = getattr(family_module(family), "FIXTURE", None)
    tokenizer = str(tokenizer_dir(fixture)) if fixture else "standin"
    renderer = build_renderer(family, tokenizer)
    kwarg = renderer.spec.thinking_kwarg
    assert kwarg is not None
    cfg = ServerConfig(tokenizer=tokenizer, family=family, engine="sglang",
                       engine_url="http://fake", session_version=version)
    gateway = Gateway(cfg, renderer, ModelEngine(renderer))
    settings = {kwarg: thinking}
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        resp = await http.post(f"/sessions/{sid}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi\nSAY Hello!\nTHINK The user greets me."}],
            "chat_template_kwargs": settings})
        assert resp.status_code == 200, resp.text
        view = (await http.get(f"/sessions/{sid}")).json()
        samples = decode_samples((await http.post(f"/sessions/{sid}/samples")).content)
    assert view["records"][0]["chat_template_kwargs"] == settings
    assert samples.session_metadata["tito_session_mismatch"] == []
    assert samples.samples[0].metadata["tito_session_mismatch"] == []


async def test_glm5_switches_thinking_between_turns_without_a_mismatch() -> None:
    """GLM-5.1's pinned template renders history reasoning in both modes: a session that
    turns thinking off after a thinking turn still equals its canonical render."""
    renderer = build_renderer("glm5", "standin")
    cfg = ServerConfig(tokenizer="standin", family="glm5", engine="sglang",
                       engine_url="http://fake")
    engine = ModelEngine(renderer)
    gateway = Gateway(cfg, renderer, engine)
    messages: list[dict[str, object]] = [{"role": "user", "content": "THINK hmm\nSAY Hello!"}]
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        for thinking in (True, False):
            resp = await http.post(f"/sessions/{sid}/v1/chat/completions", json={
                "messages": messages, "chat_template_kwargs": {"enable_thinking": thinking}})
            assert resp.status_code == 200, resp.text
            messages += [resp.json()["choices"][0]["message"],
                         {"role": "user", "content": "SAY Bye."}]
        samples = decode_samples((await http.post(f"/sessions/{sid}/samples")).content)
    prompt = renderer.tokenizer.decode(engine.calls[1].input_ids)
    assert "<think>hmm</think>Hello!" in prompt and prompt.endswith("<|assistant|></think>")
    assert samples.samples[0].metadata["tito_session_mismatch"] == []


@pytest.mark.parametrize("family", ["glm47", "nemotron3", "deepseek_v32", "kimi_k25"])
@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_no_false_mismatch_when_thinking_switches_between_turns(
        family: str, version: str) -> None:
    """Each turn is compared under its own kwargs: before, the whole session was rendered
    with the last turn's, and a session switching thinking on/off got a strict mismatch."""
    renderer = build_renderer(family, "standin")
    kwarg = renderer.spec.thinking_kwarg
    assert kwarg is not None
    cfg = ServerConfig(tokenizer="standin", family=family, engine="sglang",
                       engine_url="http://fake", session_version=version)
    gateway = Gateway(cfg, renderer, ModelEngine(renderer))
    messages: list[dict[str, object]] = []
    async with asgi_client(gateway) as http:
        sid = await new_session(http)
        for k, thinking in enumerate([True, False, True, True, False]):
            messages.append({"role": "user",
                             "content": f"Q{k}\nSAY Answer {k}.\nTHINK Ponder {k}."})
            resp = await http.post(f"/sessions/{sid}/v1/chat/completions", json={
                "messages": messages, "chat_template_kwargs": {kwarg: thinking}})
            assert resp.status_code == 200, resp.text
            reply = resp.json()["choices"][0]["message"]
            messages.append({key: reply[key] for key in ("role", "content", "reasoning_content")
                             if reply.get(key) is not None})
        view = (await http.get(f"/sessions/{sid}")).json()
        samples = decode_samples((await http.post(f"/sessions/{sid}/samples")).content)
    assert [r["chat_template_kwargs"][kwarg] for r in view["records"]] == \
        [True, False, True, True, False]
    assert samples.session_metadata["tito_session_mismatch"] == []
    assert samples.samples[0].metadata["tito_session_mismatch"] == []


@pytest.mark.slow
def test_thinking_switch_over_the_mock_engine_processes() -> None:
    """From outside: `tito serve` over `tito mock-engine` (glm47 stand-in), thinking
    switched per turn through the openai SDK; the sample has no mismatch."""
    import httpx
    import openai
    from helpers.support import new_session as new_remote_session
    from helpers.support import start_gateway, start_mock

    mock = start_mock("standin", "glm47")
    gateway = start_gateway(mock.url, "standin", "glm47")
    try:
        sid = new_remote_session(gateway.url)
        client = openai.OpenAI(base_url=f"{gateway.url}/sessions/{sid}/v1", api_key="x",
                               max_retries=0)
        messages: list[dict[str, object]] = []
        for k, thinking in enumerate([True, False, True]):
            messages.append({"role": "user", "content": f"Q{k}\nSAY A{k}.\nTHINK T{k}."})
            reply = client.chat.completions.create(
                model="m", messages=messages,  # type: ignore[arg-type]
                extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
            message = reply.choices[0].message.model_dump(exclude_none=True)
            messages.append({k: v for k, v in message.items()
                             if k in ("role", "content", "reasoning_content")})
        resp = httpx.post(f"{gateway.url}/sessions/{sid}/samples", json={})
        samples = decode_samples(resp.content)
    finally:
        gateway.stop()
        mock.stop()
    assert len(messages) == 6
    assert samples.samples[0].metadata["tito_session_mismatch"] == []

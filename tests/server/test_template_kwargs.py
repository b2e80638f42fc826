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

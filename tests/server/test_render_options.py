"""A session's render options through HTTP (:mod:`tito.session.options`), over a real mock
engine: an explicit reasoning effort that differs from the session's is a change even when
the family's template has no level for it (deepseek_v4: every effort but ``xhigh`` renders
nothing), and so is the thinking switch of a family that writes it before the generation
prompt (``FamilySpec.thinking_in_prefix``). v1 refuses the change with a 400
``render_changed`` that leaves the session as it was; v2 starts a new root. A turn that
leaves the options out keeps the session's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.inproc import asgi_client, gateway_over_mock_engine, new_session
from helpers.support import tokenizer_dir

from tito.render import build_renderer
from tito.render.base import TemplateRenderer
from tito.render.families import family_module
from tito.render.families.loaders import write_standin

pytestmark = pytest.mark.slow  # a gateway over the real mock engine per case

FIRST = [{"role": "user", "content": "SAY Hi."}]


def _built(family: str, tmp_path: Path) -> tuple[Path, TemplateRenderer]:
    module = family_module(family)
    if getattr(module, "STANDIN", None) is not None:
        folder = write_standin(tmp_path, family, module.STANDIN, module.STANDIN_EOS)
    else:
        folder = tokenizer_dir(module.FIXTURE)
    return folder, build_renderer(family, folder)


def _body(api: str, effort: str | None) -> dict[str, Any]:
    if effort is None:
        return {}
    return {"reasoning_effort": effort} if api == "chat" else {"reasoning": {"effort": effort}}


async def _turn(http: httpx.AsyncClient, sid: str, api: str, messages: list[Any],
                extra: dict[str, Any]) -> httpx.Response:
    if api == "chat":
        return await http.post(f"/sessions/{sid}/v1/chat/completions",
                               json={"model": "m", "messages": messages, **extra})
    if api == "messages":
        return await http.post(f"/sessions/{sid}/v1/messages", json={
            "model": "m", "max_tokens": 64, "messages": messages, **extra})
    items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in messages]
    return await http.post(f"/sessions/{sid}/v1/responses",
                           json={"model": "m", "input": items, "store": False, **extra})


def _reply(api: str, resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    if api == "chat":
        return {"role": "assistant", "content": body["choices"][0]["message"]["content"]}
    if api == "messages":
        return {"role": "assistant", "content": body["content"][-1]["text"]}
    return {"role": "assistant", "content": body["output"][-1]["content"][0]["text"]}


async def _session(http: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    return dict((await http.get(f"/sessions/{sid}")).json())


def _kwargs(view: dict[str, Any]) -> list[Any]:
    return [r["chat_template_kwargs"] for r in view["records"]]


async def _check_change(http: httpx.AsyncClient, sid: str, api: str, version: str,
                        following: list[Any], changed: dict[str, Any], what: str,
                        changed_kwargs: dict[str, Any]) -> None:
    """``changed`` extends the session's first turn: v1 refuses it (the session unchanged),
    v2 starts a new root."""
    before = await _session(http, sid)
    resp = await _turn(http, sid, api, following, changed)
    if version == "v1":
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]  # Anthropic's error shape has no code
        assert error.get("code", "render_changed") == "render_changed", error
        assert what in error["message"] and "render" in error["message"], error
        assert await _session(http, sid) == before
    else:
        assert resp.status_code == 200, resp.text
        view = await _session(http, sid)
        assert [n["parent"] for n in view["metadata"]["tree"]["nodes"]] == [None, None]
        new = view["records"][-1]["chat_template_kwargs"]
        assert all(new.get(k) == v for k, v in changed_kwargs.items()), new


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("family", ["deepseek_v4", "deepseek_v41"])
async def test_an_effort_without_a_level_is_no_silent_max(
        family: str, version: str, api: str, tmp_path: Path) -> None:
    """Turn 1 at ``xhigh`` renders DeepSeek's maximum-effort preamble; ``low`` has no level
    in the template: before, turn 2 at ``low`` silently kept ``max``."""
    folder, renderer = _built(family, tmp_path)
    async with gateway_over_mock_engine(folder, renderer, {}, timeout=30, family=family,
                                        session_version=version) as gateway, \
            asgi_client(gateway) as http:
        sid = await new_session(http)
        first = await _turn(http, sid, api, FIRST, _body(api, "xhigh"))
        assert first.status_code == 200, first.text
        following = [*FIRST, _reply(api, first), {"role": "user", "content": "SAY Bye."}]
        await _check_change(http, sid, api, version, following, _body(api, "low"),
                            "reasoning_effort 'max' -> 'high'", {"reasoning_effort": "high"})
        if version == "v2":
            return
        kept = await _turn(http, sid, api, following, _body(api, None))  # no effort: kept
        assert kept.status_code == 200, kept.text
        same = await _turn(http, sid, api, following, _body(api, "xhigh"))
        assert same.status_code == 200, same.text
        records = (await _session(http, sid))["records"]
    assert records[0]["chat_template_kwargs"] == {"thinking": True, "reasoning_effort": "max"}
    assert records[-2]["chat_template_kwargs"] == {"reasoning_effort": "max", "thinking": True}
    assert records[-1]["chat_template_kwargs"] == {"thinking": True, "reasoning_effort": "max"}




def _switch(api: str, kwarg: str, on: bool) -> dict[str, Any]:
    if api == "messages":
        return {"thinking": {"type": "enabled", "budget_tokens": 1024} if on
                else {"type": "disabled"}}
    return {"chat_template_kwargs": {kwarg: on}}


@pytest.mark.parametrize(("family", "api"), [
    ("gemma4", "chat"), ("gemma4", "messages"), ("minimax_m3", "chat"), ("qwen38", "chat"),
    ("kimi_k3", "messages"),
])
@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_a_thinking_switch_written_before_the_prompt_is_a_render_option(
        family: str, api: str, version: str, tmp_path: Path) -> None:
    """These families write the thinking mode into the system text: before, a turn that
    switched it kept turn 1's system text silently."""
    folder, renderer = _built(family, tmp_path)
    kwarg = renderer.spec.thinking_kwarg
    assert kwarg is not None
    first_kwargs = renderer.thinking_switch_kwargs(True)
    async with gateway_over_mock_engine(folder, renderer, {}, timeout=30, family=family,
                                        session_version=version) as gateway, \
            asgi_client(gateway) as http:
        sid = await new_session(http)
        first = await _turn(http, sid, api, FIRST, _switch(api, kwarg, True))
        assert first.status_code == 200, first.text
        following = [*FIRST, _reply(api, first), {"role": "user", "content": "SAY Bye."}]
        await _check_change(http, sid, api, version, following, _switch(api, kwarg, False),
                            f"chat_template_kwargs ({kwarg} ",
                            renderer.thinking_switch_kwargs(False))
        if version == "v2":
            return
        kept = await _turn(http, sid, api, following, {})  # no switch: the session's
        assert kept.status_code == 200, kept.text
        records = (await _session(http, sid))["records"]
    assert [r["chat_template_kwargs"] for r in records] == [first_kwargs] * 2

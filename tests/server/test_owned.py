"""Fields the gateway owns (``input_ids``): every API's turn request model refuses them
with a 400 ``gateway_owned_field``, on a session's first body and on a body that extends
the last one (the incremental decode), and the refused body leaves the session as it
was."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from helpers.fakes import FakeEngine
from helpers.inproc import new_session

from tito.server.anthropic.models import CountTokensRequest, MessagesRequest
from tito.server.openai.models import ChatCompletionRequest, validate_chat
from tito.server.owned import OWNED_FIELDS
from tito.server.responses.models import ResponsesRequest, parse_responses_request
from tito.types.errors import BadRequest

CHAT = {"messages": [{"role": "user", "content": "hello"}]}
MESSAGES = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}
RESPONSES = {"input": [{"role": "user", "content": "hello"}]}
MODELS = [(ChatCompletionRequest, CHAT), (MessagesRequest, MESSAGES),
          (ResponsesRequest, RESPONSES)]


@pytest.mark.parametrize("value", [[1, 2, 3], None, "x"])
@pytest.mark.parametrize(("model", "body"), MODELS)
def test_each_request_model_refuses_an_owned_field(model: Any, body: dict[str, Any],
                                                    value: Any) -> None:
    for name in OWNED_FIELDS:
        with pytest.raises(BadRequest) as err:
            model.model_validate({**body, name: value})
        assert err.value.code == "gateway_owned_field" and name in str(err.value)
    model.model_validate(body)  # without it: valid


def test_the_api_validators_keep_the_code() -> None:
    with pytest.raises(BadRequest) as err:
        validate_chat({**CHAT, "input_ids": [1]})
    assert err.value.code == "gateway_owned_field"
    with pytest.raises(BadRequest) as err:
        parse_responses_request({**RESPONSES, "input_ids": [1]})
    assert err.value.code == "gateway_owned_field"
    CountTokensRequest.model_validate({**MESSAGES, "input_ids": [1]})  # not a turn


ROUTES = {"chat": "v1/chat/completions", "messages": "v1/messages",
          "responses": "v1/responses"}


def grown(api: str, body: dict[str, Any]) -> dict[str, Any]:
    """The next turn's body: the first one, the reply and a new user message."""
    if api == "responses":
        return {"input": [*body["input"], {"role": "assistant", "content": "hi"},
                          {"role": "user", "content": "again"}]}
    return {**body, "messages": [*body["messages"], {"role": "assistant", "content": "hi"},
                                 {"role": "user", "content": "again"}]}


def code_of(api: str, resp: httpx.Response) -> str | None:
    """The error's machine code (Messages errors start their message with it)."""
    error = resp.json()["error"]
    if api == "messages":
        return str(error["message"]).partition("]")[0].lstrip("[")
    return error.get("code")


async def turns(http: httpx.AsyncClient, sid: str) -> int:
    return int((await http.get(f"/sessions/{sid}")).json()["metadata"]["num_turns"])


@pytest.mark.parametrize("api", sorted(ROUTES))
async def test_a_turn_with_input_ids_is_refused_first_and_later(
        client: httpx.AsyncClient, engine: FakeEngine, api: str) -> None:
    first = {"chat": CHAT, "messages": MESSAGES, "responses": RESPONSES}[api]
    sid = await new_session(client)
    url = f"/sessions/{sid}/{ROUTES[api]}"
    refused = await client.post(url, json={**first, "input_ids": [1, 2, 3]})
    assert refused.status_code == 400, refused.text
    assert code_of(api, refused) == "gateway_owned_field"
    assert engine.calls == [] and await turns(client, sid) == 0
    engine.script("hi", "done")
    assert (await client.post(url, json=first)).status_code == 200
    second = grown(api, first)
    for value in ([5, 6], None):  # past the last body: the incremental decode
        refused = await client.post(url, json={**second, "input_ids": value})
        assert refused.status_code == 400, refused.text
        assert code_of(api, refused) == "gateway_owned_field"
    assert len(engine.calls) == 1 and await turns(client, sid) == 1
    assert (await client.post(url, json=second)).status_code == 200
    assert await turns(client, sid) == 2

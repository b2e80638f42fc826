"""The template sandbox keeps Hugging Face's decisions with its faster lookups: dict keys
and dict methods resolve as before, unsafe attributes and mutations are still refused."""

from __future__ import annotations

import pytest

from tito.render.template import render_template
from tito.types.errors import TokenizationError


def render(source: str, **context: object) -> str:
    return render_template(source, [{"role": "user", "content": "hi", "items": "key"}],
                           kwargs=dict(context))


def test_dict_keys_and_methods_resolve_as_before() -> None:
    assert render("{{ messages[0].role }}|{{ messages[0].content }}") == "user|hi"
    assert render("{{ messages[0].missing is defined }}") == "False"
    # a key named like a dict method: the method wins, as in Hugging Face's sandbox
    assert render("{{ messages[0].items is callable }}") == "True"
    assert render("{{ messages[0]['items'] }}") == "key"
    assert render("{% for k, v in messages[0].items() %}{{ k }};{% endfor %}") == \
        "role;content;items;"


@pytest.mark.parametrize("source", [
    "{{ messages.append(1) }}",
    "{{ messages[0].update({'role': 'x'}) }}",
    "{{ ''.__class__.__mro__ }}",
])
def test_unsafe_access_is_still_refused(source: str) -> None:
    with pytest.raises(TokenizationError, match="chat template rendering failed"):
        render(source)


def test_private_attributes_render_nothing() -> None:
    assert render("{{ raise_exception.__globals__ }}") == ""  # an unsafe undefined

"""What an arbitrary chat template declares by how it renders (the ``default`` family):
its thinking switch and its own end-of-turn marker. Pure: a few renders of probe messages.
"""

from __future__ import annotations

from typing import Any

from tito.render.template import render_template
from tito.types.tokenizer import Tokenizer

THINKING_SWITCHES = ("enable_thinking", "thinking")
"""Template kwargs tried as a thinking switch, in order."""
_USER = {"role": "user", "content": "probe user"}
_ANSWER = "probe answer"


def _render(template: str, messages: list[dict[str, Any]], special: dict[str, str | None],
            *, prompt: bool, kwargs: dict[str, Any] | None = None) -> str | None:
    try:
        return render_template(template, messages, add_generation_prompt=prompt,
                               kwargs=kwargs, special_tokens=special)
    except Exception:  # a template that cannot render the probe declares nothing
        return None


def thinking_switch(template: str, special: dict[str, str | None]
                    ) -> tuple[str | None, bool]:
    """(the kwarg that switches thinking, whether thinking is on without it): the first of
    :data:`THINKING_SWITCHES` the template reads whose values render the generation prompt
    differently; (None, True) when there is none."""
    for kwarg in THINKING_SWITCHES:
        if kwarg not in template:
            continue
        on, off, unset = (_render(template, [_USER], special, prompt=True, kwargs=kw)
                          for kw in ({kwarg: True}, {kwarg: False}, {}))
        if on is not None and off is not None and on != off:
            return kwarg, unset != off
    return None, True


def end_marker(template: str, tokenizer: Tokenizer, special: dict[str, str | None]
               ) -> str | None:
    """The special token the template writes right after an assistant message's content
    (its end-of-turn marker), or None."""
    text = _render(template, [_USER, {"role": "assistant", "content": _ANSWER}], special,
                   prompt=False)
    if text is None or _ANSWER not in text:
        return None
    after = text[text.rfind(_ANSWER) + len(_ANSWER):].lstrip(" ")
    specials = sorted((t for i in tokenizer.special_ids if (t := tokenizer.id_to_token(i))),
                      key=len, reverse=True)
    return next((t for t in specials if after.startswith(t)), None)

"""Bridge stand-ins (:mod:`tito.render.standin`) give exactly the bridge the template's
own render of the real tool list and calls gives, for every family, over turns of an
agent that calls tools; the stand-in is taken once a slot's checks agreed, and never
where they differed. A trusted slot's bridge is then remembered as one skeleton
(:mod:`tito.render.memo`), which gives the same bridge too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.families import renderer_of

from tito.parse.hermes import HermesParser
from tito.render import FAMILIES, TemplateRenderer
from tito.render.base import FamilySpec
from tito.render.families import ALIASES
from tito.render.memo import BridgeMemo, bridge_skeleton
from tito.render.skeleton import Skeleton
from tito.render.standin import CHECKS, slot_of, standin_previous, standin_tools
from tito.types.tokenizer import load_tokenizer

TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name}: " + "a long description " * 20,
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}} for name in ("Bash", "Read", "Edit")]


def previous_of(k: int, calls: int = 1) -> dict[str, Any]:
    return {"role": "assistant", "content": f"step {k}", "tool_calls": [
        {"id": f"call{k:03d}{i}x"[:9], "type": "function",
         "function": {"name": ("Bash", "Read", "Edit")[(k + i) % 3],
                      "arguments": json.dumps({"command": f"ls {k} {i}"})}}
        for i in range(calls)]}


def appended_of(k: int, previous: dict[str, Any], user: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
         "content": f"result {k} of {c['function']['name']}"}
        for c in previous["tool_calls"]]
    return [*out, {"role": "user", "content": f"and now {k}"}] if user else out


def both_ways(renderer: TemplateRenderer, previous: dict[str, Any],
              appended: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Any:
    def bridge() -> Any:
        try:
            return renderer.bridge(previous, renderer.primary_stop_id, appended, tools=tools)
        except Exception as exc:
            return type(exc), str(exc)

    saved = renderer.standins
    fast = bridge()
    renderer.standins = None
    try:
        slow = bridge()
    finally:
        renderer.standins = saved
    return fast, slow


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - set(ALIASES)))
def test_standins_give_the_template_render_for_every_family(family: str) -> None:
    renderer = renderer_of(family)
    for tools in (TOOLS, None):
        for calls in (1, 2):
            for user in (False, True):
                for k in range(CHECKS + 3):  # checked, then trusted (or not)
                    previous = previous_of(k, calls)
                    appended = appended_of(k, previous, user)
                    if not {m["role"] for m in appended} <= renderer.allowed_append_roles:
                        continue
                    fast, slow = both_ways(renderer, previous, appended, tools)
                    assert fast == slow, (family, calls, user, k)


def test_qwen3_takes_the_standin_after_its_checks() -> None:
    """Guards the test above against passing with the stand-in never taken."""
    renderer = renderer_of("qwen3")
    assert renderer.standins is not None
    previous = previous_of(0)
    appended = appended_of(0, previous, False)
    slot = slot_of(previous, appended, TOOLS, None)
    assert slot is not None
    for k in range(CHECKS):
        renderer.bridge(previous_of(k), renderer.primary_stop_id,
                        appended_of(k, previous_of(k), False), tools=TOOLS)
    assert renderer.standins.trusted(slot)
    # the trusted slot's stand-in base is cached: the real tool list is not rendered
    later = previous_of(9)
    assert renderer.bridge(later, renderer.primary_stop_id, appended_of(9, later, False),
                           tools=TOOLS) == both_ways(renderer, later,
                                                     appended_of(9, later, False), TOOLS)[1]


def test_a_template_that_renders_tools_after_the_base_never_takes_the_standin(
        qwen3_dir: Path) -> None:
    """Tools listed before the generation prompt: the bridge's text holds them."""
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}{% if tools %}"
                "{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}"
                "<|im_start|>assistant\n{% endif %}")
    tok = load_tokenizer(qwen3_dir)
    renderer = TemplateRenderer(tok, FamilySpec(name="default", template=template,
                                                stop_tokens=("<|im_end|>",)),
                                HermesParser(tok))
    assert renderer.standins is not None
    for k in range(CHECKS + 2):
        previous = previous_of(k)
        appended = appended_of(k, previous, False)
        fast, slow = both_ways(renderer, previous, appended, TOOLS)
        assert fast == slow
        slot = slot_of(previous, appended, TOOLS, None)
        assert slot is not None and not renderer.standins.trusted(slot)


def test_the_standins() -> None:
    assert standin_tools(None) is None and standin_tools([]) == []
    assert standin_tools(TOOLS) == [{"type": "function", "function": {"name": n}}
                                    for n in ("Bash", "Read", "Edit")]
    odd = {"name": "web_search", "type": "hosted"}
    assert standin_tools([odd]) == [odd]  # another shape: kept
    assert standin_previous(None) is None
    plain = {"role": "assistant", "content": "x"}
    assert standin_previous(plain) is plain
    two = standin_previous(previous_of(3, 2))
    assert two is not None and [c["id"] for c in two["tool_calls"]] == ["standin00",
                                                                       "standin01"]
    other = standin_previous(previous_of(5, 2))  # the same calls whatever the real ones
    assert other is not None and other["tool_calls"] == two["tool_calls"]
    # the slot: the tool list, the kwargs, the number of calls, the appended roles/fields
    p = previous_of(1)
    a = appended_of(1, p, False)
    assert slot_of(p, a, TOOLS, None) == slot_of(previous_of(2), appended_of(2, p, False),
                                                 TOOLS, None)
    assert slot_of(p, a, TOOLS, None) != slot_of(previous_of(1, 2), a, TOOLS, None)
    assert slot_of(p, a, TOOLS, None) != slot_of(p, a, TOOLS[:2], None)
    assert slot_of(p, a, TOOLS, None) != slot_of(p, [*a, {"role": "user", "content": "u"}],
                                                 TOOLS, None)


# -- remembered bridges (tito/render/memo.py) ----------------------------------------
def stored_ids(renderer: Any) -> list[int | None]:
    other = next(i for i in range(100, 200) if i not in renderer.stop_ids)
    return [renderer.primary_stop_id, other, None]


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - set(ALIASES)))
def test_remembered_bridges_give_the_template_render(family: str) -> None:
    renderer = renderer_of(family)
    for stored in stored_ids(renderer):
        for user in (False, True):
            for k in range(CHECKS + 4):  # checked, trusted and remembered, then filled
                previous = previous_of(k)
                appended = appended_of(k, previous, user)
                if not {m["role"] for m in appended} <= renderer.allowed_append_roles:
                    continue

                def bridge(standins: Any, prev: Any = previous, app: Any = appended,
                           last: int | None = stored) -> Any:
                    saved = renderer.standins
                    renderer.standins = standins
                    try:
                        return renderer.bridge(prev, last, app, tools=TOOLS)
                    except Exception as exc:
                        return type(exc), str(exc)
                    finally:
                        renderer.standins = saved

                assert bridge(renderer.standins) == bridge(None), (family, stored, user, k)


def test_qwen3_fills_remembered_bridges() -> None:
    """Guards the test above against passing with nothing remembered."""
    renderer = renderer_of("qwen3")
    for k in range(CHECKS + 3):
        previous = previous_of(k)
        fast, slow = both_ways(renderer, previous, appended_of(k, previous, False), TOOLS)
        assert fast == slow
    entries = [e for e in renderer.memo._entries.values() if e is not None]
    assert entries and all(isinstance(e[1], Skeleton) for e in entries)


def test_bridge_skeleton_refuses_what_it_cannot_give() -> None:
    skeleton = Skeleton(("BASE<a>", "</a>"), (0,))
    memo = bridge_skeleton("BASE", skeleton, 0, "J", ["x"], (0, "J<a>x</a>"))
    assert memo is not None and memo.fill(["y"]) == "J<a>y</a>"
    assert bridge_skeleton("OTHER", skeleton, 0, "J", ["x"], (0, "J<a>x</a>")) is None
    assert bridge_skeleton("BASE", skeleton, 0, "J", ["x"], (1, "J<a>x</a>")) is None
    assert bridge_skeleton("BASE", skeleton, 0, "J", ["x"], (0, "<a>x</a>")) is None


def test_the_memo_is_bounded() -> None:
    memo = BridgeMemo(size=2)
    for i in range(5):
        memo.put((b"%d" % i, (), False, True), None)
        assert len(memo._entries) <= 2

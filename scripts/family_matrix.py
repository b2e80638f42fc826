"""Run the append-only verifier for every family and write docs/families.md.

``python scripts/family_matrix.py`` rewrites the document; ``--check`` only compares (exit 1
when a family fails or the document is stale, so CI catches regressions). Families run over
their fixture tokenizer from ../shared/fixtures/tokenizers, or over their documented
stand-in tokenizer where no tokenizer is available offline (marked as such).
"""

# ruff: noqa: E501  (markdown tables in the generated document)
from __future__ import annotations

import argparse
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tito.render import build_renderer  # noqa: E402
from tito.render.audit import FORMAT_LIMITS, audit_corpus  # noqa: E402
from tito.render.base import TemplateRenderer  # noqa: E402
from tito.render.families import FAMILIES, family_module  # noqa: E402
from tito.render.verify import verify_renderer  # noqa: E402

SHARED = Path(os.environ.get("TITO_SHARED_DIR", REPO.parent / "shared"))
TOKENIZERS = SHARED / "fixtures" / "tokenizers"
DOC = REPO / "docs" / "families.md"
ORDER = ["qwen3", "qwen3_thinking", "qwen35", "nemotron3", "glm47", "deepseek_v31",
         "deepseek_v32", "deepseek_v4", "kimi_k2", "minimax_m2",
         "minimax_m25",
         "minimax_m3",
         "gemma4",
         "llama3", "gpt_oss",
         "mistral", "chatml",
         "qwen38",
         "qwen36",
         "nemotron35",
         "glm5",
         "kimi_k25",
         "kimi_k3",
         "inkling",
         "deepseek_v41",
         ]
EXTRA_FIXTURES = {"qwen3": "qwen3", "chatml": "smollm2"}
CHECKS = ("text_prefix", "token_prefix", "parse_round_trip")


@dataclass
class Row:
    family: str
    aliases: list[str]
    tokenizer: str
    level: str
    mode: str
    checks: dict[str, tuple[int, int]]
    roles: list[str]
    exercised: list[str]
    trim: int
    passed: bool
    first_failure: str | None
    audit: dict[str, tuple[int, int]]
    audit_skipped: list[str]
    audit_limits: list[str]
    """Audit conversations whose parse round trip fails by a declared format limit."""
    audit_failure: str | None
    """The first audit failure that is not a declared format limit (None: the audit passes)."""
    pinned: str = "-"
    """The template options the family pins (a request asking otherwise is a 400)."""


def audit_row(renderer: TemplateRenderer, mode: str
              ) -> tuple[dict[str, tuple[int, int]], list[str], list[str], str | None]:
    """The audit corpus over ``renderer`` in ``mode``: (checks, skipped, limits, failure)."""
    report = verify_renderer(renderer, thinking=mode, pool=[], audit=True)
    limits = FORMAT_LIMITS.get(renderer.family, {})
    failed = [c for c in report.cases if not c.passed]
    real = [c for c in failed if not (c.check == "parse_round_trip" and c.trajectory in limits)]
    failure = None if not real else \
        f"{real[0].trajectory} ({real[0].check}, {real[0].reason}): {real[0].detail}"
    return (report.checks(), sorted(set(report.skipped)),
            sorted({c.trajectory for c in failed} - {c.trajectory for c in real}), failure)


def family_rows(family: str) -> list[Row]:
    module = family_module(family)
    fixture = getattr(module, "FIXTURE", None) or EXTRA_FIXTURES.get(family)
    if fixture is not None:
        rows = tokenizer_rows(family, fixture, "token")
    else:
        renderer = build_renderer(family, "standin")
        rows = renderer_rows(family, renderer, "stand-in", "token (stand-in)")
    compatible = getattr(module, "COMPATIBLE_FIXTURE", None)
    if compatible is not None:  # a real tokenizer of a sibling model whose tokens suffice
        rows += tokenizer_rows(family, compatible, "token (sibling's tokenizer)")
    return rows


def tokenizer_rows(family: str, fixture: str, level: str) -> list[Row]:
    folder = TOKENIZERS / fixture
    if not folder.is_dir():
        raise SystemExit(f"missing fixture tokenizer {folder}")
    return renderer_rows(family, build_renderer(family, folder), f"`{fixture}/`", level)


def renderer_rows(family: str, renderer: TemplateRenderer, tokenizer: str,
                  level: str) -> list[Row]:
    modes = ["on", "off"] if renderer.spec.thinking_kwarg else ["both"]
    aliases = sorted(a for a, m in FAMILIES.items() if m == FAMILIES[family] and a != family)
    rows = []
    for mode in modes:
        report = verify_renderer(renderer, thinking=mode)
        if mode == "both":
            mode = "always" if renderer.spec.reasoning else "none"
        summary = report.summary()
        audit = audit_row(renderer, mode if mode in ("on", "off") else "both")
        rows.append(Row(family, aliases, tokenizer, level, mode, report.checks(),
                        sorted(renderer.allowed_append_roles), sorted(report.roles_exercised),
                        renderer.max_trailing_trim, report.passed, summary["first_failure"],
                        *audit, pinned=pinned_text(renderer)))
    return rows


def pinned_text(renderer: TemplateRenderer) -> str:
    pins = renderer.spec.pinned_kwargs
    return ", ".join(f"`{k}={v}`" for k, v in sorted(pins.items())) if pins else "-"


def render_doc(rows: list[Row]) -> str:
    out = [HEADER, "", "## Verification matrix", "",
           "| family | aliases | tokenizer | level | thinking | " + " | ".join(CHECKS)
           + " | append roles | trim | pinned | verdict |",
           "|---" * (9 + len(CHECKS)) + "|"]
    for r in rows:
        cells = []
        for check in CHECKS:
            ok, total = r.checks.get(check, (0, 0))
            cells.append(f"{ok}/{total}")
        out.append(f"| `{r.family}` | {', '.join(r.aliases) or '-'} | {r.tokenizer} | {r.level} "
                   f"| {r.mode} | " + " | ".join(cells) + f" | {', '.join(r.roles)} | {r.trim} "
                   f"| {r.pinned} | {'PASS' if r.passed else 'FAIL: ' + str(r.first_failure)} |")
    out += ["", f"{len({r.family for r in rows if r.passed})} families pass, "
            f"{len({r.family for r in rows if not r.passed})} fail.", ""]
    out += audit_section(rows)
    out += ["## Families", ""]
    for family in ORDER:
        doc = inspect.getdoc(family_module(family)) or ""
        out += [f"### `{family}`", "", doc, ""]
    out += [RENDERERS_SECTION]
    return "\n".join(out).rstrip() + "\n"


def audit_section(rows: list[Row]) -> list[str]:
    """The audit corpus table: prefix checks, skips by capability, format limits."""
    names = ", ".join(f"`{c.name}`" for c in audit_corpus())
    out = ["## Audit corpus", "",
           f"`tito/render/audit.py`: {names}. Run by `tito verify-template` (unless "
           "`--no-audit`) and here; a conversation that appends a role the family does not "
           "allow is skipped by that declared capability. A family fails on any prefix "
           "break or declined bridge, and on a parse failure that is not a declared format "
           "limit (`FORMAT_LIMITS`).", "",
           "| family | thinking | " + " | ".join(CHECKS) + " | skipped (role not allowed) "
           "| format limits | verdict |", "|---" * (5 + len(CHECKS)) + "|"]
    for r in rows:
        cells = [f"{r.audit.get(c, (0, 0))[0]}/{r.audit.get(c, (0, 0))[1]}" for c in CHECKS]
        skipped = ", ".join(s.removeprefix("audit/") for s in r.audit_skipped) or "-"
        limits = ", ".join(s.removeprefix("audit/") for s in r.audit_limits) or "-"
        verdict = "PASS" if r.audit_failure is None else f"FAIL: {r.audit_failure}"
        out.append(f"| `{r.family}` | {r.mode} | " + " | ".join(cells)
                   + f" | {skipped} | {limits} | {verdict} |")
    notes = sorted({(family, why) for family, limits in FORMAT_LIMITS.items()
                    for why in limits.values()})
    out += ["", "Format limits: " + "; ".join(f"`{f}`: {why}" for f, why in notes) + "."
            if notes else "Format limits: none.", ""]
    return out


HEADER = """# Model families

Generated by `scripts/family_matrix.py` (do not edit by hand; CI runs it with `--check`).

Every family renders append-only (pinned kwargs or a corrected template in
`tito/render/templates/`), declares its junction rule, allowed append roles, stop ids and
trailing trim, and parses completions (reasoning, tool calls; a malformed call stays in
`content`). `tito verify-template --tokenizer DIR --family F` runs the same checks as this
matrix on any tokenizer folder:

- **text_prefix**: the render of the first n messages is a prefix of the render of all;
- **token_prefix**: prompt ids + the model's completion ids (ending at its stop id) + bridge
  ids decode to the canonical render (first divergence shown with context);
- **parse_round_trip**: parsing a rendered assistant message gives back its content,
  reasoning and tool calls (arguments equal as JSON).

*Level*: `token` runs over the real tokenizer from `../shared/fixtures/tokenizers`;
`token (stand-in)` runs over a documented stand-in (a deterministic byte-level BPE with the
family's special tokens, `tito/render/families/loaders.py`) where the real tokenizer is not
available offline: it checks junctions, bridges, special-token structure and parsing, not
the model's exact ids. Build one with `--tokenizer standin`. `token (sibling's tokenizer)`
runs over the real tokenizer of a sibling model whose special tokens the family's format
needs (DeepSeek V4's for V4.1): real BPE at every junction, not the model's own
vocabulary. `append roles`: what may follow an assistant turn (any other role is a 400
`role_not_allowed`). `trim` is the declared trailing trim (stored ids a junction may drop).
`pinned`: the template options the family fixes to render append-only (shown in `/health`;
a request asking otherwise is a 400 `template_kwarg_conflict`); what each family tolerates
and refuses beyond that is in its section below. Every renderer is ours (the decision is
at the end). The shipped Qwen3 / Qwen3-Thinking templates, run as `--family default`, fail
the verifier (tests prove it).

A failed case says why in a typed `reason` (`reasoning_dropped`, `value_reserialized`,
`tool_call_rerendered`, `bpe_merge_across_junction`, `tokenization_differs`,
`truncated_without_close`, `unknown_closing_sequence`, `assistant_in_appended_span`,
`special_token_differs`, `text_differs`, `parse_mismatch`, `render_error`; design §4.4),
with the first differing token and text; `/health`'s self-check and the samples'
`tito_session_mismatch` items carry the same reasons. `--family default` reads its
thinking switch and its end-of-turn marker off the template (`--stop-token` overrides the
marker)."""

RENDERERS_SECTION = """## The `renderers` package (PyPI, Apache-2.0): decision

Evaluated `renderers==0.1.12` with `scripts/eval_renderers.py` (our pool, thinking on,
completions as `renderers` renders them; a bridge must reproduce `renderers`' own full
render, and returning `None` means a re-render, i.e. TITO lost for that turn):

| family | `renderers` config | bridges declined (default retention) | with `thinking_retention="all"` | notes |
|---|---|---|---|---|
| qwen3 | Qwen3RendererConfig | 6/10 (every user/system boundary) | 2/10 declined; 4/10 differ from its own full render; 4 parse failures | |
| qwen35 | Qwen35RendererConfig | 6/10 | 2/10 declined; 4/10 differ; 3 parse failures | |
| deepseek_v4 | DeepSeekV4RendererConfig | 3/10 (incl. parallel tool results) | 3/10 | |
| deepseek_v31 | DeepSeekV3RendererConfig | 2/10 | 2/10 | |
| llama3 | Llama3RendererConfig | - | - | refuses the Llama 3 tokenizer.json (`<|eom_id|>` missing) |
| gpt_oss | GptOssRendererConfig | - | - | needs `openai-harmony`'s vocab download (fails offline) |

Every bridge declines when the appended run contains an assistant message (injected
few-shot/compaction turns), by design. `renderers` never broke a prefix, but a declined
bridge is a verifier failure for that role, and `thinking_retention="all"` bridges at the
price of disagreeing with its own canonical render. **Decision: every family is ours**
(renderer source `ours` in the matrix); `renderers` is not a dependency. The corrected
templates render history reasoning on purpose, which makes user/system appends legal and
keeps the canonical render equal to what the model saw. Re-run the evaluation with
`pip install renderers==0.1.12 transformers` and `python scripts/eval_renderers.py`."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 on a failing family or a stale document")
    parser.add_argument("--out", type=Path, default=DOC)
    args = parser.parse_args(argv)
    rows = [row for family in ORDER for row in family_rows(family)]
    text = render_doc(rows)
    failed = sorted({r.family for r in rows if not r.passed or r.audit_failure is not None})
    for r in rows:
        print(f"{r.family:15s} {r.mode:7s} {r.level:17s} {'PASS' if r.passed else 'FAIL'} "
              f"audit {'PASS' if r.audit_failure is None else 'FAIL: ' + r.audit_failure}")
    if failed:
        print(f"regression: {', '.join(failed)} fail the verifier or the audit corpus",
              file=sys.stderr)
        return 1
    if args.check:
        if not args.out.is_file() or args.out.read_text() != text:
            print(f"{args.out} is stale: run scripts/family_matrix.py", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

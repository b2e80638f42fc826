"""The demo's calculator tool and answer verifier (pure: no I/O).

:func:`evaluate` computes an arithmetic expression by walking its :mod:`ast`; it never
calls :func:`eval`. Allowed: int/float literals, ``+ - * / // % **`` (``^`` is read as
``**``, ``×``/``÷`` as ``*``/``/``, ``1,234`` as ``1234``), unary ``+``/``-``,
parentheses and the functions ``abs round sqrt min max``. Sizes are bounded (expression
length, exponent, result magnitude) so a model cannot make the tool hang or eat memory.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionToolParam

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e18

CALCULATOR_TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression, e.g. '17 * 23' or '(3.5 + 2) / 4'.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string",
                               "description": "the expression, with + - * / ** and ()"},
            },
            "required": ["expression"],
        },
    },
}


class CalculatorError(ValueError):
    """The expression is not allowed or cannot be computed; the message says why."""


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos, ast.USub: operator.neg,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs, "round": round, "sqrt": math.sqrt, "min": min, "max": max,
}
_SYMBOLS = str.maketrans({"^": "**", "×": "*", "÷": "/", "−": "-"})
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # 1,234 -> 1234 (not "max(1, 5)")


def evaluate(expression: str) -> int | float:
    """The value of ``expression``; :class:`CalculatorError` when it is not allowed."""
    if not isinstance(expression, str):
        raise CalculatorError("the expression must be a string")
    text = _THOUSANDS.sub("", expression.translate(_SYMBOLS)).strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression: {exc.msg}") from None
    value = _eval(tree.body)
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not a finite number")
    return value


def _check(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalculatorError("only numbers are allowed")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError("the result is too large")
    return value


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        return _check(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponents are limited to {MAX_EXPONENT}")
        try:
            return _check(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except (OverflowError, ValueError) as exc:
            raise CalculatorError(f"cannot compute: {exc}") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(_UNARY[type(node.op)](_eval(node.operand)))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS and not node.keywords and len(node.args) <= 4):
        args = [_eval(arg) for arg in node.args]
        try:
            return _check(_FUNCTIONS[node.func.id](*args))
        except (TypeError, ValueError) as exc:
            raise CalculatorError(f"{node.func.id}(): {exc}") from None
    raise CalculatorError(f"{type(node).__name__} is not allowed in an arithmetic expression")


def format_number(value: int | float) -> str:
    """A number as a model should read it: ``391``, ``0.25``, ``8.04672`` (no ``.0``)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int) else format(value, ".12g")


def run_calculator(arguments: str | dict[str, Any] | None) -> str:
    """Execute one ``calculator`` tool call; the text of the tool result (errors included)."""
    import json

    try:
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return "error: the arguments are not valid JSON"
    expression = args.get("expression") if isinstance(args, dict) else None
    if expression is None:
        return 'error: missing "expression"'
    try:
        return format_number(evaluate(str(expression)))
    except CalculatorError as exc:
        return f"error: {exc}"


_NUMBER = re.compile(r"(?<![\w.])[-−]?\d[\d,]*(?:\.\d+)?(?![\w])")


def extract_numbers(text: str | None) -> list[float]:
    """Every number in ``text``, in order (``1,234.5`` and ``-3`` included)."""
    out: list[float] = []
    for found in _NUMBER.findall(text or ""):
        try:
            out.append(float(found.replace(",", "").replace("−", "-")))
        except ValueError:
            continue
    return out


def extract_number(text: str | None) -> float | None:
    """The last number in ``text``, or None."""
    found = extract_numbers(text)
    return found[-1] if found else None


def mentions(text: str | None, answer: float | int | None) -> bool:
    """Whether any number in ``text`` is the reference ``answer``."""
    return any(is_correct(value, answer) for value in extract_numbers(text))


def is_correct(value: float | None, answer: float | int | None, *, rel_tol: float = 1e-4
               ) -> bool:
    """Whether ``value`` equals the reference ``answer`` (relative tolerance, 1e-6 absolute)."""
    if value is None or answer is None:
        return False
    return math.isclose(value, float(answer), rel_tol=rel_tol, abs_tol=1e-6)

"""The built-in `arith` environment: deterministic problems, a safe calculator, exact grading."""

from __future__ import annotations

import asyncio
from fractions import Fraction

import pytest

from envhub.envs.builtin.arith.calculator import CalculatorError, evaluate, parse_answer
from envhub.envs.builtin.arith.problems import generate
from envhub.envs.environment import RunContext
from envhub.envs.loader import load_env
from envhub.orchestrator.groups.memory_sandbox import MemorySandbox


def test_problems_are_deterministic_and_their_steps_give_the_answer():
    a, b = generate(7, 40), generate(7, 40)
    assert a == b and generate(8, 40) != a
    for p in a:
        assert evaluate(p.steps[-1]) == p.answer, p
        assert p.question and str(p.answer) not in p.question.split("?")[-1]


@pytest.mark.parametrize("expr,value", [
    ("2 + 3 * 4", 14), ("(2 + 3) * 4", 20), ("7 / 2", Fraction(7, 2)), ("7 // 2", 3),
    ("2 ** 10", 1024), ("-3 + 1", -2), ("1,000 * 3", 3000), ("2^3", 8),
    ("0.1 + 0.2", Fraction(3, 10)),
])
def test_calculator(expr, value):
    assert evaluate(expr) == value


@pytest.mark.parametrize("expr", [
    "__import__('os').system('true')", "open('/etc/passwd')", "x + 1", "9 ** 9 ** 9",
    "1 / 0", "10 ** 40", "[1, 2]", "", "1 +", "2 ** 0.5", "'a' * 3",
    "1e999", "-1e999 + 1", "1e308 * 10",  # past float's range: an error, not an agent_error
])
def test_calculator_refuses_anything_but_bounded_arithmetic(expr):
    with pytest.raises(CalculatorError):
        evaluate(expr)


@pytest.mark.parametrize("expr", [
    "((((2**-64)**64)**64)**64)**64",  # each power in bounds, together 2**-68,719,476,736
    "((2**-64)**64)**64",
    "(1/3)**64 * (1/7)**64 * (1/11)**64 * (1/13)**64 * (1/17)**64 * (1/19)**64",
])
def test_a_tiny_value_with_a_huge_denominator_is_refused_before_it_is_built(expr):
    """Small in magnitude, so the 30-digit bound let it through: the old calculator built
    2**-16,777,216 (4.9 s, 470 MB) for the first one's inner four powers, on the event loop."""
    with pytest.raises(CalculatorError, match="too precise"):
        evaluate(expr)
    assert evaluate("(1/3)**10") == Fraction(1, 3 ** 10)  # ordinary fractions still work


def test_answer_parsing_tolerates_formatting_only():
    assert parse_answer(" 1,234. ") == 1234 and parse_answer("$42") == 42
    assert parse_answer("forty two") is None and parse_answer("") is None


@pytest.mark.parametrize("answer", ["1e20000000", "1E-20000000", "-3e999999999", "7" * 101,
                                    "1" + "0" * 200])
def test_answers_too_large_to_parse_cheaply_are_not_numbers(answer):
    """Untrusted numbers parse with bounded cost: Fraction("1e20000000") alone held the
    runner's event loop for 17 s."""
    assert parse_answer(answer) is None


def test_answers_with_small_exponents_still_parse():
    assert parse_answer("4.2e1") == 42 and parse_answer("1e2") == 100
    assert parse_answer("-7/2") == Fraction(-7, 2) and parse_answer(".5") == Fraction(1, 2)


# Forms Python's number parsers accept that hid a huge exponent from the old regex check (it
# read "1_0e9_9999_999" as exponent 9; Fraction built 10^999,999,999 on the runner's loop), or
# that use digits other than ASCII's (int() reads them); none is an answer.
HIDDEN_EXPONENTS = ["1_0e9_9999_999", "1e9_999_999_999", "1_000", "\u0661e99999999",
                    "\uff11\uff10e999999999", "1e99999999/3", "3/1e99999999", "1.5e2/3"]


@pytest.mark.parametrize("answer", HIDDEN_EXPONENTS)
def test_answers_the_bound_cannot_read_are_not_numbers(answer):
    assert parse_answer(answer) is None


def test_a_hidden_exponent_submitted_scores_zero_at_once(tmp_path):
    """The filed answer, through the environment: submitted, graded 0 (before: still running
    after 60 s)."""
    loaded = load_env("arith")
    env, task = loaded.env, loaded.env.load_tasks()[0]

    async def go():
        box = MemorySandbox()
        ctx = RunContext("r", "none", lambda spec: None, tmp_path)  # type: ignore[arg-type]
        sent = await env.call_tool(task, "submit", '{"answer": "1_0e9_9999_999"}', box, {})
        assert sent.submitted
        verdict = await env.verify(task, box, ctx)
        assert (verdict.outcome, verdict.resolved, verdict.env_failure) == (0.0, False, None)
    asyncio.run(go())


def test_tools_oracle_and_verifier_meet_at_the_answer_file(tmp_path):
    loaded = load_env("arith")
    env, task = loaded.env, loaded.env.load_tasks()[0]

    async def go():
        box = MemorySandbox()
        ctx = RunContext("r", "none", lambda spec: None, tmp_path)  # type: ignore[arg-type]
        assert (await env.verify(task, box, ctx)).resolved is False  # nothing submitted
        calc = await env.call_tool(task, "calculator", '{"expression": "6*7"}', box, {})
        bad = await env.call_tool(task, "calculator", '{"expression": "import os"}', box, {})
        broken = await env.call_tool(task, "calculator", "{not json", box, {})
        wrong = await env.call_tool(task, "submit", '{"answer": "-1"}', box, {})
        assert (calc.content, calc.is_error) == ("42", False)
        assert bad.is_error and broken.is_error and wrong.submitted
        assert (await env.verify(task, box, ctx)).outcome == 0.0
        await env.solve(task, box, ctx)
        verdict = await env.verify(task, box, ctx)
        assert verdict.resolved and verdict.outcome == 1.0
        schemas = {s["function"]["name"] for s in env.tool_schemas(task)}
        assert schemas == {"calculator", "submit"}

    asyncio.run(go())

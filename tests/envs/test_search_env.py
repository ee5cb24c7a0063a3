"""The built-in `search` environment: a reproducible offline corpus, bounded search/open_page
tools, ≥ 500 validated multi-hop questions that the oracle solves through those tools, and
agents that do not search (or cheat) scoring low."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envhub.cli import app
from envhub.envs.agents import make_agent
from envhub.envs.builtin.search import tools
from envhub.envs.builtin.search.corpus import corpus_digest, generate_world, render_pages
from envhub.envs.builtin.search.index import (
    MAX_PAGE_CHARS,
    MAX_RESULTS,
    Index,
    build_index,
    open_corpus,
)
from envhub.envs.builtin.search.synth import (
    Question,
    follow_hops,
    guess_without_search,
    normalise,
    priors,
    rejection,
)
from envhub.envs.environment import RunContext, Task
from envhub.envs.loader import load_env
from envhub.orchestrator.groups.memory_sandbox import MemorySandbox


@pytest.fixture(scope="module")
def loaded():
    return load_env("search")


@pytest.fixture(scope="module")
def tasks(loaded) -> list[Task]:
    return loaded.env.load_tasks()


def context(tmp_path: Path) -> RunContext:
    return RunContext("r", "none", lambda spec: None, tmp_path)  # type: ignore[arg-type]


def grade(env, task: Task, tmp_path: Path, *calls: tuple[str, dict]) -> float:
    """Run tool calls (name, arguments) in a fresh rollout, then the verifier: the outcome."""

    async def go() -> float:
        box = MemorySandbox()
        for name, args in calls:
            await env.call_tool(task, name, json.dumps(args), box, {})
        return (await env.verify(task, box, context(tmp_path))).outcome

    return asyncio.run(go())


def test_corpus_is_generated_reproducibly_and_matches_the_pinned_digest(loaded, tmp_path):
    seed = loaded.manifest.metadata["corpus_seed"]
    pages = render_pages(generate_world(seed))
    assert corpus_digest(pages) == corpus_digest(render_pages(generate_world(seed)))
    assert corpus_digest(pages) == loaded.manifest.metadata["corpus_sha256"]
    assert corpus_digest(render_pages(generate_world(seed + 1))) != corpus_digest(pages)
    assert len(pages) >= 2000 and len({p.title for p in pages}) == len(pages)
    assert set(Counter(p.kind for p in pages)) == {"country", "city", "river", "university",
                                                   "company", "person"}
    # the index is a function of the pages: built once, found again by digest
    assert build_index(pages, tmp_path) == build_index(pages, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [build_index(pages, tmp_path).name]


def test_pipeline_builds_500_validated_questions_the_oracle_solves_through_the_tools(
        loaded, tasks, tmp_path):
    assert len(tasks) >= 500 and len({t.data["question"] for t in tasks}) == len(tasks)
    assert Counter(t.data["difficulty"] for t in tasks).keys() == {"easy", "medium", "hard"}
    for t in tasks:
        assert len(t.data["hops"]) == {"easy": 2, "medium": 3, "hard": 4}[t.data["difficulty"]]
        assert normalise(t.data["answer"]) not in normalise(t.data["question"])
    assert sum(bool(t.data["distractors"]) for t in tasks) > 0.9 * len(tasks)
    env = loaded.env

    async def solve_all() -> list[bool]:
        solved = []
        for task in tasks:
            box = MemorySandbox()
            await env.solve(task, box, context(tmp_path))
            solved.append((await env.verify(task, box, context(tmp_path))).resolved)
        return solved

    assert all(asyncio.run(solve_all()))


def test_the_same_seeds_give_the_same_questions(loaded, tasks):
    from envhub.envs.builtin.search.synth import synthesize

    corpus = open_corpus(loaded.manifest.metadata["corpus_seed"])
    again, _ = synthesize(corpus.world, lambda n, a: tools.call(corpus.index, n, a),
                          loaded.manifest.metadata["seed"], 40)
    assert [q.row() for q in again] == [t.data for t in tasks[:40]]


def test_validator_rejects_questions_answerable_without_search_or_not_with_it(loaded, tasks):
    corpus = open_corpus(loaded.manifest.metadata["corpus_seed"])
    world, prior = corpus.world, priors(corpus.world)

    def call(name: str, args: str):
        return tools.call(corpus.index, name, args)

    good = Question(**tasks[0].data)
    assert rejection(good, prior, call) is None
    leaked = Question(**{**tasks[0].data,
                         "question": f"{good.question} (Hint: {good.answer}.)"})
    assert rejection(leaked, prior, call) == "answer_in_question"
    person = next(e for e in world.values() if e.kind == "person")
    common = prior["What is the occupation of {x}?"]
    guessable = Question("", f"What is the occupation of {person.name}?", common,
                         [{"page": person.name, "key": "Occupation"}], "easy",
                         "What is the occupation of {x}?")
    assert guess_without_search(guessable.question, prior) == common
    assert rejection(guessable, prior, call) == "prior_guesses_it"
    wrong_key = Question(**{**tasks[0].data, "hops": [
        {**h, "key": "Motto"} if i == len(good.hops) - 1 else h
        for i, h in enumerate(good.hops)]})
    assert rejection(wrong_key, prior, call) == "oracle_failed"
    unsearchable = Question(**{**tasks[0].data, "hops": [
        {"page": "No Such Page", "key": "Born"}, *good.hops[1:]]})
    assert follow_hops(unsearchable.hops, call) is None


def test_agents_that_do_not_search_score_low(loaded, tasks, tmp_path):
    """The prior (the most common answer of the question's form) and copying a name from the
    question: neither solves the validated questions."""
    env = loaded.env
    prior = priors(open_corpus(loaded.manifest.metadata["corpus_seed"]).world)
    guessed = [grade(env, t, tmp_path, ("submit", {"answer": guess_without_search(
        t.data["question"], prior) or "unknown"})) for t in tasks[:200]]
    copied = [grade(env, t, tmp_path, ("submit", {"answer": " ".join(re.findall(
        r"[A-Z][a-z]+", t.data["question"])[1:3]) or "x"})) for t in tasks[:200]]
    assert sum(guessed) / len(guessed) <= 0.05 and sum(copied) / len(copied) <= 0.05


def test_cheats_fail(loaded, tasks, tmp_path):
    """Submitting every name, a second answer after a wrong one, or the most relevant page's
    value without following the hops does not pay."""
    env, task = loaded.env, tasks[0]
    names = ", ".join(open_corpus(loaded.manifest.metadata["corpus_seed"]).world)
    assert grade(env, task, tmp_path, ("submit", {"answer": names})) == 0.0  # refused: too long
    many = ", ".join(d for d in task.data["distractors"]) + ", " + task.data["answer"]
    assert grade(env, task, tmp_path, ("submit", {"answer": many[-200:]})) == 0.0
    assert grade(env, task, tmp_path, ("submit", {"answer": "nobody"}),
                 ("submit", {"answer": task.data["answer"]})) == 0.0  # the first answer stands
    assert grade(env, task, tmp_path, ("submit", {"answer": f" THE {task.data['answer']}. "})) \
        == 1.0  # formatting does not matter

    def shortcut(t: Task) -> float:
        """Search the question, open the best page, submit its value for the last hop's key."""
        best = tools.hit_titles(tools.call(env.corpus.index, "search", json.dumps(
            {"query": t.data["question"]})).content)[0]
        page = tools.call(env.corpus.index, "open_page", json.dumps({"title": best})).content
        from envhub.envs.builtin.search.corpus import infobox

        value = infobox(page).get(t.data["hops"][-1]["key"], "none")
        return grade(env, t, tmp_path, ("submit", {"answer": value}))

    scores = [shortcut(t) for t in tasks[:150]]
    assert sum(scores) / len(scores) <= 0.1


def test_tools_bound_untrusted_input(loaded, tasks):
    index: Index = loaded.env.corpus.index

    def call(name: str, args: object):
        return tools.call(index, name, args if isinstance(args, str) else json.dumps(args))

    assert call("search", {"query": "x" * 301}).is_error
    assert call("search", {"query": "Port", "k": 11}).is_error
    assert call("search", {"query": "Port", "k": True}).is_error
    assert call("search", {"query": "?!"}).is_error and call("search", "{oops").is_error
    assert call("search", ["Port"]).is_error and call("search", {"query": 5}).is_error
    listing = call("search", {"query": "Port " * 40, "k": MAX_RESULTS}).content
    assert len(tools.hit_titles(listing)) == MAX_RESULTS
    for injection in ['"a" NEAR(b', "title:x*", "a OR", "^b AND NOT c", "x' --"]:
        assert not call("search", {"query": injection}).is_error  # words, never FTS5 syntax
    title = tasks[0].data["hops"][0]["page"]
    page = call("open_page", {"title": f"  {title.upper()} "})
    assert not page.is_error and page.content.startswith(title)
    assert all(len(p.text) <= MAX_PAGE_CHARS for p in render_pages(loaded.env.corpus.world))
    missing = call("open_page", {"title": title + "x"})
    assert missing.is_error and "did you mean" in missing.content
    assert call("open_page", {"title": "y" * 201}).is_error
    assert call("open_page", {}).is_error and call("nope", {}).is_error
    assert tools.read_answer(json.dumps({"answer": "z" * 201})).is_error  # type: ignore
    assert tools.read_answer(json.dumps({"answer": 1848})) == "1848"
    assert isinstance(tools.read_answer("{}"), tools.ToolResult)


def test_answer_normalisation():
    assert normalise(" The 1,234 km. ") == "1234" == normalise("1234")
    assert normalise("Port  Legeta!") == normalise("port legeta")
    assert normalise("an architect") == "architect" and normalise("Nobody") != "body"
    assert normalise("1848.0") != normalise("18480") and normalise("12,5") != "125"


def test_tool_schemas_and_the_required_agent(loaded, tasks):
    names = [s["function"]["name"] for s in loaded.env.tool_schemas(tasks[0])]
    assert names == ["search", "open_page", "submit"]
    agent = make_agent("tool:required")
    assert agent.tool_choice == "required"  # type: ignore[attr-defined]


def test_synth_cli_writes_the_same_questions_and_refuses_bad_input(tmp_path):
    runner = CliRunner()
    out = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for path in out:
        ran = runner.invoke(app, ["synth", "search", "-o", str(path), "-n", "30", "--seed",
                                  "5", "-d", "hard", "--pages-out", str(tmp_path / "p.jsonl")])
        assert ran.exit_code == 0, ran.output
        assert "wrote 30 questions" in ran.output
    rows = [json.loads(line) for line in out[0].read_text().splitlines()]
    assert out[0].read_bytes() == out[1].read_bytes() and len(rows) == 30
    assert {r["difficulty"] for r in rows} == {"hard"}
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) >= 2000
    for args, says in [(["-n", "0"], "--count"), (["-d", "extreme"], "--difficulty"),
                       (["-o", str(tmp_path)], "--out"),
                       (["-o", str(tmp_path / "no" / "q.jsonl")], "--out")]:
        argv = ["synth", "search", "-o", str(tmp_path / "q.jsonl"), *args]
        ran = runner.invoke(app, argv)
        assert ran.exit_code == 2 and says in ran.output, ran.output

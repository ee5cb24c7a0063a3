"""reasoning-gym datasets as environments (envs/rg): `rg:NAME[...]` references and their errors,
tasks regenerated from (dataset, seed, config), answers graded by the dataset's own scorer
(the oracle 1.0, a wrong answer what the scorer says), and the generated package."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envhub.cli import app
from envhub.envs.environment import UNGRADABLE, RunContext, Task, Verdict
from envhub.envs.errors import EnvLoadError
from envhub.envs.loader import load_env
from envhub.envs.rg.env import MAX_ANSWER_CHARS, ReasoningGymEnv
from envhub.envs.rg.scorer import Scored
from envhub.envs.rg.screen import mode_for, refusal
from envhub.orchestrator.groups.memory_sandbox import MemorySandbox

reasoning_gym = pytest.importorskip("reasoning_gym")  # the reasoning-gym extra (in `all`)

DATASETS = ["basic_arithmetic", "chain_sum", "leg_counting"]


def context(tmp_path: Path) -> RunContext:
    return RunContext("r", "none", lambda spec: None, tmp_path)  # type: ignore[arg-type]


def rollout(env: ReasoningGymEnv, task: Task, tmp_path: Path, *answers: str,
            oracle: bool = False) -> Verdict:
    """Submit `answers` in order (or run the oracle) in a fresh rollout, then verify."""

    async def go() -> Verdict:
        box = MemorySandbox()
        if oracle:
            await env.solve(task, box, context(tmp_path))
        for answer in answers:
            await env.call_tool(task, "submit", json.dumps({"answer": answer}), box, {})
        return await env.verify(task, box, context(tmp_path))

    return asyncio.run(go())


def rg_env(ref: str) -> ReasoningGymEnv:
    env = load_env(ref).env
    assert isinstance(env, ReasoningGymEnv)
    return env


@pytest.mark.parametrize("name", DATASETS)
def test_tasks_are_the_datasets_entries_and_the_oracle_scores_one(name, tmp_path):
    loaded = load_env(f"rg:{name}[size=4,seed=7]")
    assert loaded.manifest.name == f"rg-{name}" and loaded.manifest.tools == ["submit"]
    env = loaded.env
    assert isinstance(env, ReasoningGymEnv)
    tasks = env.load_tasks()
    expected = reasoning_gym.create_dataset(name, seed=7, size=4)
    assert [t.id for t in tasks] == [f"{name}-7-{i:05d}" for i in range(4)]
    assert [t.data["question"] for t in tasks] == [e["question"] for e in expected]
    for task, entry in zip(tasks, expected, strict=True):
        assert task.instruction.startswith(entry["question"])
        verdict = rollout(env, task, tmp_path, oracle=True)
        assert (verdict.outcome, verdict.resolved) == (1.0, True), verdict
        assert verdict.output == entry["answer"] and verdict.env_failure is None


def test_a_wrong_answer_scores_what_the_datasets_scorer_says(tmp_path):
    cases = {  # (dataset, how the gold answer is spoiled): the scorers disagree on partial credit
        "leg_counting": lambda gold: f"{gold} legs",  # containment: len(gold) / len(answer)
        "chain_sum": lambda gold: f"{gold} legs",  # decimal reward, partial
        "basic_arithmetic": lambda gold: str(int(gold) + 1),  # plain wrong: 0
    }
    seen = set()
    for name, spoil in cases.items():
        entry = reasoning_gym.create_dataset(name, seed=0, size=3)[1]
        answer = spoil(entry["answer"])
        want = reasoning_gym.create_dataset(name, seed=0, size=3).score_answer(answer, entry)
        for partial in (True, False):  # partial credit passed on, or only a full score counts
            env = rg_env(f"rg:{name}[size=3,seed=0,partial={str(partial).lower()}]")
            verdict = rollout(env, env.load_tasks()[1], tmp_path, answer)
            assert verdict.outcome == (pytest.approx(want) if partial else 0.0)
            assert verdict.info["score"] == pytest.approx(want) and verdict.resolved is False
            assert verdict.output == answer and verdict.info["submitted"] == answer
        seen.add(round(want, 3))
    assert len(seen) == 3 and 0.0 in seen and all(0.0 <= s < 1.0 for s in seen), seen


def test_listing_candidates_earns_nothing_by_default(tmp_path):
    """leg_counting's scorer gives len(gold)/len(answer) to an answer containing the gold one:
    "012...500" farms it on every task. By default only a full score is an outcome."""
    farm = "".join(str(i) for i in range(501))  # holds every count up to 500, in 1,393 chars
    for ref, want_positive in (("rg:leg_counting[size=3]", False),
                               ("rg:leg_counting[size=3,partial=true]", True)):
        env = rg_env(ref)
        for task in env.load_tasks():
            verdict = rollout(env, task, tmp_path, farm)
            assert verdict.info["score"] > 0  # the scorer itself falls for it
            assert (verdict.outcome > 0) is want_positive


def test_the_first_answer_stands_and_hostile_answers_score_zero(tmp_path):
    env = rg_env("rg:leg_counting[size=2]")
    task = env.load_tasks()[0]
    gold = str(task.data["answer"])
    assert rollout(env, task, tmp_path, "7", gold).outcome == 0.0  # a second submit is refused
    assert rollout(env, task, tmp_path).info["reason"] == "no answer submitted"
    # an answer past the cap is refused by the tool, not cut (a cut one could contain the gold)
    assert rollout(env, task, tmp_path, gold * (MAX_ANSWER_CHARS // len(gold) + 1)).outcome == 0
    for hostile in ("9**9**9**9", "NaN", "1e999999", "\udcff", "(" * 250 + "1" + ")" * 250):
        verdict = rollout(env, task, tmp_path, hostile)
        assert verdict.outcome == 0.0 and verdict.env_failure is None, (hostile, verdict)


def payloads(marker: Path) -> list[str]:
    """Answers that, run as Python, forge the worker's reply or create `marker`."""
    return ["__import__('os').write(1, b'{\"score\": 1.0}\\n')",
            f"open({str(marker)!r}, 'w').write('ran')",
            f"[c for c in ().__class__.__base__.__subclasses__()] or open({str(marker)!r}, 'w')",
            f"sin(__import__('pathlib').Path({str(marker)!r}).touch())",
            f"S({('open(' + repr(str(marker)) + ', ' + repr('w') + ')')!r})"]


@pytest.mark.parametrize("name", ["spiral_matrix", "polynomial_multiplication"])
def test_answers_a_scorer_would_run_as_python_never_run(name, tmp_path):
    """spiral_matrix's scorer eval()s the answer, polynomial_multiplication's sympy-parses it:
    an answer that is not a plain expression is refused before it reaches the scorer."""
    env = rg_env(f"rg:{name}[size=2]")
    task = env.load_tasks()[0]
    marker = tmp_path / "ran"
    for payload in payloads(marker):
        verdict = rollout(env, task, tmp_path, payload)
        assert (verdict.outcome, verdict.env_failure) == (0.0, None), (payload, verdict)
        assert [s.name for s in verdict.signals] == [UNGRADABLE], payload
        assert "would run as Python" in verdict.info["reason"] or \
            "not a plain expression" in verdict.info["reason"]
        assert not marker.exists(), payload
    assert rollout(env, task, tmp_path, oracle=True).outcome == 1.0
    assert rollout(env, task, tmp_path, "[1, 2] + [3]").outcome == 0.0  # plain: scored as usual


def test_the_workers_replies_cannot_be_forged_by_code_it_runs(tmp_path):
    """Defence in depth behind the screen: code run in a worker (sent to it here directly,
    skipping the screen) writes to fd 1, which goes to stderr; writing to the private reply fd
    gives a reply without the request's id, which kills the worker: ungradable, never 1."""
    env = rg_env("rg:spiral_matrix[size=2]")
    env.load_tasks()
    key = env.spec.key
    forged = "__import__('os').write(1, b'{\"score\": 1.0}\\n')"
    assert env.scorer.score(key, 0, forged, 30) == Scored(score=0.0)
    to_every_fd = ("[__import__('os').write(f, b'{\"score\": 1.0}\\n') for f in (3, 5, 6, 7)]")
    scored = env.scorer.score(key, 0, to_every_fd, 30)
    assert scored.score == 0.0 and "malformed reply" in (scored.error or ""), scored
    assert rollout(env, env.load_tasks()[0], tmp_path, oracle=True).outcome == 1.0


def test_every_screened_datasets_gold_answers_pass_the_screen():
    modes = {}
    for name in ("spiral_matrix", "string_insertion", "n_queens", "binary_matrix",
                 "polynomial_multiplication", "simple_integration", "intermediate_integration",
                 "countdown", "puzzle24", "leg_counting", "propositional_logic", "codeio"):
        data = reasoning_gym.create_dataset(name, seed=0, size=12)
        modes[name] = mode_for(data, data[0])
        for entry in data:
            if modes[name] and entry.get("answer") is not None:
                assert refusal(str(entry["answer"]), modes[name]) is None, (name, entry)
    assert modes == {"spiral_matrix": "eval", "string_insertion": "eval", "n_queens": "eval",
                     "binary_matrix": "eval", "polynomial_multiplication": "sympy",
                     "simple_integration": "sympy", "intermediate_integration": "sympy",
                     "countdown": "sympy", "puzzle24": "sympy", "leg_counting": None,
                     "propositional_logic": None, "codeio": None}
    assert refusal("1 2 3", "eval") is None  # eval() fails on it before running anything
    assert refusal("1 2 3", "sympy") is not None and refusal("'x'", "sympy") is not None


def test_a_scorer_that_hangs_on_the_answer_is_killed_and_the_answer_ungradable(tmp_path):
    # sympy evaluates a power tower for minutes in one C call (GIL held): only a process dies
    env = rg_env("rg:polynomial_multiplication[size=2,score_timeout_s=3]")
    task = env.load_tasks()[0]
    started = time.monotonic()
    verdict = rollout(env, task, tmp_path, "9**9**9**9")
    assert time.monotonic() - started < 60
    assert verdict.outcome == 0.0 and verdict.env_failure is None, verdict
    assert [s.name for s in verdict.signals] == [UNGRADABLE]
    assert "took over 3s" in verdict.info["reason"]
    # the next answer gets a fresh worker
    assert rollout(env, task, tmp_path, oracle=True).outcome == 1.0


def test_hanging_answers_hold_one_worker_each_and_the_wait_is_not_scoring_time(tmp_path):
    """Answers in flight beyond the pool's workers wait for one; only scoring is timed, so an
    innocent answer behind two hanging ones is still graded."""
    env = rg_env("rg:polynomial_multiplication[size=2,score_timeout_s=4]")
    task = env.load_tasks()[0]
    gold = str(task.data["answer"])

    async def go() -> list[Verdict]:
        async def one(answer: str) -> Verdict:
            box = MemorySandbox()
            await env.call_tool(task, "submit", json.dumps({"answer": answer}), box, {})
            return await env.verify(task, box, context(tmp_path))

        hangs = ["9**9**9**9"] * (env.scorer.size + 1)
        return await asyncio.gather(*(one(a) for a in [*hangs, gold]))

    *hung, graded = asyncio.run(go())
    assert all(v.outcome == 0.0 and v.env_failure is None for v in hung), hung
    assert (graded.outcome, graded.env_failure) == (1.0, None), graded


def test_a_scorer_that_fails_on_the_gold_answer_too_is_env_failure(tmp_path):
    # a time limit no scorer meets: the answer overruns, and so does the gold answer
    env = rg_env("rg:chain_sum[size=2,score_timeout_s=0.000001]")
    verdict = rollout(env, env.load_tasks()[0], tmp_path, "12")
    assert "gold answer too" in (verdict.env_failure or ""), verdict


def test_tasks_do_not_depend_on_the_processes_hash_seed():
    """isomorphic_strings' generator iterates sets of strings: reasoning-gym itself gives other
    questions under another PYTHONHASHSEED; the workers fix it, so every process agrees."""
    code = ("import json, reasoning_gym as rg; from envhub.envs.loader import load_env; "
            "d = rg.create_dataset('isomorphic_strings', seed=0, size=6); "
            "e = load_env('rg:isomorphic_strings[size=6]').env; "
            "print(json.dumps([[d[i]['question'] for i in range(6)], "
            "[t.data['question'] for t in e.load_tasks()]]))")
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                      text=True, check=True,
                                      env={**os.environ, "PYTHONHASHSEED": seed}).stdout)
            for seed in ("1", "2")]
    assert runs[0][0] != runs[1][0]  # reasoning-gym alone: the hash seed shows
    assert runs[0][1] == runs[1][1]


def test_one_dataset_with_two_configs_gets_two_names_and_task_ids():
    plain, other = load_env("rg:chain_sum[size=2]"), load_env("rg:chain_sum[size=2,max_terms=3]")
    assert plain.manifest.name == "rg-chain_sum"
    assert other.manifest.name.startswith("rg-chain_sum-") and other.manifest.name != plain.name
    assert load_env("rg:chain_sum[size=2,max_terms=6]").name == "rg-chain_sum"  # the default
    ids = [t.id for t in other.env.load_tasks()]
    assert ids == [f"{other.manifest.name.removeprefix('rg-')}-0-{i:05d}" for i in range(2)]


def test_grading_regenerates_the_entry_and_ignores_the_tasks_row(tmp_path):
    env = rg_env("rg:chain_sum[size=3]")
    task = env.load_tasks()[0]
    forged = Task(task.id, task.instruction, {**task.data, "answer": "1"})
    assert rollout(env, forged, tmp_path, "1").outcome == 0.0
    assert rollout(env, forged, tmp_path, str(task.data["answer"])).outcome == 1.0
    changed = Task(task.id, "", {**task.data, "question": "What is 1 + 0?"})
    assert "regenerated entry 0 differently" in (rollout(env, changed, tmp_path, "1")
                                                 .env_failure or "")


def test_settings_change_the_tasks_and_bad_ones_name_the_fix():
    easy = rg_env("rg:chain_sum[size=30,max_terms=2,max_digits=1]").load_tasks()
    assert all(t.data["metadata"]["num_terms"] == 2 and t.data["metadata"]["num_digits"] == 1
               for t in easy)
    listed = rg_env('rg:basic_arithmetic[size=20,operators=["+"],max_terms=3]').load_tasks()
    assert all(not set(t.data["metadata"]["expression"]) & set("*/") for t in listed)
    assert any("+" in t.data["metadata"]["expression"] for t in listed)
    other = rg_env("rg:chain_sum[size=3,seed=1]").load_tasks()
    assert [t.data["question"] for t in other] != [
        t.data["question"] for t in rg_env("rg:chain_sum[size=3]").load_tasks()]
    for ref, fix in [
        ("rg:chain_summ", "did you mean chain_sum"),
        ("rg:chain_sum[max_terms=many]", "max_terms takes a whole number"),
        ("rg:chain_sum[colour=1]", "not a setting of chain_sum; use size, seed or one of"),
        ("rg:chain_sum[min_terms=5,max_terms=2]", "max_terms must be >= min_terms"),
        ("rg:chain_sum[size=0]", "give 1 to"),
        ("rg:chain_sum[size=2", "write rg:NAME or rg:NAME[key=value,...]"),
        ("rg:chain_sum[seed=x]", "seed='x': give a whole number"),
    ]:
        with pytest.raises(EnvLoadError, match=fix.replace("[", r"\[").replace(".", r"\.")):
            load_env(ref)


def test_a_missing_reasoning_gym_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import raises ImportError
    with pytest.raises(EnvLoadError, match=r"pip install 'envhub\[reasoning-gym\]'"):
        load_env("rg:chain_sum")
    out = CliRunner().invoke(app, ["run", "rg:chain_sum", "--agent", "oracle"])
    assert out.exit_code == 2 and "pip install 'envhub[reasoning-gym]'" in out.output


def test_init_from_rg_writes_a_package_that_runs_the_same_tasks(tmp_path):
    target = tmp_path / "sums"
    out = CliRunner().invoke(app, ["init", str(target), "--from",
                                   "rg:chain_sum[size=5,seed=3,max_terms=3]"])
    assert out.exit_code == 0, out.output
    manifest = tomllib.loads((target / "envhub.toml").read_text())
    assert manifest["name"] == "sums" and manifest["dependencies"] == [
        "reasoning-gym>=0.1.25,<0.2"]
    assert manifest["metadata"]["dataset"] == "chain_sum"
    assert (manifest["metadata"]["seed"], manifest["metadata"]["size"]) == (3, 5)
    # every config field pinned, the given one as given
    assert manifest["metadata"]["config"] == {"min_terms": 2, "max_terms": 3, "min_digits": 1,
                                              "max_digits": 4, "allow_negation": False}
    package = load_env(str(target)).env
    by_ref = rg_env("rg:chain_sum[size=5,seed=3,max_terms=3]")
    assert isinstance(package, ReasoningGymEnv)
    assert [t.data for t in package.load_tasks()] == [t.data for t in by_ref.load_tasks()]
    again = CliRunner().invoke(app, ["init", str(target), "--from", "rg:chain_sum"])
    assert again.exit_code == 2 and "not empty" in again.output
    bad = CliRunner().invoke(app, ["init", str(tmp_path / "b"), "--from", "rg:chain_sum[x=1]"])
    assert bad.exit_code == 2 and "not a setting" in bad.output
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("mode", ["eval", "sympy"])
def test_the_screen_answers_the_same_whatever_the_recursion_limit(mode):
    """An answer nested past what the parser recurses through under Python's default limit
    (3,000 unary minuses, 5,000 additions) got a different answer under a raised limit (the
    eval screen let the parse failure through): now counted before parsing, refused alike."""
    deep = ["-" * 3000 + "1", "1" + "+1" * 5000, "~" * 20000 + "1"]
    before = sys.getrecursionlimit()
    answers = []
    for limit in (before, 100_000):
        sys.setrecursionlimit(limit)
        try:
            answers.append([refusal(a, mode) for a in deep])
        finally:
            sys.setrecursionlimit(before)
    assert answers[0] == answers[1], answers
    assert all(a == "the answer expression is too large for the scorer" for a in answers[0])

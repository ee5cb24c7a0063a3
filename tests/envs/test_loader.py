"""Loading environment packages: references, manifests, entrypoints, tasks via `datasets`."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from envhub.envs.builtin.arith.problems import generate
from envhub.envs.errors import EnvLoadError, EnvNotFound
from envhub.envs.loader import available_envs, load_env, resolve_folder, rows_to_tasks, task_rows
from envhub.envs.manifest import ManifestError, TasksSource, load_manifest
from tests.envs.conftest import ENTRYPOINT, MANIFEST, make_pkg

FIXTURES = Path(__file__).resolve().parent / "runtime_fixtures"

def test_builtin_arith_is_listed_and_loads():
    assert available_envs()["arith"] == "builtin"
    loaded = load_env("arith")
    tasks = loaded.env.load_tasks()
    assert loaded.name == "arith" and len(tasks) == 224  # 160 training + 64 held-out
    # 0.3's 224 problems are 0.2's first 224 (a smaller count drops problems from the end)
    seed = loaded.manifest.metadata["seed"]
    assert [t.data["question"] for t in tasks] == [p.question for p in generate(seed, 512)[:224]]
    assert loaded.manifest.sandbox.kind == "none"


def test_folder_package_loads_with_relative_imports(tmp_path):
    loaded = load_env(str(make_pkg(tmp_path / "pkg")))
    tasks = loaded.env.load_tasks()
    assert [t.id for t in tasks] == ["a-1", "b-2"]
    assert tasks[0].instruction == "fix it" and tasks[0].data["extra"] == 1
    assert loaded.env.tools(tasks[0]) == ["submit"]


def test_two_packages_with_the_same_module_names_do_not_collide(tmp_path):
    a = load_env(str(make_pkg(tmp_path / "a")))
    (tmp_path / "b").mkdir()
    b = load_env(str(make_pkg(tmp_path / "b", entry=ENTRYPOINT.replace("[PREFIX]", "['x']"))))
    assert type(a.env) is not type(b.env)
    assert b.env.tools(None) == ["x"] and a.env.tools(None) == ["submit"]


def test_unknown_name_lists_what_is_available():
    with pytest.raises(EnvNotFound, match="available: .*arith"):
        resolve_folder("no-such-env")
    with pytest.raises(EnvNotFound, match="no such folder"):
        resolve_folder("./no/such/folder")


@pytest.mark.parametrize("manifest,field", [
    (MANIFEST.replace('"1.0.0"', '"one"'), "version"),
    (MANIFEST.replace('"main:Env"', '"main"'), "entrypoint"),
    (MANIFEST + "\n[sandbox]\ncpus = -1\n", "sandbox.cpus"),
    (MANIFEST + "\n[sandbox]\nkind = \"vm\"\n", "sandbox.kind"),
    (MANIFEST + "\n[rewards]\nspeed = 1.0\n", "rewards"),
    ("surprise = 1\n" + MANIFEST, "surprise"),
    (MANIFEST + "\n[agent]\nmax_turn = 3\n", "agent.max_turn"),
    (MANIFEST.replace('name = "pkg"', ""), "name"),
])
def test_bad_manifest_names_the_field(tmp_path, manifest, field):
    with pytest.raises(ManifestError, match=f"field '{field}'"):
        load_env(str(make_pkg(tmp_path / "pkg", manifest=manifest)))


def test_unknown_field_lists_the_allowed_ones(tmp_path):
    bad = MANIFEST + "\n[agent]\nmax_turn = 3\n"
    with pytest.raises(ManifestError, match="allowed here: max_turns"):
        load_env(str(make_pkg(tmp_path / "pkg", manifest=bad)))


def test_missing_manifest_says_how_to_create_one(tmp_path):
    with pytest.raises(ManifestError, match="envhub init"):
        load_manifest(tmp_path)


def test_bad_entrypoints_say_what_to_fix(tmp_path):
    with pytest.raises(EnvLoadError, match="module 'nomod' not found"):
        load_env(str(make_pkg(tmp_path / "a", manifest=MANIFEST.replace("main:", "nomod:"))))
    with pytest.raises(EnvLoadError, match="no class 'Nope'"):
        load_env(str(make_pkg(tmp_path / "b", manifest=MANIFEST.replace(":Env", ":Nope"))))
    with pytest.raises(EnvLoadError, match="importing 'main' failed: ZeroDivisionError"):
        load_env(str(make_pkg(tmp_path / "c", entry="1/0\n")))
    with pytest.raises(EnvLoadError, match="lacks .*verify"):
        load_env(str(make_pkg(tmp_path / "d", entry=ENTRYPOINT.replace("def verify", "def x"))))


def test_parquet_tasks_load_and_leave_no_cache_behind(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"task_id": ["p1", "p2"], "prompt": ["x", "y"]}),
                   tmp_path / "tasks.parquet")
    before = set(Path(tempfile.gettempdir()).glob("envhub-tasks-*"))
    rows = task_rows(tmp_path, TasksSource(path="tasks.parquet"))
    assert [t.id for t in rows_to_tasks(rows)] == ["p1", "p2"]
    assert set(Path(tempfile.gettempdir()).glob("envhub-tasks-*")) == before


def test_missing_tasks_file_names_the_field(tmp_path):
    with pytest.raises(EnvLoadError, match="tasks.path"):
        task_rows(tmp_path, TasksSource(path="nope.jsonl"))
    with pytest.raises(EnvLoadError, match=r"\[tasks\] needs"):
        task_rows(tmp_path, TasksSource())


def test_crash_fixture_env_loads():
    loaded = load_env(str(FIXTURES / "crashy_env"))
    assert {t.id for t in loaded.env.load_tasks()} >= {"ok", "setup-crash", "sandbox-crash"}

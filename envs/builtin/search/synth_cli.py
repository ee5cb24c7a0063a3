"""`envhub synth search`: write validated multi-hop questions over the offline corpus as JSONL.

Imports only typer at top level (the console script's rule). Bad input exits 2 with the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NoReturn

import typer

synth_app = typer.Typer(help="Synthesise verifiable tasks for an environment.",
                        no_args_is_help=True)
MAX_COUNT = 20_000


@synth_app.command("search")
def search_command(
    out: Path = typer.Option(..., "--out", "-o", help="JSONL file to write, one question a line "
                             "(id, question, answer, hops, difficulty, form, distractors)."),
    count: int = typer.Option(600, "--count", "-n", help=f"Questions to keep, 1 to {MAX_COUNT}."),
    seed: int = typer.Option(1, "--seed", help="Question seed: the same seed, corpus and count "
                             "give the same questions."),
    corpus_seed: int = typer.Option(None, "--corpus-seed", help="Corpus seed (default: the "
                                    "built-in environment's, i.e. the shipped corpus)."),
    difficulty: Annotated[list[str] | None, typer.Option(
        "--difficulty", "-d", help="easy (2 pages to open), medium (3) or hard (4); repeatable "
        "(default: all three).")] = None,
    pages_out: Path = typer.Option(None, "--pages-out", help="Also write the corpus's pages "
                                   "as JSONL (title, kind, text)."),
) -> None:
    """Compose multi-hop questions over the search environment's corpus and keep those the
    validator accepts: not answerable without search, solved by the oracle through the
    environment's own search and open_page tools."""
    from envhub.envs.builtin.search import tools
    from envhub.envs.builtin.search.corpus import render_pages
    from envhub.envs.builtin.search.index import open_corpus
    from envhub.envs.builtin.search.synth import DIFFICULTY, synthesize

    if not 1 <= count <= MAX_COUNT:
        fail(f"--count {count}: give 1 to {MAX_COUNT}")
    unknown = [d for d in difficulty or [] if d not in DIFFICULTY.values()]
    if unknown:
        fail(f"--difficulty {unknown[0]}: use easy, medium or hard")
    for flag, path in (("--out", out), ("--pages-out", pages_out)):
        if path is not None and (path.is_dir() or not path.parent.is_dir()):
            fail(f"{flag} {path}: give a file in an existing folder")
    corpus = open_corpus(_shipped_corpus_seed() if corpus_seed is None else corpus_seed)
    found, rejected = synthesize(corpus.world,
                                 lambda name, args: tools.call(corpus.index, name, args),
                                 seed, count, difficulty)
    if len(found) < count:
        fail(f"only {len(found)} of --count {count} questions pass validation "
             f"(rejected: {dict(rejected)}); lower --count or allow more difficulties")
    out.write_text("".join(json.dumps(q.row(), ensure_ascii=False) + "\n" for q in found),
                   encoding="utf-8")
    if pages_out is not None:
        pages_out.write_text("".join(
            json.dumps({"title": p.title, "kind": p.kind, "text": p.text}, ensure_ascii=False)
            + "\n" for p in render_pages(corpus.world)), encoding="utf-8")
    levels = ", ".join(f"{sum(q.difficulty == level for q in found)} {level}"
                       for level in DIFFICULTY.values())
    typer.echo(f"wrote {len(found)} questions to {out} ({levels}); rejected "
               f"{sum(rejected.values())}: {dict(sorted(rejected.items()))}; corpus sha256 "
               f"{corpus.digest}")


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _shipped_corpus_seed() -> int:
    from envhub.envs.builtin import builtin_folders
    from envhub.envs.manifest import load_manifest

    return int(load_manifest(builtin_folders()["search"]).metadata["corpus_seed"])


def register(app: typer.Typer) -> None:
    """Add `envhub synth ...` to the top-level app."""
    app.add_typer(synth_app, name="synth")

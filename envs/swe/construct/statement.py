"""Issue-style problem statements: the symptom (failing checks, observed vs expected), never
the fix (no faulty line, no operator, no patch)."""

from __future__ import annotations

import random

from envhub.envs.swe.construct.mutate import Mutation

TITLES = ("{subject} gives wrong results", "Regression in {subject}",
          "Unexpected behaviour of {subject}", "{subject} is broken")
OPENINGS = (
    "After the latest changes to `{project}`, {subject} does not behave as it used to.",
    "We noticed that {subject} misbehaves on inputs that used to work.",
    ("Something changed in `{project}`: {subject} now produces results that contradict its "
     "documented behaviour."),
)


def subject_of(mutation: Mutation, project: str) -> str:
    """A public name the user would see: the function, the class of a method, or the package."""
    parts = mutation.function.split(".")
    if len(parts) > 1 and not parts[0].startswith("_"):
        return f"`{parts[0]}`"
    if not parts[-1].startswith("_"):
        return f"`{parts[-1]}()`"
    module = mutation.path.removeprefix("src/").removesuffix(".py").replace("/", ".")
    return f"`{module.removesuffix('.__init__')}`"


def problem_statement(mutation: Mutation, project: str, f2p: list[str], excerpts: list[str],
                      rng: random.Random) -> str:
    subject = subject_of(mutation, project)
    title = rng.choice(TITLES).format(subject=subject)
    lines = [title[0].upper() + title[1:], "",
             rng.choice(OPENINGS).format(project=project, subject=subject), ""]
    if excerpts:
        lines += ["These checks fail for me (output of pytest --tb=short):", ""]
        for excerpt in excerpts:
            lines += ["```", excerpt, "```", ""]
    names = sorted({t.split("::")[-1] for t in f2p})
    shown = ", ".join(f"`{n}`" for n in names[:6]) + (", ..." if len(names) > 6 else "")
    lines.append(f"In total {len(f2p)} check(s) of the test-suite fail ({shown}); they passed "
                 "before. Expected: the previous, documented behaviour, without breaking "
                 "anything else.")
    return "\n".join(lines).rstrip() + "\n"

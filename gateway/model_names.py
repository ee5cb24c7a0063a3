"""Requested model names → served models. Agents ask for names of their own (Claude Code for
claude-*, Codex for gpt-*); the alias table (`--model-alias PATTERN=MODEL`, fnmatch globs,
first match wins) decides which served model answers. With no table every name is served by
the one served model; with one, a name that is neither served nor matched gets 404."""

from __future__ import annotations

from fnmatch import fnmatchcase


def parse_alias(rule: str) -> tuple[str, str]:
    """'claude-*=qwen' → ('claude-*', 'qwen'). Raises ValueError with the expected form."""
    pattern, sep, target = rule.partition("=")
    if not sep or not pattern.strip() or not target.strip():
        raise ValueError(f"model alias {rule!r} must be PATTERN=MODEL, e.g. 'claude-*=default' "
                         "(PATTERN is an fnmatch glob: *, ?, [seq])")
    return pattern.strip(), target.strip()


class ModelNames:
    def __init__(self, served: list[str], aliases: list[str]):
        self.served = served  # served[0] answers every name when there is no alias table
        self.rules = [parse_alias(a) for a in aliases]
        for pattern, target in self.rules:
            if target not in served:
                raise ValueError(f"model alias {pattern}={target}: {target!r} is not served "
                                 f"here; served: {', '.join(served)}")

    def resolve(self, requested: str) -> str | None:
        """The served model that answers `requested`, or None (→ 404 model_not_found)."""
        if requested in self.served:
            return requested
        if not self.rules:
            return self.served[0]
        for pattern, target in self.rules:
            if fnmatchcase(requested, pattern):
                return target
        return None

    def describe(self) -> str:
        rules = ", ".join(f"{p}={t}" for p, t in self.rules)
        return f"served: {', '.join(sorted(self.served))}" + (f"; aliases: {rules}" if rules
                                                              else "")

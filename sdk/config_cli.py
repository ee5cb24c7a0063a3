"""CLI commands whose options are a pydantic config's fields (STYLE.md: flags map 1:1 onto
config fields), so a new field is a new flag without touching the command.

    class ServeConfig(BaseModel):
        port: int = Field(8400, ge=0, description="port; 0 picks a free one")
        upstreams: list[str] = Field(default_factory=list, description="engine URLs")

    def serve(config: ServeConfig) -> None:
        '''Run the server.'''               # the command's help
        ...

    app.command("serve")(config_command(ServeConfig, serve, flags={"upstreams": "--upstream"}))

Each field `name` becomes `--name-in-kebab-case` (`flags` renames one), typed as the field
(`X | None` optional, `list[X]` repeatable, `bool` as --x/--no-x, anything else a string that
pydantic parses), with its default and its `description` as help; `envvars` lets an option
fall back to an environment variable. Invalid values print `error: <pydantic's message>` and
exit with code 2, before `run` is called.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

__all__ = ["config_command"]

C = TypeVar("C", bound=BaseModel)
_SCALARS = (str, int, float, bool, Path)  # what every typer version converts itself


def config_command(config_type: type[C], run: Callable[[C], None], *,
                   flags: Mapping[str, str] | None = None,
                   envvars: Mapping[str, str] | None = None) -> Callable[..., None]:
    """A typer command: one option per field of `config_type`; calls `run(config)`."""
    import typer

    flags, envvars = dict(flags or {}), dict(envvars or {})
    unknown = (set(flags) | set(envvars)) - set(config_type.model_fields)
    assert not unknown, f"{config_type.__name__} has no fields {sorted(unknown)}"
    params = [_parameter(name, field, flags.get(name), envvars.get(name))
              for name, field in config_type.model_fields.items()]

    @functools.wraps(run)
    def command(**values: Any) -> None:
        try:
            config = config_type(**values)
        except ValidationError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from e
        run(config)

    # typer reads the options from the signature; the annotations must not be re-resolved
    # from `run`'s, which name the config, not the options.
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {}
    del command.__wrapped__  # inspect.signature would follow it back to `run`
    return command


def _parameter(name: str, field: FieldInfo, flag: str | None,
               envvar: str | None) -> inspect.Parameter:
    import typer

    annotation, choices = _cli_type(field.annotation)
    kebab = name.replace("_", "-")
    if flag is None:
        flag = f"--{kebab}/--no-{kebab}" if annotation is bool else f"--{kebab}"
    help_text = field.description or ""
    if choices:
        help_text += f" (one of: {', '.join(map(str, choices))})"
    if getattr(typer.core, "DEFAULT_MARKUP_MODE", None) == "rich":
        from rich.markup import escape  # "[[upstream]]" is text, not rich markup

        help_text = escape(help_text)
    if field.is_required():
        default: Any = ...
    elif field.default_factory is not None:
        default = field.default_factory()  # type: ignore[call-arg]  # factories take no args
    else:
        default = field.default
    option = typer.Option(default, flag, help=help_text, envvar=envvar)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                             annotation=annotation)


def _cli_type(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    """(the type typer converts to, the allowed values when the field is a Literal)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            base, choices = _cli_type(inner[0])
            return base | None, choices
        return str | None, ()
    if origin is list:
        item, _ = _cli_type(args[0] if args else str)
        return types.GenericAlias(list, (item if item in _SCALARS else str,)), ()
    if origin is typing.Literal:
        return str, args
    if annotation in _SCALARS:
        return annotation, ()
    return str, ()  # pydantic parses the text (e.g. a nested type given as JSON)

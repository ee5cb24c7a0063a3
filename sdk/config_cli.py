"""CLI commands whose options are a pydantic config's fields (STYLE.md: flags map 1:1 onto
config fields), so a new field is a new flag without touching the command.

    class ServeConfig(BaseModel):
        port: int = Field(8400, ge=0, description="port; 0 picks a free one")
        upstreams: list[str] = Field(default_factory=list, description="engine URLs")

    def serve(config: ServeConfig) -> None:
        '''Run the server.'''               # the command's help
        ...

    app.command("serve")(config_command(ServeConfig, serve, flags={"upstreams": "--upstream"}))

Each field `name` becomes `--name-in-kebab-case` (`flags` renames one, or gives it several
names: `("--agent", "-a")`; `arguments` makes fields positional), typed as the field (`X | None`
optional, `list[X]` repeatable, `bool` as --x/--no-x, anything else a string that pydantic
parses), with its default and its `description` as help; `envvars` lets an option fall back to
an environment variable. A field that may be None but defaults to a value takes `none` for
None (`--tau none`). Invalid values print `error: --flag: <pydantic's message>` and exit with
code 2, before `run` is called.

`config_file="--config"` adds that option: a TOML file whose keys are the fields (snake_case,
or any of the field's long flags without the dashes: `max-turns`, `dtype`), read first; a flag
or argument given on the command line (or by its environment variable) overrides its key.
TOML has no null: `"none"` is None, as on the command line. An unknown key, or a file that is
not TOML, is exit 2 naming it.

`presets={"resume": load}`: when that option is given, `load(value)` returns field values read
first (over the config file's), which the flags typed on the command line override
(`envhub train --resume OUT`: the run's own options).
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


NONE = "none"  # the text that means None for a field whose default is not None


def config_command(config_type: type[C], run: Callable[[C], None], *,
                   flags: Mapping[str, str | tuple[str, ...]] | None = None,
                   envvars: Mapping[str, str] | None = None,
                   arguments: tuple[str, ...] = (),
                   config_file: str | None = None,
                   presets: Mapping[str, Callable[[Any], dict[str, Any]]] | None = None
                   ) -> Callable[..., None]:
    """A typer command: one option per field of `config_type` (`arguments`: positional, in
    this order, before the options; `config_file`: the flag of a TOML file of fields, which
    the command line overrides; `presets`: options whose value names field values to start
    from); calls `run(config)`."""
    import typer

    flags, envvars, presets = dict(flags or {}), dict(envvars or {}), dict(presets or {})
    unknown = (set(flags) | set(envvars) | set(arguments) | set(presets)) - set(
        config_type.model_fields)
    assert not unknown, f"{config_type.__name__} has no fields {sorted(unknown)}"
    fields = config_type.model_fields
    order = [*arguments, *(name for name in fields if name not in arguments)]
    params = [_parameter(name, fields[name], flags.get(name), envvars.get(name),
                         positional=name in arguments) for name in order]
    names = {p.name: _flag_name(p) for p in params}
    keys = {name: name for name in fields}  # what a config file may call each field
    for p in params:
        for decl in getattr(p.default, "param_decls", None) or ():
            for flag in decl.split("/"):
                if flag.startswith("--") and not flag.startswith("--no-"):
                    keys.setdefault(flag[2:], p.name)
                    keys.setdefault(flag[2:].replace("-", "_"), p.name)
    assert not {CONFIG_PARAM, CONTEXT_PARAM} & set(fields), "a field named like ours"
    if config_file is not None:
        params.append(inspect.Parameter(
            CONFIG_PARAM, inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
            default=typer.Option(None, config_file, help="a TOML file of these options (keys: "
                                 "the flags' names); flags given here override its values")))
    if config_file is not None or presets:
        # typer hands the command its context (which says where each value came from)
        params.append(inspect.Parameter(CONTEXT_PARAM, inspect.Parameter.KEYWORD_ONLY,
                                        annotation=typer.Context))

    @functools.wraps(run)
    def command(**values: Any) -> None:
        path, ctx = values.pop(CONFIG_PARAM, None), values.pop(CONTEXT_PARAM, None)
        from_file = _read_config(path, fields, keys) if path is not None else {}
        for name, load in presets.items():
            if values.get(name) is not None:
                from_file.update(load(values[name]))
        given = {name: _none(value, fields[name]) for name, value in values.items()
                 if not (name in arguments and value in (None, []))  # none given: the default
                 and (name not in from_file or _typed(ctx, name))}
        try:
            config = config_type(**{**from_file, **given})
        except ValidationError as e:
            typer.echo(f"error: {_message(e, names)}", err=True)
            raise typer.Exit(2) from e
        run(config)

    # typer reads the options from the signature; the annotations must not be re-resolved
    # from `run`'s, which name the config, not the options.
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {}
    del command.__wrapped__  # inspect.signature would follow it back to `run`
    return command


CONFIG_PARAM = "config_file"
CONTEXT_PARAM = "config_cli_context"


def _typed(ctx: Any, name: str) -> bool:
    """Whether the option `name` was given on the command line or by its environment variable
    (not left at its default). `ctx`: the command's click context (typer's own click)."""
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _read_config(path: Path, fields: Mapping[str, FieldInfo],
                 keys: Mapping[str, str]) -> dict[str, Any]:
    """The fields a TOML config file sets (`keys`: key -> field); exit 2 naming what is
    wrong."""
    import tomllib

    import typer

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        typer.echo(f"error: --config {path}: {e}", err=True)
        raise typer.Exit(2) from None
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = keys.get(key)
        if name is None:
            typer.echo(f"error: --config {path}: unknown key {key!r}; the keys are the "
                       "options' names (see --help)", err=True)
            raise typer.Exit(2)
        out[name] = _none(value, fields[name])
    return out


def _message(error: ValidationError, names: Mapping[str, str]) -> str:
    """The first error as `--flag: what is wrong` (the flag the user typed for the field)."""
    first = error.errors()[0]
    loc = [str(p) for p in first["loc"]]
    where = names.get(loc[0], loc[0]) + "".join(f"[{p}]" for p in loc[1:]) if loc else ""
    more = error.error_count() - 1
    message = first["msg"].removeprefix("Value error, ")  # a validator's own words
    return (f"{where + ': ' if where else ''}{message}"
            + (f" (and {more} more)" if more else ""))


def _flag_name(param: inspect.Parameter) -> str:
    opts = getattr(param.default, "param_decls", None) or ()
    long = [o.split("/")[0] for o in opts if o.startswith("--")]
    return (long or list(opts) or [param.name.upper()])[0]


def _none(value: Any, field: FieldInfo) -> Any:
    return None if isinstance(value, str) and value == NONE and _takes_none(field) else value


def _takes_none(field: FieldInfo) -> bool:
    """May be None, but defaults to something else: `none` on the command line is None."""
    args = typing.get_args(field.annotation)
    return (typing.get_origin(field.annotation) in (typing.Union, types.UnionType)
            and type(None) in args and not field.is_required()
            and field.default_factory is None and field.default is not None)


def _parameter(name: str, field: FieldInfo, flag: str | tuple[str, ...] | None,
               envvar: str | None, positional: bool = False) -> inspect.Parameter:
    import typer

    annotation, choices = _cli_type(field.annotation)
    kebab = name.replace("_", "-")
    boolean = annotation in (bool, bool | None)
    if flag is None:
        flag = f"--{kebab}/--no-{kebab}" if boolean else f"--{kebab}"
    decls = (flag,) if isinstance(flag, str) else tuple(flag)
    help_text = field.description or ""
    if choices:
        help_text += f" (one of: {', '.join(map(str, choices))})"
    if _takes_none(field) and not boolean:
        annotation = str  # pydantic parses the number; `none` is None
        help_text += f" ({NONE}: None)"
    if getattr(typer.core, "DEFAULT_MARKUP_MODE", None) == "rich":
        from rich.markup import escape  # "[[upstream]]" is text, not rich markup

        help_text = escape(help_text)
    if field.is_required():
        default: Any = ...
    elif field.default_factory is not None:
        default = field.default_factory()  # type: ignore[call-arg]  # factories take no args
    else:
        default = field.default
    if positional:
        option = typer.Argument(... if default is ... else None, help=help_text,
                                show_default=False)  # not given: the field's default
    else:
        option = typer.Option(default, *decls, help=help_text, envvar=envvar)
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

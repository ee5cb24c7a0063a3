"""Commands whose options are a pydantic config's fields (sdk/config_cli.py)."""

from __future__ import annotations

from typing import Literal

import typer
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from envhub.gateway.cli import FLAGS as GATEWAY_FLAGS
from envhub.gateway.cli import gateway
from envhub.gateway.config import GatewayConfig
from envhub.sdk.config_cli import config_command


class Demo(BaseModel):
    port: int = Field(8400, ge=0, le=65535, description="port; 0 picks a free one")
    name: str | None = Field(None, description="a name")
    upstreams: list[str] = Field(default_factory=list, description="engine URLs")
    fast: bool = Field(True, description="go fast")
    mode: Literal["a", "b"] = Field("a", description="which mode")


def app_for(seen: list[Demo]) -> typer.Typer:
    app = typer.Typer()

    def run(config: Demo) -> None:
        """Run the demo."""
        seen.append(config)

    app.command("demo")(config_command(Demo, run, flags={"upstreams": "--upstream"},
                                       envvars={"name": "DEMO_NAME"}))
    app.command("other")(lambda: None)  # two commands: `demo` is addressed by name
    return app


def test_fields_become_options_with_defaults_aliases_and_env() -> None:
    seen: list[Demo] = []
    r = CliRunner().invoke(app_for(seen), ["demo", "--port", "9", "--upstream", "http://a",
                                           "--upstream", "http://b", "--no-fast", "--mode", "b"],
                           env={"DEMO_NAME": "from-env"})
    assert r.exit_code == 0, r.output
    assert seen == [Demo(port=9, name="from-env", upstreams=["http://a", "http://b"],
                         fast=False, mode="b")]
    r = CliRunner().invoke(app_for(seen), ["demo"])
    assert r.exit_code == 0 and seen[-1] == Demo()


def test_help_is_the_field_description_and_the_run_docstring() -> None:
    r = CliRunner().invoke(app_for([]), ["demo", "--help"], env={"COLUMNS": "200"})
    assert "Run the demo." in r.output and "port; 0 picks a free one" in r.output
    assert "one of: a, b" in r.output


def test_invalid_values_exit_2_with_pydantic_message() -> None:
    seen: list[Demo] = []
    r = CliRunner().invoke(app_for(seen), ["demo", "--port", "70000"])
    assert r.exit_code == 2 and "less than or equal to 65535" in r.output and not seen
    r = CliRunner().invoke(app_for(seen), ["demo", "--mode", "c"])
    assert r.exit_code == 2 and "mode" in r.output and not seen


class Loop(BaseModel):
    envs: list[str] = Field(default_factory=lambda: ["arith"], description="environments")
    tau: int | None = Field(2, ge=0, description="staleness bound")
    reset: bool | None = Field(None, description="tri-state")
    agent: str = Field("tool", description="the agent")


def loop_app(seen: list[Loop]) -> typer.Typer:
    app = typer.Typer()
    app.command("loop")(config_command(Loop, seen.append, arguments=("envs",),
                                       flags={"agent": ("--agent", "-a")}))
    app.command("other")(lambda: None)
    return app


def test_arguments_short_flags_none_and_tri_state_booleans() -> None:
    seen: list[Loop] = []
    r = CliRunner().invoke(loop_app(seen), ["loop", "a", "b", "--tau", "none", "-a", "x",
                                            "--no-reset"])
    assert r.exit_code == 0, r.output
    assert seen == [Loop(envs=["a", "b"], tau=None, reset=False, agent="x")]
    r = CliRunner().invoke(loop_app(seen), ["loop", "--tau", "3", "--reset"])
    assert r.exit_code == 0, r.output
    assert seen[-1] == Loop(tau=3, reset=True)  # no argument: the field's default
    r = CliRunner().invoke(loop_app(seen), ["loop"])
    assert seen[-1] == Loop() and seen[-1].reset is None


def test_an_invalid_value_names_the_flag_the_user_typed() -> None:
    seen: list[Loop] = []
    r = CliRunner().invoke(loop_app(seen), ["loop", "--tau", "-1"])
    assert r.exit_code == 2 and "error: --tau: Input should be greater than or equal to 0" \
        in r.output and not seen, r.output
    r = CliRunner().invoke(loop_app(seen), ["loop", "--tau", "many"])
    assert r.exit_code == 2 and "--tau: " in r.output and not seen, r.output


def test_every_gateway_config_field_has_a_flag() -> None:
    app = typer.Typer()
    app.command("gateway")(gateway)
    app.command("other")(lambda: None)
    command = typer.main.get_command(app).commands["gateway"]  # type: ignore[attr-defined]
    flags = {opt for p in command.params for opt in p.opts}
    for name in GatewayConfig.model_fields:
        assert GATEWAY_FLAGS.get(name, "--" + name.replace("_", "-")) in flags, name


def test_a_config_file_gives_the_fields_and_flags_typed_override_it(tmp_path) -> None:
    seen: list[Loop] = []
    app = typer.Typer()
    app.command("loop")(config_command(Loop, seen.append, arguments=("envs",),
                                       flags={"agent": ("--agent", "-a")},
                                       config_file="--config"))
    app.command("other")(lambda: None)
    cfg = tmp_path / "loop.toml"
    cfg.write_text('envs = ["x", "y"]\ntau = "none"\nreset = true\nagent = "from-file"\n')
    r = CliRunner().invoke(app, ["loop", "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    assert seen[-1] == Loop(envs=["x", "y"], tau=None, reset=True, agent="from-file")
    r = CliRunner().invoke(app, ["loop", "z", "--config", str(cfg), "-a", "typed", "--tau", "2"])
    assert r.exit_code == 0, r.output
    assert seen[-1] == Loop(envs=["z"], tau=2, reset=True, agent="typed")
    cfg.write_text("no-such = 1\n")
    r = CliRunner().invoke(app, ["loop", "--config", str(cfg)])
    assert r.exit_code == 2 and "unknown key 'no-such'" in r.output
    cfg.write_text("tau = [\n")
    r = CliRunner().invoke(app, ["loop", "--config", str(cfg)])
    assert r.exit_code == 2 and "--config" in r.output and len(seen) == 2

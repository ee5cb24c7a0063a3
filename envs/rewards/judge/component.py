"""The `judge` reward component: a model grades each sample's declared output with a rubric."""

from __future__ import annotations

from pathlib import Path

from envhub.envs.errors import EnvLoadError
from envhub.envs.manifest import JudgeSpec
from envhub.envs.rewards.base import SampleScore
from envhub.envs.rewards.judge import prompt
from envhub.envs.rewards.judge.cache import cache_key
from envhub.envs.rewards.judge.calls import JudgeCalls
from envhub.sdk.types import RewardEvent

MAX_RUBRIC_BYTES = 64_000


class Judge:
    """A RewardComponent (and UsesGateway). One event per sample, kind `custom`, name `judge`,
    value in [0, 1]; info holds the criteria's scores, the reason and whether it was cached.
    A sample without output (nothing submitted) scores 0 without asking; a verdict the judge
    model could not form (not JSON of the schema: what an injection may cause) scores 0 with
    `info.judge_error`; an endpoint or budget failure raises JudgeError (env_failure)."""

    def __init__(self, spec: JudgeSpec, rubric: str, name: str = "judge") -> None:
        self.spec, self.rubric, self.name = spec, rubric, name
        self.calls = JudgeCalls(spec, name)

    @classmethod
    def from_package(cls, spec: JudgeSpec, folder: Path, name: str) -> Judge:
        """With `rubric_file` read from the package folder (EnvLoadError naming the field)."""
        if spec.rubric is not None:
            return cls(spec, spec.rubric, name)
        assert spec.rubric_file is not None
        path = (folder / spec.rubric_file).resolve()
        if not path.is_relative_to(folder.resolve()) or not path.is_file():
            raise EnvLoadError(f"{folder}/envhub.toml: field 'rewards.{name}.rubric_file': "
                               f"{spec.rubric_file} is not a file of the package")
        if path.stat().st_size > MAX_RUBRIC_BYTES:
            raise EnvLoadError(f"{folder}/envhub.toml: field 'rewards.{name}.rubric_file': "
                               f"over {MAX_RUBRIC_BYTES} bytes; shorten the rubric")
        return cls(spec, path.read_text(encoding="utf-8"), name)

    def use_gateway(self, url: str, admin_key: str | None) -> None:
        self.calls.use_gateway(url, admin_key)

    def score(self, group: list[SampleScore], weights: dict[str, float]
              ) -> list[list[RewardEvent]]:
        judged = [i for i, s in enumerate(group) if s.output]
        infos: dict[int, dict] = {}
        if self.spec.mode == "group" and len(judged) > 1:
            infos.update(zip(judged, self._judge([group[i] for i in judged]), strict=True))
        else:
            for i in judged:
                (infos[i],) = self._judge([group[i]])
        events = []
        for i in range(len(group)):
            info = infos.get(i, {"value": 0.0, "judge_error": "no output to judge"})
            events.append([RewardEvent(kind="custom", name="judge", value=info.pop("value"),
                                       info=info)])
        return events

    def _judge(self, samples: list[SampleScore]) -> list[dict]:
        """Info (with `value`) per sample, from one request showing them all."""
        first = samples[0]  # a group shares its task
        reference = None
        if self.spec.reference_field is not None:
            reference = str(first.task_data.get(self.spec.reference_field, ""))
        shown = [prompt.show(s.output or "", self.spec.max_output_chars) for s in samples]
        n = None if len(samples) == 1 else len(samples)
        key = cache_key({"v": 1, **self.calls.endpoint_id(), "rubric": self.rubric,
                         "spec": self.spec.model_dump(include={"criteria", "scale",
                                                               "reason_chars", "temperature"}),
                         "task": first.instruction, "reference": reference,
                         "outputs": [s.text for s in shown]})
        messages = prompt.messages(self.spec, self.rubric, first.instruction, reference, shown)
        try:
            content, cached = self.calls.ask(
                key, messages, prompt.verdict_schema(self.spec, n),
                self.spec.max_tokens * len(samples),
                lambda text: prompt.parse_verdict(text, self.spec, n))
            scores, reason = prompt.parse_verdict(content, self.spec, n)
        except prompt.BadVerdict as e:
            return [{"value": 0.0, "judge_error": f"no verdict: {e}"[:500]} for _ in samples]
        return [{"value": prompt.value_of(s, self.spec), "scores": s, "reason": reason,
                 "cached": cached, "truncated": v.truncated}
                for s, v in zip(scores, shown, strict=True)]

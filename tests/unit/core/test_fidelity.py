"""Output fidelity (issue 23): the statistic and verdict (core/fidelity.py), SGLang's answers
read (engine/api.py), and what the lifecycle does with a mismatch (never READY, next profile)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sglang_supervisor.core import fidelity as F
from sglang_supervisor.core.actions import Action, Launch, MarkBad, NotifyReady, StopEngine
from sglang_supervisor.core.events import CaptureBegan, CaptureEnded, FailureClass, HttpUp, ServerReady
from sglang_supervisor.core.inputs import EngineExited, FidelityFailed, Launched, ProbeOk, Settings, Start
from sglang_supervisor.core.lifecycle import Lifecycle
from sglang_supervisor.core.reasons import StopReason
from sglang_supervisor.engine.api import parse_generated, parse_input_logprobs

TOL = F.Tolerance(prefix_tokens=4, max_logprob_diff=0.25, accept_collapse_ratio=0.5)


def sample(ids: list[list[int]], lps: list[float | None], accept: float | None = None) -> F.Sample:
    prompts = tuple(F.PromptSample(f"p{i}", tuple(x), " ".join(map(str, x))) for i, x in enumerate(ids))
    return F.Sample(prompts, tuple(range(len(lps))), tuple(lps), accept)


REF = sample([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]], [None, -1.0, -2.0, -0.5])


@pytest.mark.parametrize(("case", "got", "ok", "reason"), [
    ("identical", REF, True, "ok"),
    ("late divergence (after K) passes",
     sample([[1, 2, 3, 4, 0, 0], [7, 8, 9, 10, 11, 0]], [None, -1.0, -2.0, -0.5]), True, "ok"),
    ("rounding noise in the log-probs passes",
     sample([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]], [None, -1.01, -1.98, -0.5]), True, "ok"),
    ("an early divergence fails", sample([[1, 2, 0, 4, 5, 6], [7, 8, 9, 10, 11, 12]],
                                         [None, -1.0, -2.0, -0.5]), False, "prefix"),
    ("far log-probs fail", sample([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]],
                                  [None, -3.0, -4.0, -2.5]), False, "logprob"),
])
def test_verdicts(case: str, got: F.Sample, ok: bool, reason: str) -> None:
    v = F.judge(REF, got, TOL)
    assert (v.ok, v.reason) == (ok, reason), v.detail


def test_a_prefix_mismatch_names_the_prompt_and_both_texts_bounded_and_redacted() -> None:
    secret = "sk-0123456789abcdef"
    ref = F.Sample((F.PromptSample("p0", (1, 2, 3, 4), "fine " * 100),), (0,), (None,))
    got = F.Sample((F.PromptSample("p0", (9, 9, 9, 9), f"bad {secret}\x1b[31m"),), (0,), (None,))
    v = F.judge(ref, got, TOL, secrets=[secret])
    assert not v.ok and v.prompt == "p0"
    assert v.expected is not None and len(v.expected) <= F.MAX_TEXT_SHOWN + 1
    assert v.received is not None and secret not in v.received and "\x1b" not in v.received
    assert v.stats["prefix_agreement"] == [0]


def test_another_tokenizer_is_named() -> None:
    got = F.Sample(REF.prompts, (5, 6, 7, 8), REF.ref_logprobs)
    assert F.judge(REF, got, TOL).reason == "tokens"


@pytest.mark.parametrize(("baseline", "now", "collapsed"), [
    (3.2, 1.05, True),  # the draft path accepts nothing any more
    (3.2, 2.9, False),  # ordinary variation
    (None, 1.0, False),  # never measured on these weights: no absolute rule
    (1.0, 1.0, False),  # the baseline itself gained nothing
])
def test_accept_collapse_is_relative_to_the_same_weights(baseline: float | None, now: float,
                                                         collapsed: bool) -> None:
    assert F.accept_collapsed(baseline, now, 0.5) is collapsed
    got = F.Sample(REF.prompts, REF.ref_ids, REF.ref_logprobs, now)
    assert (F.judge(REF, got, TOL, baseline_accept=baseline).reason == "accept_collapse") is collapsed


def test_reference_round_trips_and_refuses_hostile_content() -> None:
    assert F.sample_from_json(F.sample_to_json(REF)) == REF
    for bad in ([], {"prompts": "x"}, {"prompts": [], "ref_ids": [-1], "ref_logprobs": []},
                {"prompts": [], "ref_ids": [], "ref_logprobs": [math.inf]},
                {"prompts": [{"prompt": "p", "output_ids": [True], "text": ""}], "ref_ids": [],
                 "ref_logprobs": []}):
        with pytest.raises(F.SampleFormatError):
            F.sample_from_json(bad)


def test_reference_key_is_model_tokenizer_and_dtype_not_the_weights() -> None:
    files = {"config.json": b"{}", "tokenizer.json": b"{'a': 1}"}
    key = F.reference_key("/m", files, "auto")
    assert key == F.reference_key("/m", dict(files), "auto")
    assert key != F.reference_key("/m", {**files, "tokenizer.json": b"other"}, "auto")
    assert key != F.reference_key("/m", files, "float16")
    assert F.reference_profile(("a", "b", "c"), None) == "c"
    assert F.reference_profile(("a", "b", "c"), "b") == "b"


def test_the_periodic_cost_stays_under_a_thousandth_of_the_seed_speed() -> None:
    # 0.1 % of a GPU at the seed's ~70 tok/s is 252 tokens an hour.
    assert F.tokens_per_hour(3600.0) < 0.001 * 70 * 3600


def test_sglang_answers_are_read_as_documented_and_bounded() -> None:
    gen = parse_generated({"text": "hi", "output_ids": [1, 2], "meta_info": {"spec_accept_length": 2.5}})
    assert gen is not None and gen.output_ids == (1, 2) and gen.spec_accept_length == 2.5
    assert parse_generated({"text": "hi", "output_ids": ["x"]}) is None
    assert parse_generated({"error": "boom"}) is None
    body = {"meta_info": {"input_token_logprobs": [[None, 5, None], [-1.5, 6, None]]}}
    assert parse_input_logprobs(body) == ((5, 6), (None, -1.5))
    assert parse_input_logprobs({"meta_info": {"input_token_logprobs": [["nan", 5, None]]}}) is None
    assert parse_input_logprobs({"meta_info": {}}) is None


# -- the lifecycle -----------------------------------------------------------------------------

def of(actions: list[Action], kind: type) -> list:
    return [a for a in actions if isinstance(a, kind)]


class Driver:
    """Feeds inputs with a fake clock and remembers every action."""

    def __init__(self) -> None:
        self.lc = Lifecycle(Settings(profiles=("primary", "no-prefill-graph", "eager")))
        self.now = 0.0
        self.log: list[Action] = []

    def feed(self, *inputs: object) -> list[Action]:
        out: list[Action] = []
        for inp in inputs:
            self.now += 1.0
            out += self.lc.handle(inp, self.now)  # type: ignore[arg-type]
        self.log += out
        return out

    def exit_engine(self, rc: int, we_stopped: bool) -> list[Action]:
        return self.feed(EngineExited(self.lc.attempt, rc, we_stopped))


def at_ready_gate(d: Driver) -> None:
    launch = of(d.feed(Start()), Launch)[-1]
    d.feed(Launched(launch.attempt, 100, frozenset({("target", "decode", None)})))
    d.feed(CaptureBegan(2, None, "target", "decode", "full"),
           CaptureEnded(3, None, "target", "decode", 1.0, 0.5))
    d.feed(HttpUp(4, None, "127.0.0.1", 30000), ServerReady(5, None))


def test_a_mismatch_at_the_ready_gate_never_sends_ready_and_the_ladder_moves_on() -> None:
    d = Driver()
    at_ready_gate(d)
    acts = d.feed(FidelityFailed("prefix", "diverged at token 0", "p0", "expected", "received"))
    assert [a.reason for a in of(acts, StopEngine)] == [StopReason.OUTPUT_MISMATCH]
    assert not of(acts, NotifyReady)
    acts = d.exit_engine(-15, we_stopped=True)
    assert [m.failure_class for m in of(acts, MarkBad)] == [FailureClass.OUTPUT_MISMATCH.value]
    assert [launch.profile for launch in of(acts, Launch)] == ["no-prefill-graph"]
    assert not of(d.log, NotifyReady)


def test_a_mismatch_while_serving_moves_on_without_retrying_the_same_command() -> None:
    d = Driver()
    at_ready_gate(d)
    d.feed(ProbeOk(50.0))
    assert of(d.log, NotifyReady)
    acts = d.feed(FidelityFailed("logprob", "far", at_ready=False))
    assert of(acts, StopEngine)
    acts = d.exit_engine(-15, we_stopped=True)
    assert [launch.profile for launch in of(acts, Launch)] == ["no-prefill-graph"]


def test_a_mismatch_after_the_attempt_ended_is_dropped() -> None:
    d = Driver()
    at_ready_gate(d)
    d.feed(FidelityFailed("prefix", "x"))
    assert d.feed(FidelityFailed("prefix", "x again")) == []  # the stop is under way


def test_the_stored_reference_is_untrusted_on_the_way_back(tmp_path: Path) -> None:
    from sglang_supervisor.shell.checks.fidelity import Reference, ReferenceStore

    store = ReferenceStore(tmp_path)
    ref = Reference(key="k1", sample=REF, profile="eager", version="0.5.17", command_hash="abc",
                    model="/m", dtype="auto", taken_at=1.0, accept={})
    store.save(ref)
    assert store.load("k1") == ref
    assert store.with_accept(ref, "spec", 3.1).accept == {"spec": 3.1}
    again = store.load("k1")
    assert again is not None and again.accept == {"spec": 3.1}
    for text in ("not json", '{"probe_set": "old"}', "[" * 100000, '{"probe_set": "f1", "sample": {}}'):
        store.path("k1").write_text(text)
        assert store.load("k1") is None  # absent: the next reference-profile READY takes a new one
    store.path("k1").write_bytes(b"x" * (2 << 20))
    assert store.load("k1") is None
    assert store.reset("k1") and not store.reset("k1")

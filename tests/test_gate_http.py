"""The HTTP gate (`timbench gate run --engine openai=URL --trainer hf=DIR`) against a small in-process fake OpenAI
server backed by timbench's exact engine: a clean server passes, each fault of the HTTP fault proxy fails the gate
naming its probe, a clean proxy rerun raises no false alarm, and every bad input is one line, exit 2."""

from __future__ import annotations

import json
import socket

import pytest
import torch

from timbench.cli import main
from timbench.gate.fake_server import FakeServer
from timbench.gate.fault_proxy import EXPECTED_PROBE, SYNC_FAULTS, FaultProxy
from timbench.gate.http_client import is_loopback, parse_openai_spec
from timbench.gate.http_probes import bf16_exact
from timbench.util.shipped import default_checkpoint

CKPT = default_checkpoint("add-4d-v1", "tiny-dense")
SUITE = """name: http-tiny
version: 1
models: [tiny-dense]
seed: 0
temperature: 0.8
probes:
  determinism: {requests: 3, max_new_tokens: 4}
  batch_invariance: {prompt_lengths: [1, 17], batch_sizes: [3], max_new_tokens: 4}
  prefill_vs_decode: {requests: 3, max_new_tokens: 4}
  alignment: {batches: [1, 3], max_mean_abs_diff: 0.1}
  weight_sync: {updates: 1, requests: 3, max_new_tokens: 4}
  sampling_semantics: {prompts: 2, samples: 300, alpha: 1.0e-3}
"""

FAST = (
    SUITE.split("probes:")[0].replace("http-tiny", "http-fast")
    + "probes:\n  determinism: {requests: 3, max_new_tokens: 4}\n"
    + "  alignment: {batches: [1, 3], max_mean_abs_diff: 0.1}\n"
)
"""The fault, check and key tests' suite: the faults are named by logprob_semantics, which every HTTP run adds."""


@pytest.fixture(scope="module")
def server():
    with FakeServer(CKPT) as s:
        yield s


@pytest.fixture(scope="module")
def stale():
    """A server holding other weights with the same tokenizer (the shipped small dense checkpoint)."""
    with FakeServer(default_checkpoint("add-4d-v1", "small-dense")) as s:
        yield s


@pytest.fixture
def suite(tmp_path):
    (tmp_path / "http-fast.yaml").write_text(FAST)
    return str(tmp_path / "http-fast.yaml")


@pytest.fixture
def full_suite(tmp_path):
    (tmp_path / "http-tiny.yaml").write_text(SUITE)
    return str(tmp_path / "http-tiny.yaml")


def gate(url, suite, out, *extra, trainer=f"hf={CKPT}"):
    return main(
        [
            "gate",
            "run",
            "--engine",
            f"openai={url}" + "".join(extra),
            "--trainer",
            trainer,
            "--suite",
            suite,
            "--out",
            str(out),
        ]
    )


def rows(out) -> dict:
    return {r["probe"]: r for r in json.loads((out / "gate.json").read_text())["probes"]}


def test_clean_server_passes_and_records_what_was_tested(server, full_suite, tmp_path, capsys):
    assert gate(server.url, full_suite, tmp_path / "a") == 0
    err = capsys.readouterr().err
    assert "server: timbench-fake fake-0; model fake-model" in err and "prompt logprobs prompt_logprobs" in err
    assert "tokenizer agreement: vocabulary 99 on both sides; 96 token ids detokenize alike" in err
    got = rows(tmp_path / "a")
    assert got["weight_sync"]["not_tested"] and not got["weight_sync"]["passed"]  # not tested is never passed
    assert "the server lists no routes (/openapi.json)" in got["weight_sync"]["not_tested"]
    assert "give the engine spec sync_dir=DIR" in got["weight_sync"]["not_tested"]
    for probe in ("determinism", "batch_invariance", "prefill_vs_decode"):
        assert got[probe]["passed"] and got[probe]["numbers"]["max_abs_diff"] == 0.0
    a = got["alignment"]["numbers"]
    assert a["mean_abs_diff"] < 1e-4 and a["argmax_flips"] == 0 and a["argmax_checked"] == a["tokens"]
    sem = got["logprob_semantics"]
    assert sem["passed"] and sem["numbers"]["fits"] == "processed" and sem["numbers"]["frac_bf16_exact"] < 0.2
    ident = json.loads((tmp_path / "a" / "gate.json").read_text())["identity"]
    assert (ident["engine_package"], ident["engine_version"], ident["served_model"]) == (
        "timbench-fake",
        "fake-0",
        "fake-model",
    )
    assert ident["checkpoint"] == CKPT.name and len(ident["checkpoint_hash"]) == 16 and ident["transformers"]
    assert "not tested" in (tmp_path / "a" / "gate.md").read_text()
    # An exact server's mismatch lies below every committed setting: placed nowhere, saying why (gate.placement).
    (place,) = json.loads((tmp_path / "a" / "gate.json").read_text())["placement"]
    assert place["model"] == CKPT.name and not place["placed"] and "outside the committed" in place["lines"][0]
    assert "## Where this mismatch sits" in (tmp_path / "a" / "gate.md").read_text()
    assert "logprob_semantics" in (tmp_path / "a" / "gate.html").read_text()


@pytest.mark.parametrize("fault", sorted(set(EXPECTED_PROBE) - set(SYNC_FAULTS)))  # sync faults: the vLLM test
def test_each_proxy_fault_fails_the_gate_naming_its_probe(server, suite, tmp_path, capsys, fault, request):
    kw = {"stale": request.getfixturevalue("stale").url} if fault == "stale_checkpoint" else {}
    with FaultProxy(server.url, fault, **kw) as proxy:
        assert gate(proxy.url, suite, tmp_path / fault) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "FAIL: " in last and f"add-4d-v1-tiny-dense {EXPECTED_PROBE[fault]}" in last.split("FAIL: ")[1]
    got = rows(tmp_path / fault)
    sem = got["logprob_semantics"]
    assert not sem["passed"]
    want = {
        "zero_logprobs": "zero",
        "shifted_logprobs": "shift_next",
        "temperature_twice": "temperature_twice",
        "bf16_logprobs": "processed",
        "raw_logprobs": "raw",
        "stale_checkpoint": "none",
        "bos_twice": "none",
    }[fault]
    assert sem["numbers"]["fits"] == want
    if fault == "bf16_logprobs":
        assert sem["numbers"]["frac_bf16_exact"] == 1.0 and "rounded to bf16" in sem["note"]
    if want == "none":  # no hypothesis explains another model's (or another prompt's) distribution
        assert "fit none of the hypotheses" in sem["note"] and got["alignment"]["numbers"]["mean_abs_diff"] > 0.5
    # The server counts the prompt it saw: one more token than was sent when a BOS is added on the way.
    assert ("prompts_miscounted" in got["alignment"]["numbers"]) == (fault == "bos_twice")
    if fault == "bos_twice":
        assert "counted 3 prompt tokens for 2 sent" in got["alignment"]["note"]
        assert got["determinism"]["passed"]  # the server is consistent with itself: only the trainer sees it


def test_stale_fault_needs_a_stale_server(server):
    with pytest.raises(ValueError, match="stale=URL"):
        FaultProxy(server.url, "stale_checkpoint")
    with pytest.raises(ValueError, match=r"unknown HTTP fault 'nope'; did you mean 'none'\? valid: none, "):
        FaultProxy(server.url, "nope")


def test_clean_proxy_reruns_raise_no_false_alarm(server, full_suite, tmp_path, capsys):
    text = open(full_suite).read()
    alarms = 0
    with FaultProxy(server.url, "none") as proxy:
        for seed in (1, 2):  # the clean path through the proxy, with other seeds (statistical probes resample)
            (tmp_path / f"s{seed}.yaml").write_text(text.replace("seed: 0", f"seed: {seed}"))
            alarms += gate(proxy.url, str(tmp_path / f"s{seed}.yaml"), tmp_path / f"clean{seed}") != 0
    assert alarms == 0


def test_a_server_returning_raw_logprobs_is_named(suite, tmp_path):
    with FakeServer(CKPT, logprobs_mode="raw") as raw:  # vLLM's default logprobs_mode, raw_logprobs
        assert gate(raw.url, suite, tmp_path / "raw") == 1
    assert rows(tmp_path / "raw")["logprob_semantics"]["numbers"]["fits"] == "raw"


def test_truncated_support_is_named_renormalised_or_full(server, suite, tmp_path):
    """With top_p < 1 the probe names whether the logprobs are renormalised over the kept nucleus (the distribution
    sampled from) or of the full distribution, and reports the kept mass a mismatched trainer's ratio drops to;
    both conventions pass (a trainer can match either), a server fitting neither fails."""
    assert gate(server.url, suite, tmp_path / "renorm") == 0
    with FakeServer(CKPT, top_p_logprobs="full") as full:
        assert gate(full.url, suite, tmp_path / "full") == 0
    a, b = rows(tmp_path / "renorm")["logprob_semantics"], rows(tmp_path / "full")["logprob_semantics"]
    assert a["numbers"]["top_p_fits"] == "renormalised" and b["numbers"]["top_p_fits"] == "full"
    for r, fit, other in ((a, "renormalised", "full"), (b, "full", "renormalised")):
        n = r["numbers"]
        assert n[f"mean_abs_diff_top_p_{fit}"] < 1e-5 < 1e-2 < n[f"mean_abs_diff_top_p_{other}"]
        assert 0.5 < n["mean_kept_mass"] < 1 and n["top_p_outside_nucleus"] == 0 and n["top_p"] == 0.8
    assert f"ratio drop to ~{a['numbers']['mean_kept_mass']:.3f}" in a["note"]
    assert "of the full distribution (not renormalised)" in b["note"]


def test_top_p_keep_is_the_samplers_nucleus():
    from timbench.engine import SamplingParams
    from timbench.engine.sampler import sampling_support
    from timbench.gate.http_probes import top_p_keep
    from timbench.kernels import get_kernels

    lp = torch.log_softmax(torch.randn(64, 99, generator=torch.Generator().manual_seed(0)) * 3, -1)
    for top_p in (0.5, 0.8, 0.95):
        want = sampling_support(lp, SamplingParams(top_p=top_p), get_kernels("exact"))
        assert torch.equal(top_p_keep(lp, top_p), want)


def test_weight_sync_names_the_weight_load_routes_the_server_lists():
    from timbench.gate.http_client import Client
    from timbench.gate.http_engine import discover, weight_sync_reason

    for routes, want, says in [
        (
            ("/v1/completions", "/sleep", "/collective_rpc"),
            ["/collective_rpc", "/sleep"],
            "the server lists /collective_rpc, /sleep",
        ),
        (("/v1/completions",), [], "lists none of /collective_rpc, /update_weights"),
        (None, None, "lists no routes"),
    ]:
        with FakeServer(CKPT, routes=routes) as s:
            offer = discover(Client(parse_openai_spec(f"openai={s.url}")))
        assert offer.weight_routes == want
        reason = weight_sync_reason(offer)
        assert reason.startswith("weight sync changes the weights a running server serves") and says in reason


SYNC_SUITE = FAST.split("probes:")[0].replace("http-fast", "http-sync") + (
    "probes:\n  weight_sync: {updates: 2, requests: 2, max_new_tokens: 4}\n"
)
SYNC_ROUTES = ("/v1/completions", "/collective_rpc", "/reset_prefix_cache")


def _tree(d):
    return {p.relative_to(d): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("reload,rc,fits", [("loads", 0, "synced"), ("ignored", 1, "not_synced")])
def test_weight_sync_over_http_reloads_perturbed_weights_and_restores(tmp_path, capsys, reload, rc, fits):
    """sync_dir=DIR: the server reloads a perturbed copy of DIR's weights and must then match the HF trainer on
    them; a server whose reload loads nothing fails, named. DIR's files are never written, and the server is back
    on them afterwards."""
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(CKPT, ckpt)
    before = _tree(ckpt)
    (tmp_path / "s.yaml").write_text(SYNC_SUITE)
    with FakeServer(ckpt, routes=SYNC_ROUTES, reload=reload) as s:
        got = gate(s.url, str(tmp_path / "s.yaml"), tmp_path / "out", f",sync_dir={ckpt}", trainer=f"hf={ckpt}")
    assert got == rc
    ws = rows(tmp_path / "out")["weight_sync"]
    n = ws["numbers"]
    assert ws["passed"] == (rc == 0) and not ws["not_tested"] and n["fits"] == fits and n["updates"] == 2
    # every hypothesis is tested (the tied LM head's too: the shipped checkpoints tie it) and told apart
    mad = {
        k: n["mean_abs_diff" + ("" if k == "synced" else f"_{k}")] for k in ("synced", "not_synced", "stale_lm_head")
    }
    assert all(v > 100 * mad[fits] for k, v in mad.items() if k != fits)
    if reload == "loads":
        assert n["mean_abs_diff"] < 1e-4 and n["mean_abs_diff_not_synced"] > 1e-2
    else:
        assert "the old weights (the sync did not reach the server)" in ws["note"]
    assert n["mean_abs_diff_restored"] == n["mean_abs_diff_before"]  # reloaded from DIR: the same logprobs
    assert _tree(ckpt) == before  # nothing written into DIR's files, the scratch copy removed


def test_weight_sync_without_the_routes_is_not_tested(tmp_path):
    (tmp_path / "s.yaml").write_text(SYNC_SUITE)
    with FakeServer(CKPT, routes=("/v1/completions",)) as s:
        assert gate(s.url, str(tmp_path / "s.yaml"), tmp_path / "out", f",sync_dir={CKPT}") == 0
    why = rows(tmp_path / "out")["weight_sync"]["not_tested"]
    assert "sync_dir is given, but the server lists no /collective_rpc, /reset_prefix_cache" in why


def test_prompt_scoring_through_echo_or_missing(tmp_path, capsys):
    """Teacher forcing through `echo` works as through prompt_logprobs; a server with neither leaves prefill vs
    decode not tested (counted, never passed) while the rest of the gate passes."""
    (tmp_path / "s.yaml").write_text(
        FAST.replace("probes:\n", "probes:\n  prefill_vs_decode: {requests: 3, max_new_tokens: 4}\n")
    )
    for mode in ("echo", "none"):
        with FakeServer(CKPT, prompt_scoring=mode) as s:
            assert gate(s.url, str(tmp_path / "s.yaml"), tmp_path / mode) == 0
        pvd = rows(tmp_path / mode)["prefill_vs_decode"]
        if mode == "echo":
            assert pvd["passed"] and pvd["numbers"]["max_abs_diff"] == 0.0 and pvd["numbers"]["tokens"] > 0
        else:
            assert not pvd["passed"] and "neither prompt_logprobs nor echo" in pvd["not_tested"]
    out = capsys.readouterr()
    assert "prompt logprobs echo" in out.err and "not tested: prefill_vs_decode" in out.out


def test_a_server_that_speaks_only_text_is_gated_through_the_trainers_tokenizer(tmp_path, capsys):
    """A server that refuses token-id prompts (422) and returns tokens as text (llama-cpp-python's server, the
    OpenAI API's shapes): prompts go as their text, each returned token's text names its id (the character
    vocabulary's texts are unique), and the gate measures what it measures on token ids, echo scoring included."""
    (tmp_path / "s.yaml").write_text(
        FAST.replace("probes:\n", "probes:\n  prefill_vs_decode: {requests: 3, max_new_tokens: 4}\n")
    )
    with FakeServer(CKPT, text_only=True, prompt_scoring="echo") as s:
        assert gate(s.url, str(tmp_path / "s.yaml"), tmp_path / "text") == 0
    err = capsys.readouterr().err
    assert "text: prompts as text (token-id prompts refused); tokens as text, each naming one id" in err
    got = rows(tmp_path / "text")
    assert got["determinism"]["passed"] and got["prefill_vs_decode"]["numbers"]["max_abs_diff"] == 0.0
    assert got["alignment"]["numbers"]["mean_abs_diff"] < 1e-4 and got["alignment"]["numbers"]["tokens"] > 0
    assert got["logprob_semantics"]["numbers"]["fits"] == "processed"
    offers = json.loads((tmp_path / "text" / "gate.json").read_text())["identity"]["offers"]
    assert offers["prompt_text"] and offers["token_text"] and not offers["token_ids"]


def test_text_prompts_and_tokens_are_exact_or_refused():
    """A prompt goes as text only where the tokenizer gives its ids back; a token's text names an id only where no
    two ids share one; an echo answer is placed by its tokens, a leading token left out of the echo included."""
    from types import SimpleNamespace

    from timbench.gate.http_client import ServerError
    from timbench.gate.http_engine import HttpEngine, NotTested, Offer, TextVocab

    chars = ["<bos>", "a", "b", "ab"]  # "ab" is also the text of [1, 2]: that prompt does not survive the round trip
    vocab = TextVocab(
        lambda ids: "".join(chars[i] for i in ids),
        lambda t: [1, 2] if t == "ab" else [chars.index(c) for c in t],
        {c: i for i, c in enumerate(chars)},
    )
    assert vocab.text([2, 1]) == "ba" and vocab.ids(["ab", "a"]) == [3, 1]
    with pytest.raises(NotTested, match="does not turn the text"):
        vocab.text([3])
    with pytest.raises(ServerError, match="'c' that is no token"):
        vocab.ids(["c"])
    with pytest.raises(NotTested, match="share a text"):
        TextVocab(vocab.decode, vocab.encode, None).ids(["a"])
    offer = Offer("m", ["m"], token_text=True, vocab=vocab)
    engine = HttpEngine(SimpleNamespace(spec=SimpleNamespace(concurrency=1)), offer, 4, 16)
    assert engine._echo_start(["<bos>", "a", "b", "a"], [0, 1, 2]) == 0
    assert engine._echo_start(["a", "b", "a"], [0, 1, 2]) == -1  # the leading BOS left out (llama-cpp-python)
    with pytest.raises(ServerError, match="are not the prompt's"):
        engine._echo_start(["b", "a"], [0, 1, 2])


def test_gate_check_between_two_http_runs(server, suite, tmp_path, capsys):
    """A server upgrade checked by `gate check`: the runs' identities compare, and each changed probe is one line
    (a regression per probe that now fails, an improvement per probe that now passes, a change of what the
    logprobs fit even when both pass, a note when the two scored different checkpoints)."""
    assert gate(server.url, suite, tmp_path / "base") == 0
    with FaultProxy(server.url, "zero_logprobs") as proxy:
        assert gate(proxy.url, suite, tmp_path / "cand") == 1
    with FakeServer(CKPT, top_p_logprobs="full") as full:
        assert gate(full.url, suite, tmp_path / "full") == 0
    capsys.readouterr()
    base = json.loads((tmp_path / "base" / "gate.json").read_text())
    for k in ("engine_package", "engine_version", "served_model", "checkpoint_hash", "trainer_spec", "offers"):
        assert k in base["identity"]
    assert main(["gate", "check", str(tmp_path / "base"), str(tmp_path / "base")]) == 0
    assert capsys.readouterr().out == "gate check: no regression\n"
    assert main(["gate", "check", str(tmp_path / "base"), str(tmp_path / "cand")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" passed in")[0] for line in out] == [
        f"regression: {CKPT.name} alignment",
        f"regression: {CKPT.name} logprob_semantics",
    ]
    assert main(["gate", "check", str(tmp_path / "cand"), str(tmp_path / "base")]) == 0  # the fix, the other way
    assert capsys.readouterr().out.splitlines() == [
        f"improved: {CKPT.name} alignment failed in the baseline and passes now",
        f"improved: {CKPT.name} logprob_semantics failed in the baseline and passes now",
        "gate check: no regression",
    ]
    assert main(["gate", "check", str(tmp_path / "base"), str(tmp_path / "full")]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"regression: {CKPT.name} logprob_semantics top_p_fits renormalised -> full: the returned logprobs are of "
        "another distribution than the baseline's (rule: what the returned logprobs fit is the baseline's)"
    ]
    other = json.loads((tmp_path / "base" / "gate.json").read_text())
    other["identity"]["checkpoint_hash"] = "0" * 16
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "gate.json").write_text(json.dumps(other))
    assert main(["gate", "check", str(tmp_path / "base"), str(tmp_path / "other")]) == 0
    assert capsys.readouterr().out.startswith(f"context: the runs scored different checkpoints ({CKPT.name} ")


def test_api_key_is_sent_from_the_environment_and_never_written(suite, tmp_path, capsys, monkeypatch):
    key = "sk-test-0123456789"
    with FakeServer(CKPT, api_key=key) as s:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        assert gate(s.url, suite, tmp_path / "nokey") == 2
        assert "HTTP 401" in capsys.readouterr().err
        monkeypatch.setenv("MY_KEY", key)
        assert gate(s.url, suite, tmp_path / "key", ",api_key_env=MY_KEY") == 0
    captured = capsys.readouterr()
    assert key not in captured.out + captured.err
    assert key not in (tmp_path / "key" / "gate.json").read_text() + (tmp_path / "key" / "gate.md").read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "case,want",
    [
        ("unreachable", "unreachable"),
        ("no_logprobs", "returns no logprobs"),
        ("model", "does not serve model 'nope'"),
        ("tokenizer", "tokenizer disagreement: token id 10"),
        ("timeout", "timed out after 1 attempt"),
        ("remote", "10.1.2.3 is not a loopback address"),
        ("no_trainer", "go together"),
        ("bad_key", "is not one of the keys"),
        ("bad_trainer", "not a Hugging Face checkpoint directory"),
        ("bad_device", "trainer spec: device='tpu' is not valid; valid: cpu, cuda, cuda:N"),
        ("no_such_device", "trainer spec: device=cuda:"),
        ("sync_missing", "is not a directory; it is the checkpoint directory the server was started with"),
        ("sync_no_weights", "holds no *.safetensors weights"),
        ("sync_read_only", "is not writable"),
        ("sync_other_dir", "is not the directory the server serves"),
    ],
)
def test_bad_inputs_are_one_line_exit_2(suite, tmp_path, capsys, monkeypatch, case, want):
    def run(url, *extra, **kw):
        return gate(url, suite, tmp_path / case, *extra, **kw)

    if case == "unreachable":
        rc = run(f"http://127.0.0.1:{_free_port()}", ",retries=0")
    elif case == "remote":
        rc = run("http://10.1.2.3:8000")
    elif case == "no_trainer":
        rc = main(["gate", "run", "--engine", "openai=http://127.0.0.1:1", "--suite", suite, "--out", str(tmp_path)])
    elif case == "bad_key":
        rc = run("http://127.0.0.1:1", ",colour=red")
    elif case == "bad_trainer":
        rc = run("http://127.0.0.1:1", trainer=f"hf={tmp_path}")
    elif case == "bad_device":
        rc = run("http://127.0.0.1:1", trainer=f"hf={CKPT},device=tpu")
    elif case == "no_such_device":  # one past the CUDA devices this host has (none on a CPU host)
        rc = run("http://127.0.0.1:1", trainer=f"hf={CKPT},device=cuda:{torch.cuda.device_count()}")
    elif case == "sync_missing":
        rc = run("http://127.0.0.1:1", f",sync_dir={tmp_path / 'nope'}")
    elif case == "sync_no_weights":
        rc = run("http://127.0.0.1:1", f",sync_dir={tmp_path}")
    elif case == "sync_read_only":  # os.access refuses: root (CI's containers) may write anywhere
        monkeypatch.setattr("timbench.gate.http_client.os.access", lambda path, mode: False)
        rc = run("http://127.0.0.1:1", f",sync_dir={CKPT}")
    elif case == "sync_other_dir":
        import shutil

        other = shutil.copytree(CKPT, tmp_path / "other")
        with FakeServer(CKPT) as s:
            rc = run(s.url, f",sync_dir={other}")
    else:
        kw = {
            "no_logprobs": {"logprobs": False},
            "model": {},
            "tokenizer": {"swap_tokens": (10, 11)},
            "timeout": {"delay": 2.0},
        }[case]
        extra = {"model": ",model=nope", "timeout": ",timeout=0.5,retries=0"}.get(case, "")
        with FakeServer(CKPT, **kw) as s:
            rc = run(s.url, extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) >= 1 and want in err[-1] and err[-1].startswith("timbench gate: error: ")
    assert "Traceback" not in "\n".join(err)


def test_spec_and_loopback_rules():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("[::1]") and is_loopback("localhost")
    assert not is_loopback("10.0.0.1") and not is_loopback("example.com")
    s = parse_openai_spec("openai=http://127.0.0.1:8000/v1/,model=m,timeout=5,retries=1,concurrency=4")
    assert (s.url, s.model, s.timeout, s.retries, s.concurrency) == ("http://127.0.0.1:8000", "m", 5.0, 1, 4)
    assert parse_openai_spec("openai=https://gpu-box:8000", allow_remote=True).url == "https://gpu-box:8000"
    for bad, why in [
        ("openai=ftp://127.0.0.1", "http"),
        ("openai=http://u:p@127.0.0.1:1", "credentials"),
        ("openai=http://127.0.0.1:1,retries=-1", "retries >= 0"),
        ("openai=http://127.0.0.1:1,timeout=x", "not a float"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_openai_spec(bad)


def test_trainer_device_key_places_the_model_and_returns_host_float64_logits():
    from timbench.gate.hf_trainer import HfTrainer, parse_hf_spec

    cpu = parse_hf_spec(f"hf={CKPT},dtype=fp32")
    assert cpu.device == "cpu" and str(cpu) == f"hf={CKPT},dtype=fp32,attn=eager"  # a CPU spec reads as it did
    with pytest.raises(ValueError, match=r"device=cuda:\d+ but"):
        parse_hf_spec(f"hf={CKPT},device=cuda:{torch.cuda.device_count()}")
    seqs = [([1, 5, 6], [7, 8]), ([1, 9], [10, 11, 12])]
    ref = HfTrainer(cpu).logits(seqs)
    assert [tuple(z.shape) for z in ref] == [(2, 99), (3, 99)]
    assert all(z.device.type == "cpu" and z.dtype == torch.float64 for z in ref)
    if torch.cuda.is_available():  # the same checkpoint on the GPU: host float64 rows, close to the CPU's
        gpu = parse_hf_spec(f"hf={CKPT},device=cuda")
        assert str(gpu).endswith(",device=cuda")
        trainer = HfTrainer(gpu)
        assert next(trainer.model.parameters()).device.type == "cuda"
        for z, r in zip(trainer.logits(seqs), ref):
            assert z.device.type == "cpu" and z.dtype == torch.float64 and float((z - r).abs().max()) < 1e-2


def test_bf16_exactness_detects_rounded_logprobs():
    x = -torch.rand(1000, generator=torch.Generator().manual_seed(0)) * 5
    assert float(bf16_exact(x).double().mean()) < 0.01
    assert bool(bf16_exact(x.to(torch.bfloat16).float()).all())


def test_retries_are_bounded_and_only_for_server_errors():
    from http.server import BaseHTTPRequestHandler

    from timbench.gate.fake_server import LoopbackServer
    from timbench.gate.http_client import Client, ServerError

    seen = []

    class Flaky(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # /503: fails once then answers; /404: always refused
            seen.append(self.path)
            code = 404 if self.path == "/404" else 503 if seen.count(self.path) == 1 else 200
            raw = json.dumps({"ok": code == 200}).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    httpd = LoopbackServer(Flaky)
    import threading

    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"openai=http://127.0.0.1:{httpd.server_address[1]}"
        with pytest.raises(ServerError, match="HTTP 503 .* after 1 attempt"):
            Client(parse_openai_spec(url + ",retries=0")).get("/503a")
        assert Client(parse_openai_spec(url + ",retries=1")).get("/503b") == {"ok": True}
        with pytest.raises(ServerError, match="HTTP 404"):
            Client(parse_openai_spec(url + ",retries=3")).get("/404")
        assert seen.count("/503b") == 2 and seen.count("/404") == 1  # a 4xx is the server's answer: no retry
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_production_shape_is_written_as_a_hf_directory_with_a_tokenizer_over_its_vocabulary(tmp_path, monkeypatch):
    """shapes.save_hf: transformers loads the directory as it is, the model scores every id, and the tokenizer
    has one token per id (the characters as before, `<|tN|>` past them), so the gate's tokenizer check can cover
    the whole vocabulary a server samples from."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from timbench.gate import shapes
    from timbench.model import ModelConfig
    from timbench.tokenizer import CharTokenizer

    monkeypatch.setitem(shapes.SHAPES, "wide", ModelConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1))
    d = shapes.save_hf("wide", tmp_path / "wide")
    tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
    assert len(tok) == 300 and tok.decode([250]) == "<|t250|>" and tok.decode([299]) == "<|t299|>"
    text = "The gate scores 12+34=46."
    assert tok(text, add_special_tokens=False)["input_ids"] == CharTokenizer().encode(text)
    model = AutoModelForCausalLM.from_pretrained(d, local_files_only=True)
    assert model.config.vocab_size == 300 and model(input_ids=torch.tensor([[1, 299]])).logits.shape == (1, 2, 300)
    with pytest.raises(ValueError, match="unknown production shape 'nope'"):
        shapes.save_hf("nope", tmp_path / "nope")

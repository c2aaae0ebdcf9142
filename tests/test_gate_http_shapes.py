"""The HTTP gate's client on OpenAI-compatible answer shapes other than vLLM's, from canned answers (no server, no
model): a token-id prompt refused with an HTTP error (llama-cpp-python's schema refusal is a 500) falls back to
text, digits are a token's text and never an id, a response that stops at a token it does not list is empty (not
an error), and such draws count in the sampling test's pooled mass."""

from __future__ import annotations

import pytest

from timbench.engine import Request, SamplingParams
from timbench.gate.http_client import OpenAISpec, ServerError
from timbench.gate.http_engine import HttpEngine, TextVocab, _ids, discover
from timbench.gate.probes import frequency_test

pytestmark = pytest.mark.unit

CHARS = ["<pad>", "<bos>", "<eos>"] + [chr(c) for c in range(32, 127)]
VOCAB = TextVocab(
    lambda ids: "".join(CHARS[i] for i in ids),
    lambda text: [CHARS.index(c) for c in text],
    {c: i for i, c in enumerate(CHARS)},
)


class CannedClient:
    """A server as llama-cpp-python 0.3.16 answers: prompts only as text, tokens as text, no /version, /tokenize."""

    def __init__(self, answer_tokens=("7", "0"), finish="length"):
        self.spec = OpenAISpec("http://127.0.0.1:1", concurrency=2, retries=0)
        self.tokens, self.finish, self.bodies = list(answer_tokens), finish, []

    def get(self, path):
        if path == "/v1/models":
            return {"data": [{"id": "m.gguf", "owned_by": "me"}]}
        raise ServerError(f"GET {path}: HTTP 404 Not Found", 404)

    def post(self, path, body):
        self.bodies.append(dict(body))
        if path != "/v1/completions":
            raise ServerError(f"POST {path}: HTTP 404 Not Found", 404)
        if not isinstance(body["prompt"], str):
            raise ServerError("POST /v1/completions: HTTP 500 4 validation errors: Input should be a valid string", 500)
        return {
            "choices": [
                {
                    "text": "".join(self.tokens),
                    "logprobs": {
                        "tokens": self.tokens,
                        "token_logprobs": [-0.5] * len(self.tokens),
                        "top_logprobs": [{t: -0.5} for t in self.tokens],
                    },
                    "finish_reason": self.finish,
                }
            ],
            "usage": {"prompt_tokens": len(VOCAB.encode(body["prompt"])), "completion_tokens": len(self.tokens)},
        }


def test_a_prompt_refused_as_ids_with_a_500_goes_as_text_and_digits_are_text():
    client = CannedClient()
    offer = discover(client, vocab=lambda: VOCAB)
    assert offer.prompt_text and offer.token_text and not offer.token_ids
    assert client.bodies[0]["prompt"] == [5, 6, 7] and client.bodies[1]["prompt"] == '"#$'
    assert offer.server == "me" and offer.version == "not reported" and not offer.tokenize
    with pytest.raises(ServerError, match="HTTP 500"):  # without the trainer's tokenizer: the refusal, one line
        discover(CannedClient())
    assert _ids(["token_id:7", 8]) == [7, 8]
    with pytest.raises(Exception, match="tokens as text"):
        _ids(["7"])  # a bare digit is the text of a token ("7" is id 26 here), not id 7


def test_a_response_that_stops_at_an_unlisted_token_is_empty_and_a_count_mismatch_is_refused():
    client = CannedClient(answer_tokens=(), finish="stop")
    offer = discover(CannedClient(), vocab=lambda: VOCAB)
    engine = HttpEngine(client, offer, len(CHARS), 64)
    (c,) = engine.generate([Request((20, 21), 4, 0)], SamplingParams(seed=1))
    assert c.token_ids == [] and c.finish_reason == "stop" and len(c.logprobs) == 0
    client.finish = "length"  # no tokens without a stop: the answer is broken
    with pytest.raises(ServerError, match="0 tokens but 0 logprobs"):
        engine.generate([Request((20, 21), 4, 0)], SamplingParams(seed=1))
    client.tokens = ["0"]
    client.post = lambda path, body, post=client.post: {**post(path, body), "usage": {"prompt_tokens": 3}}
    with pytest.raises(ServerError, match="counted 3 prompt tokens"):
        engine.generate([Request((20, 21), 4, 0)], SamplingParams(seed=1))


def test_draws_that_list_no_token_count_in_the_pooled_mass():
    """40 of 100 draws list no token (the server stopped at one it does not list): with the returned tokens' mass
    0.6 they fit; left out, the 60 listed ones would not fill the 100 expected."""
    fits = frequency_test({5: 60}, {5: 0.6}, 100, unlisted=40)
    assert fits["chi2"] == 0.0 and fits["dof"] == 1
    assert frequency_test({5: 60}, {5: 0.6}, 100)["chi2"] == 40.0  # (0 - 40)^2 / 40: the pool left empty

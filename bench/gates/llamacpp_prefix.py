"""Why the determinism probe passes or fails on llama-cpp-python's server by the order requests arrive in: the
server keeps one KV cache and reuses the prefix a request shares with the one before it (`Llama.generate`'s
prefix match, with or without `--cache`), so the same request with the same seed is prefilled in other pieces
depending on what came before it; a repeated prompt has its last token evaluated alone.

Usage: OPENAI_API_KEY=KEY python bench/gates/llamacpp_prefix.py URL
Prints the largest |difference| of one request's sampled-token logprobs (same prompt, same seed) between a run
after an unrelated prompt (whole prompt prefilled), after a prompt sharing 9 tokens, and after itself.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request

PROMPT = "12+34=46\n57+68="


def main(url: str) -> None:
    key = os.environ.get("OPENAI_API_KEY", "")

    def logprobs(prompt: str) -> list[float]:
        body = {"prompt": prompt, "max_tokens": 6, "logprobs": 1, "temperature": 1.0, "top_p": 1.0, "seed": 7}
        req = urllib.request.Request(
            url.rstrip("/") + "/v1/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.load(r)["choices"][0]["logprobs"]["token_logprobs"]

    def after(previous: str) -> list[float]:
        logprobs(previous)
        return logprobs(PROMPT)

    fresh = after("zzzz")
    for name, previous in (("a prompt sharing 9 tokens", PROMPT[:9] + "9"), ("the same prompt", PROMPT)):
        got = after(previous)
        print(f"after {name}: max |delta| {max(abs(a - b) for a, b in zip(fresh, got)):.3g} against a fresh prefill")


if __name__ == "__main__":
    main(sys.argv[1])

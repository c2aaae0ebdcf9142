"""Why the sampling probe fails on llama-cpp-python's server: one-token draws at temperature 1 and top_p 1, with
the server's own sampling defaults and with them switched off through llama.cpp's request fields, each against
the logprobs the server returns (the gate's chi-square, `frequency_test`).

Usage: OPENAI_API_KEY=KEY python bench/gates/llamacpp_sampling.py URL [DRAWS]
(a server started as bench/gates/llamacpp_gate.sh starts it; docs/gate-your-stack.md, "Second server: llama.cpp").
At temperature 1 the raw and the processed distribution are one, so what is left is the sampler's own processing:
llama-cpp-python's request defaults top_k 40, min_p 0.05 and repeat_penalty 1.1 apply unless a request overrides
them, and an OpenAI client sends none of them.
"""

from __future__ import annotations

import json
import math
import os
import sys
import urllib.request

from timbench.gate.probes import chi2_sf, frequency_test

PROMPTS = ("7+5", "31+")
"""Two prompts whose next token is spread over several digits on the tiny dense checkpoint."""
SETTINGS = {
    "server defaults (top_k 40, min_p 0.05, repeat_penalty 1.1)": {},
    "repeat_penalty 1": {"repeat_penalty": 1.0},
    "top_k 0, min_p 0, repeat_penalty 1": {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0},
}


def main(url: str, draws: int) -> None:
    key = os.environ.get("OPENAI_API_KEY", "")

    def post(body):
        req = urllib.request.Request(
            url.rstrip("/") + "/v1/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.load(r)["choices"][0]["logprobs"]

    for name, extra in SETTINGS.items():
        chi2 = dof = 0
        for prompt in PROMPTS:
            seen: dict[str, list[float]] = {}
            for j in range(draws):
                body = {"prompt": prompt, "max_tokens": 1, "logprobs": 1, "temperature": 1.0, "top_p": 1.0}
                lp = post({**body, "seed": 1000 + j, **extra})
                if lp["tokens"]:  # a draw of a stop token lists none
                    seen.setdefault(lp["tokens"][0], []).append(lp["token_logprobs"][0])
            probs = {t: math.fsum(math.exp(x) for x in v) / len(v) for t, v in seen.items()}
            listed = sum(map(len, seen.values()))
            r = frequency_test({t: len(v) for t, v in seen.items()}, probs, draws, unlisted=draws - listed)
            chi2, dof = chi2 + r["chi2"], dof + r["dof"]
        print(f"{name}: {draws} draws x {len(PROMPTS)} prompts, chi2 {chi2:.1f}, dof {dof}, p {chi2_sf(chi2, dof):.3g}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 600)

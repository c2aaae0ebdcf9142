"""Sampling replay: score the trainer's logprobs over the support the engine sampled from.

With top-k / top-p (the engine keys `top_k`, `top_p`) the engine draws each token from the truncated
distribution renormalised over its kept set, and reports that distribution's logprob (vLLM's processed
logprobs). A trainer that normalises over the whole vocabulary compares two distributions on
different supports: log pi - log mu = -log(pi's mass on the kept set) <= 0 on every token, a bias
rather than noise, and pi_theta puts gradient on tokens the sampler could never draw. DeepSeek-V3.2's
"Keep Sampling Mask" (arXiv 2512.02556, sect. 3.1) keeps the rollout's mask and applies it to pi_old
and pi_theta in training; vLLM returns that mask (PR #49577, "sampling distribution replay"), and
prime-rl (PRs #2601, #3235, #3431), NeMo-RL (PR #2053) and SkyRL (issue #877) replay it.

Here the engine records the kept set of every sampled position and the trainer sets every other logit
to -inf before its log-softmax, in the recompute pass and in every update pass (so both pi_old and
pi_theta live on the engine's support; the gradient of the dropped logits is zero). The KL penalty's
reference policy is scored over the full vocabulary, as NeMo-RL does. Without truncation the engine
records no support and the remedy is the identity, bit for bit (tested).
"""

from __future__ import annotations

from .base import Remedy, finish


class SamplingReplay(Remedy):
    name = "sampling_replay"
    doc = (
        "Sampling replay (DeepSeek-V3.2's Keep Sampling Mask, arXiv 2512.02556; vLLM PR #49577): the trainer "
        "renormalises its logprobs (pi_old and pi_theta) over the tokens the engine's top-k / top-p kept at "
        "each sampled position, so pi and mu are compared on the same support. No parameters: the support is "
        "the engine's (engine keys top_k, top_p); without truncation it is the identity. Needs engine=timbench."
    )
    sampling_replay = True

    def check_engine(self, engine):
        if engine.engine != "timbench" and (engine.top_k > 0 or engine.top_p < 1):
            raise ValueError(
                f"remedy {self.name} needs the engine's sampling support (the top-k/top-p kept set "
                f"of every sampled token); engine={engine.engine} returns only the sampled tokens' "
                "logprobs; use engine=timbench"
            )

    def __call__(self, batch):
        return finish(batch)


SUPPORT_REMEDIES = (SamplingReplay,)

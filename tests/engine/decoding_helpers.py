"""Tiny checkpoints and the full-recompute oracles for the decoding tests.

The checkpoints are real ``transformers`` ``Qwen3_5MoeForCausalLM`` models of a few thousand
parameters, with large initial weights and a scaled LM head so that output distributions are
peaked (several positions clear the 0.95 threshold in one pass, others do not). The Clover model
gets the same tensors (its parameter names are the checkpoint's without the ``model.`` prefix).

``reference_diffusion_decode`` is the oracle for diffusion decoding: no caches at all; every
denoising step re-runs the whole sequence (prompt, finished blocks, current block with its masks)
through ``transformers`` with a 4D block-causal attention mask on the full-attention layers (GDN
layers are causal, which is what a checkpoint without bidirectional tensors means), and applies
LowConfidence written out independently of ``clover_agent.engine.decoding.decoder``. It also covers a
causally encoded context (``causal_context``) and sampling with transformers' warpers
(:class:`ReferenceSampling`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from clover_agent.engine.model.config import CloverConfig
from clover_agent.engine.model.network import CloverModel

VOCAB = 384
MASK_ID = VOCAB - 1
EOS_ID = 0
BLOCK = 32


def tiny_hf_model(
    seed: int = 0, *, lm_scale: float = 6.0, init_std: float = 0.15, layer_types: list[str] | None = None
) -> Qwen3_5MoeForCausalLM:
    """A random tiny Qwen3.5-MoE (3 GDN layers + 1 full attention, or ``layer_types``) with peaked
    outputs."""
    config = Qwen3_5MoeTextConfig(
        layer_types=layer_types,
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=4096,
        initializer_range=init_std,
        eos_token_id=[EOS_ID],
    )
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(lm_scale)
    return model


def clover_config_dict(hf: Qwen3_5MoeForCausalLM) -> dict:
    data = hf.config.to_dict()
    data.update(model_type="qwen3_5_moe_text", mask_token_id=MASK_ID, block_size=BLOCK, threshold=0.95)
    return data


def clover_from_hf(hf: Qwen3_5MoeForCausalLM) -> CloverModel:
    """The engine's model with the checkpoint's tensors."""
    model = CloverModel(CloverConfig.from_dict(clover_config_dict(hf)), kernels="torch")
    state = {name.removeprefix("model."): tensor for name, tensor in hf.state_dict().items()}
    model.load_state_dict(state, strict=True)
    return model.eval()


def block_causal_mask(length: int, block: int, causal_until: int = 0) -> torch.Tensor:
    """Additive [1, 1, T, T] mask: full attention inside aligned blocks, causal across them; rows
    before ``causal_until`` (a causally encoded context) are plainly causal."""
    index = torch.arange(length) // block
    allowed = index[None, :] <= index[:, None]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    allowed[:causal_until] = causal[:causal_until]
    mask = torch.zeros(1, 1, length, length)
    return mask.masked_fill(~allowed, float("-inf"))


@torch.no_grad()
def reference_logits(
    hf: Qwen3_5MoeForCausalLM, tokens: list[int], block: int = BLOCK, causal_until: int = 0
) -> torch.Tensor:
    ids = torch.tensor([tokens])
    mask = {"full_attention": block_causal_mask(len(tokens), block, causal_until), "linear_attention": None}
    return hf(ids, attention_mask=mask).logits[0].float()


@dataclass(frozen=True)
class ReferenceSampling:
    """Sampling in the oracle: transformers' warpers in their order (temperature, top-k, top-p), one
    ``torch.multinomial`` draw per masked row from a generator seeded with ``seed``, and the commit
    confidence by ``rule`` ("probability": the draw's probability; "sglang": min(argmax probability
    at temperature 1, exp((z_drawn - z_max) / T)))."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    rule: str = "probability"
    seed: int = 0

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        ids = torch.zeros(logits.shape[0], 1, dtype=torch.long)
        scores = TemperatureLogitsWarper(self.temperature)(ids, logits.clone())
        if self.top_k:
            scores = TopKLogitsWarper(self.top_k)(ids, scores)
        if self.top_p < 1.0:
            scores = TopPLogitsWarper(self.top_p)(ids, scores)
        return torch.softmax(scores, dim=-1)

    def choose(self, logits: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, confidences) of rows whose mask-token logit is already -inf."""
        probs = self.probabilities(logits)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        drawn = probs.gather(1, tokens[:, None]).squeeze(1)
        if self.rule == "probability":
            return tokens, drawn
        top = logits.max(dim=-1).values
        relative = torch.exp((logits.gather(1, tokens[:, None]).squeeze(1) - top) / self.temperature)
        return tokens, torch.minimum(torch.softmax(logits, dim=-1).max(dim=-1).values, relative)


def reference_diffusion_decode(
    hf: Qwen3_5MoeForCausalLM | Callable[[list[int], int], torch.Tensor],
    prompt: list[int],
    max_new_tokens: int,
    *,
    threshold: float = 0.95,
    stop_ids: tuple[int, ...] = (EOS_ID,),
    block: int = BLOCK,
    mask_id: int = MASK_ID,
    causal_context: bool = False,
    sampling: ReferenceSampling | None = None,
) -> tuple[list[int], list[int]]:
    """(generated tokens, steps per block) by full recompute; every block decoded to the end.

    ``hf`` is the transformers model, or any function from (the whole token sequence, the current
    block's start) to its logits (for checkpoints transformers cannot run). ``causal_context``:
    everything before the current block is encoded causally."""
    if isinstance(hf, torch.nn.Module):
        model = hf

        def logits_of(tokens: list[int], start: int) -> torch.Tensor:
            return reference_logits(model, tokens, block, start if causal_context else 0)

    else:
        logits_of = hf
    generator = torch.Generator().manual_seed(sampling.seed) if sampling is not None else None
    sequence = list(prompt)
    steps_per_block = []
    while True:
        start = len(sequence)
        block_start = start // block * block
        end = block_start + block
        sequence += [mask_id] * (end - start)
        steps = 0
        while mask_id in sequence[start:end]:
            logits = logits_of(sequence, block_start)[start:end]
            logits[:, mask_id] = float("-inf")
            masked = [i for i in range(end - start) if sequence[start + i] == mask_id]
            if sampling is None:
                probs = torch.softmax(logits[masked], dim=-1)
                tokens, confidence = probs.argmax(dim=-1), probs.max(dim=-1).values
            else:
                tokens, confidence = sampling.choose(logits[masked], generator)
            best = list(zip(confidence.tolist(), masked, tokens.tolist(), strict=True))
            chosen = [(i, t) for conf, i, t in best if conf > threshold]
            if not chosen:
                top = max(conf for conf, _, _ in best)
                chosen = [next((i, t) for conf, i, t in best if conf == top)]
            for i, token in chosen:
                sequence[start + i] = token
            steps += 1
        steps_per_block.append(steps)
        generated = sequence[len(prompt) :]
        for i, token in enumerate(generated[:max_new_tokens]):
            if token in stop_ids:
                return generated[:i], steps_per_block
        if len(generated) >= max_new_tokens:
            return generated[:max_new_tokens], steps_per_block


def chain_hf_model(
    first: int = 5, last: int = 24, lm_scale: float = 2.0, last_followed_by: int | None = None
) -> Qwen3_5MoeForCausalLM:
    """A tiny model that is nearly a bigram table: token x in [first, last) is followed by x + 1,
    ``last`` and the mask token by ``last``. Embeddings of these tokens are large orthogonal
    vectors and the LM head reads them back, while the (small, random) layers add a little
    context-dependent noise. Its diffusion drafts (masks predict ``last``) agree with its causal
    choices once the chain reaches ``last``, so speculative drafts get accepted. With
    ``last_followed_by`` that token follows ``last`` instead (``last`` is still what masks predict)."""
    model = tiny_hf_model(0, lm_scale=1.0, init_std=0.02)
    hidden = model.config.hidden_size
    with torch.no_grad():
        model.lm_head.weight.zero_()
        chain = [*range(first, last + 1), MASK_ID]
        for axis, token in enumerate(chain):
            model.model.embed_tokens.weight[token] = 0.0
            model.model.embed_tokens.weight[token, axis % hidden] = 8.0
            following = token + 1 if first <= token < last else last
            if token == last and last_followed_by is not None:
                following = last_followed_by
            model.lm_head.weight[following, axis % hidden] = lm_scale
    return model

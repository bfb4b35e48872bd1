"""Tiny checkpoints and the full-recompute oracles for the decoding tests.

The checkpoints are real ``transformers`` ``Qwen3_5MoeForCausalLM`` models of a few thousand
parameters, with large initial weights and a scaled LM head so that output distributions are
peaked (several positions clear the 0.95 threshold in one pass, others do not). The Clover model
gets the same tensors (its parameter names are the checkpoint's without the ``model.`` prefix).

``reference_diffusion_decode`` is the oracle for diffusion decoding: no caches at all; every
denoising step re-runs the whole sequence (prompt, finished blocks, current block with its masks)
through ``transformers`` with a 4D block-causal attention mask on the full-attention layers (GDN
layers are causal, which is what a checkpoint without bidirectional tensors means), and applies
LowConfidence written out independently of ``clover_agent.engine.decoding``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

from clover_agent.engine.config import CloverConfig
from clover_agent.engine.model import CloverModel

VOCAB = 384
MASK_ID = VOCAB - 1
EOS_ID = 0
BLOCK = 32


def tiny_hf_model(seed: int = 0, *, lm_scale: float = 6.0, init_std: float = 0.15) -> Qwen3_5MoeForCausalLM:
    """A random tiny Qwen3.5-MoE (3 GDN layers + 1 full attention) with peaked outputs."""
    config = Qwen3_5MoeTextConfig(
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


def block_causal_mask(length: int, block: int) -> torch.Tensor:
    """Additive [1, 1, T, T] mask: full attention inside aligned blocks, causal across them."""
    index = torch.arange(length) // block
    allowed = index[None, :] <= index[:, None]
    mask = torch.zeros(1, 1, length, length)
    return mask.masked_fill(~allowed, float("-inf"))


@torch.no_grad()
def reference_logits(hf: Qwen3_5MoeForCausalLM, tokens: list[int], block: int = BLOCK) -> torch.Tensor:
    ids = torch.tensor([tokens])
    mask = {"full_attention": block_causal_mask(len(tokens), block), "linear_attention": None}
    return hf(ids, attention_mask=mask).logits[0].float()


def reference_diffusion_decode(
    hf: Qwen3_5MoeForCausalLM | Callable[[list[int]], torch.Tensor],
    prompt: list[int],
    max_new_tokens: int,
    *,
    threshold: float = 0.95,
    stop_ids: tuple[int, ...] = (EOS_ID,),
    block: int = BLOCK,
    mask_id: int = MASK_ID,
) -> tuple[list[int], list[int]]:
    """(generated tokens, steps per block) by full recompute; every block decoded to the end.

    ``hf`` is the transformers model, or any function from the whole token sequence to its
    block-causal logits (for checkpoints transformers cannot run)."""
    logits_of = (
        hf if not isinstance(hf, torch.nn.Module) else lambda tokens: reference_logits(hf, tokens, block)
    )
    sequence = list(prompt)
    steps_per_block = []
    while True:
        start = len(sequence)
        end = (start // block + 1) * block
        sequence += [mask_id] * (end - start)
        steps = 0
        while mask_id in sequence[start:end]:
            logits = logits_of(sequence)[start:end]
            logits[:, mask_id] = float("-inf")
            probs = torch.softmax(logits, dim=-1)
            masked = [i for i in range(end - start) if sequence[start + i] == mask_id]
            best = [(float(probs[i].max()), i) for i in masked]
            chosen = [i for conf, i in best if conf > threshold]
            if not chosen:
                top = max(conf for conf, _ in best)
                chosen = [min(i for conf, i in best if conf == top)]
            for i in chosen:
                sequence[start + i] = int(probs[i].argmax())
            steps += 1
        steps_per_block.append(steps)
        generated = sequence[len(prompt) :]
        for i, token in enumerate(generated[:max_new_tokens]):
            if token in stop_ids:
                return generated[:i], steps_per_block
        if len(generated) >= max_new_tokens:
            return generated[:max_new_tokens], steps_per_block


def chain_hf_model(first: int = 5, last: int = 24, lm_scale: float = 2.0) -> Qwen3_5MoeForCausalLM:
    """A tiny model that is nearly a bigram table: token x in [first, last) is followed by x + 1,
    ``last`` and the mask token by ``last``. Embeddings of these tokens are large orthogonal
    vectors and the LM head reads them back, while the (small, random) layers add a little
    context-dependent noise. Its diffusion drafts (masks predict ``last``) agree with its causal
    choices once the chain reaches ``last``, so speculative drafts get accepted."""
    model = tiny_hf_model(0, lm_scale=1.0, init_std=0.02)
    hidden = model.config.hidden_size
    with torch.no_grad():
        model.lm_head.weight.zero_()
        chain = [*range(first, last + 1), MASK_ID]
        for axis, token in enumerate(chain):
            model.model.embed_tokens.weight[token] = 0.0
            model.model.embed_tokens.weight[token, axis % hidden] = 8.0
            following = token + 1 if first <= token < last else last
            model.lm_head.weight[following, axis % hidden] = lm_scale
    return model

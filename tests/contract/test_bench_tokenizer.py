"""The benchmark's exact-length prompts through the tiny model's real tokenizer (transformers)."""
from __future__ import annotations

import pytest

from vllm_spark_plugin.bench.workloads import PromptFactory


def test_tokenizer_gives_exact_length_text_prompts(tiny_model_path):
    from transformers import AutoTokenizer
    f = PromptFactory("t", seed=3)
    f.use_tokenizer(str(tiny_model_path))
    tok = AutoTokenizer.from_pretrained(str(tiny_model_path))
    prompts = [f.random_prompt(32, token_ids=True) for _ in range(20)]
    assert all(isinstance(p, str) for p in prompts) and len(set(prompts)) == 20
    assert sum(len(tok.encode(p, add_special_tokens=False)) == 32 for p in prompts) >= 19
    with pytest.raises(ValueError, match="--tokenizer '/nonexistent'"):
        PromptFactory("t").use_tokenizer("/nonexistent")

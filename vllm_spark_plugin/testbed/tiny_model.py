"""Build the tiny Qwen3-MoE test model and its tokenizer, deterministically and offline.

Nothing is downloaded: the weights are random with a fixed seed, and the byte-level BPE tokenizer is
trained on a few lines of text.  The model is small enough that the CPU build of vLLM serves it in
seconds per request yet big enough (8 experts, top-2) to exercise the MoE path and show a batching
curve with a knee.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
DEFAULT_DIR = Path(os.environ.get("SPARK_PLUGIN_TINY_MODEL", _CACHE / "vllm-spark" / "tiny-qwen3-moe"))
SERVED_NAME = "tiny-qwen3-moe"
SEED = 1234
VOCAB = 512

# Text for the tokenizer: prose and code, so both benchmark workloads tokenize sensibly.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A DGX Spark is a small box with unified memory that serves language models to a team.",
    "Continuous batching shares every decode step between all running streams.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "import os\nimport sys\n\nclass Server:\n    def __init__(self, port: int) -> None:\n        self.port = port\n",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a hash map works, with an example in Python.",
    "0123456789 +-*/=()[]{}<>,.;:!?'\"#@$%^&|~`_\\",
]


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 8, min_frequency=1,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", bos_token=None)
    # A minimal chat template so /v1/chat/completions works too.
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    fast.save_pretrained(str(out))


def build_model(out: Path, dtype: str = "bfloat16") -> None:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(SEED)
    cfg = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, norm_topk_prob=True,
        max_position_embeddings=4096, rope_theta=10000.0, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=0, pad_token_id=0, torch_dtype=dtype,
    )
    model = Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        # Larger-than-default init so greedy decoding is not a constant token stream.
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(out), safe_serialization=True)
    gen = {"bos_token_id": None, "eos_token_id": 0, "pad_token_id": 0, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def ensure_tiny_model(out: Path | str | None = None, force: bool = False) -> Path:
    """Build the model into `out` (default $XDG_CACHE_HOME or ~/.cache, then vllm-spark/tiny-qwen3-moe) unless already there."""
    import shutil
    import tempfile

    out = Path(out) if out else DEFAULT_DIR
    marker = out / ".complete"
    if marker.exists() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename into place, so concurrent builders never see half a model.
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        build_tokenizer(tmp)
        build_model(tmp)
        (tmp / ".complete").write_text("ok\n")
        if force and out.exists():
            shutil.rmtree(out)
        try:
            tmp.rename(out)
        except OSError:  # someone else finished first
            if not marker.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def add_arguments(parser) -> None:
    parser.add_argument("--out", default=str(DEFAULT_DIR), help="folder to write (default: %(default)s)")
    parser.add_argument("--force", action="store_true", help="rebuild even if present")


def run(args) -> int:
    path = ensure_tiny_model(args.out, force=args.force)
    print(path)
    return 0


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser()
    add_arguments(p)
    sys.exit(run(p.parse_args()))

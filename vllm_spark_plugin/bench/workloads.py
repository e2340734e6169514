"""Benchmark workloads (seed 003's protocol) and the prompts they send.

* `code`: 16 Python tasks, temperature 0, 1,000 requested output tokens;
* `prose`: 16 English writing topics, temperature 0.7, 500 requested output tokens (seed 003 used
  300-600);
* `random`: random-token prompts of a fixed length (the shape `vllm bench serve --dataset-name
  random` uses), temperature 0, 256 output tokens.  With a local tokenizer they are exact-length
  text, as vllm bench sends; otherwise exact token-id lists (completions API) or random words.

Each stream of a wave gets a distinct prompt.  With `unique` on (the default) every request also
carries a short unique tag at the start, so no request hits the prefix cache of an earlier one and
TTFT always includes the full prefill.

Every request must fit the server's `max_model_len` (prompt + output tokens, as the server counts
them after its chat template).  `context_budget` is the one rule for how many prompt tokens to ask
for; `check_fits` refuses a sweep workload that cannot fit, naming the option that fixes it.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from importlib import resources
from typing import Union

Prompt = Union[str, list[int]]  # text, or token ids (completions API only)

WORKLOAD_NAMES = ("code", "prose", "random")

# Tokens a request carries beyond the prompt tokens asked for: the chat template (Qwen3 with thinking
# off: 8-14) and the unique tag (up to about 30 with digits tokenized one by one).
PROMPT_OVERHEAD_TOKENS = 64
# Random-word prompts (chat API, no local tokenizer) hit their length only on average: their
# tokens-per-word ratio is measured on one 400-token sample.  On the tiny test model a 2,032-token
# request came out at 2,026 +- 67 tokens (3.3%, 200 seeds); 10% is three of those.
WORD_SLACK = 0.10


class ContextError(ValueError):
    """Requests cannot fit the server's max_model_len; the message names the option that fixes it."""


def context_budget(max_model_len: int, output_tokens: int, exact: bool) -> int:
    """Prompt tokens to ask for so that prompt + `output_tokens` fits `max_model_len`: less the
    template/tag overhead, and less the slack when the prompt's length is only approximate."""
    room = max_model_len - output_tokens - PROMPT_OVERHEAD_TOKENS
    return room if exact else math.floor(room / (1 + WORD_SLACK))


@dataclass(frozen=True)
class Workload:
    name: str
    temperature: float
    output_tokens: int
    input_tokens: int | None = None  # random workload only

    def describe(self) -> str:
        extra = f", {self.input_tokens} input tokens" if self.input_tokens else ""
        return f"{self.name}: {self.output_tokens} output tokens, temperature {self.temperature:g}{extra}"


DEFAULTS = {
    "code": Workload("code", temperature=0.0, output_tokens=1000),
    "prose": Workload("prose", temperature=0.7, output_tokens=500),
    "random": Workload("random", temperature=0.0, output_tokens=256, input_tokens=256),
}


def make_workload(name: str, output_tokens: int | None = None, temperature: float | None = None,
                  input_tokens: int | None = None) -> Workload:
    if name not in DEFAULTS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOAD_NAMES)}")
    base = DEFAULTS[name]
    return Workload(name,
                    temperature=base.temperature if temperature is None else temperature,
                    output_tokens=base.output_tokens if output_tokens is None else output_tokens,
                    input_tokens=(input_tokens or base.input_tokens) if name == "random" else None)


def prompt_sets() -> dict[str, list[str]]:
    """The shipped code and prose prompt sets (16 each)."""
    data = json.loads(resources.files(__package__).joinpath("prompts.json").read_text(encoding="utf-8"))
    return {"code": list(data["code"]), "prose": list(data["prose"])}


def _word_pool() -> list[str]:
    words: set[str] = set()
    for texts in prompt_sets().values():
        for t in texts:
            words.update(w.strip(".,:;!?'\"()").lower() for w in t.split())
    return sorted(w for w in words if w.isalpha())


class PromptFactory:
    """Prompts for one run: distinct per stream, unique per request when asked.

    `token_pool` holds token ids known to be ordinary tokens of the served model (from the server's
    `/tokenize` endpoint); with it, random prompts are exact-length token-id lists for the completions
    API.  Without it (or for the chat API) random prompts are random words, whose token count the
    server reports back in `usage`.
    """

    def __init__(self, run_id: str, unique: bool = True, token_pool: list[int] | None = None,
                 tokens_per_word: float = 1.3, seed: int | None = None) -> None:
        self.run_id = run_id
        self.unique = unique
        self.token_pool = list(token_pool or [])
        self.tokens_per_word = tokens_per_word
        self.sets = prompt_sets()
        self.words = _word_pool()
        self.rng = random.Random(seed)
        self.counter = 0
        self.tokenizer = None  # set by use_tokenizer
        self._vocab: list[int] = []

    def _tag(self) -> str:
        self.counter += 1
        return f"[{self.run_id}-{self.counter}] "

    def prompt(self, workload: Workload, stream_index: int, token_ids: bool) -> Prompt:
        """The prompt for stream `stream_index` of a wave (distinct within a wave of up to 16)."""
        if workload.name == "random":
            return self.random_prompt(workload.input_tokens or 256, token_ids)
        texts = self.sets[workload.name]
        text = texts[stream_index % len(texts)]
        return (self._tag() + text) if self.unique else text

    def exact_length(self, token_ids: bool) -> bool:
        """Whether `random_prompt(n)` is exactly n tokens (local tokenizer text or token ids) rather
        than random words of about n tokens."""
        return self.tokenizer is not None or (token_ids and bool(self.token_pool))

    def prompt_tokens_bound(self, workload: Workload, token_ids: bool) -> int:
        """At most this many prompt tokens in a request of `workload` (template and tag aside).
        Shipped prompts: their UTF-8 bytes (a byte-level BPE token covers at least one byte)."""
        if workload.name == "random":
            n = workload.input_tokens or 256
            return n if self.exact_length(token_ids) else math.ceil(n * (1 + WORD_SLACK))
        return max(len(t.encode("utf-8")) for t in self.sets[workload.name])

    def random_prompt(self, n_tokens: int, token_ids: bool) -> Prompt:
        """A random prompt of `n_tokens` tokens, never seen before: exact-length text with a local
        tokenizer (what `vllm bench serve --dataset-name random` sends), else exact token ids
        (completions API), else random words of about that many tokens."""
        if self.tokenizer is not None:
            return self._tokenizer_text(n_tokens)
        if token_ids and self.token_pool:
            return [self.rng.choice(self.token_pool) for _ in range(n_tokens)]
        n_words = max(1, round(n_tokens / self.tokens_per_word))
        return self._tag() + " ".join(self.rng.choice(self.words) for _ in range(n_words))

    def use_tokenizer(self, path: str) -> None:
        """Build random prompts as text with the served model's own tokenizer (transformers)."""
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ValueError("--tokenizer needs the `transformers` package") from None
        try:
            tok = AutoTokenizer.from_pretrained(path)
        except Exception as exc:  # noqa: BLE001 - any loading failure is a bad --tokenizer value
            raise ValueError(f"--tokenizer {path!r}: cannot load a tokenizer there ({exc})") from None
        special = set(tok.all_special_ids)
        self.tokenizer = tok
        self._vocab = [i for i in range(len(tok)) if i not in special]

    def _tokenizer_text(self, n: int) -> str:
        """Decode random ids, re-encode, cut to n and decode again until the text is n tokens."""
        tok = self.tokenizer
        text = ""
        for _ in range(10):
            ids = [self.rng.choice(self._vocab) for _ in range(n)]
            ids = tok.encode(tok.decode(ids), add_special_tokens=False)
            while len(ids) < n:
                ids += tok.encode(tok.decode([self.rng.choice(self._vocab) for _ in range(n - len(ids))]),
                                  add_special_tokens=False)
            text = tok.decode(ids[:n])
            if len(tok.encode(text, add_special_tokens=False)) == n:
                break
        return text

    def check_fits(self, workload: Workload, token_ids: bool, max_model_len: int | None) -> None:
        """Raise ContextError, naming the option to change, when a request of `workload` can be longer
        than `max_model_len` (None: the server did not say; nothing to check)."""
        if not max_model_len:
            return
        prompt = self.prompt_tokens_bound(workload, token_ids)
        out = workload.output_tokens
        if prompt + out + PROMPT_OVERHEAD_TOKENS <= max_model_len:
            return
        what = (f"{workload.name} requests of up to {prompt} prompt tokens, {out} output tokens and up to "
                f"{PROMPT_OVERHEAD_TOKENS} for the chat template and tag do not fit max_model_len {max_model_len}")
        most_out = max_model_len - prompt - PROMPT_OVERHEAD_TOKENS
        most_in = context_budget(max_model_len, out, self.exact_length(token_ids))
        fixes = []
        if workload.name == "random" and most_in >= 1:
            fixes.append(f"use --random-input-len {most_in} or less")
        if most_out >= 1:
            fixes.append(f"use --output-tokens {most_out} or less")
        fix = ", or ".join(fixes) or "serve the model with a larger --max-model-len"
        raise ContextError(f"{what}: {fix}")

    def corpus(self) -> str:
        """All shipped prompt text (what `/tokenize` is asked about to build the token pool)."""
        return "\n".join(t for texts in self.sets.values() for t in texts)

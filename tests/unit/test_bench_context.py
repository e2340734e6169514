"""The benchmark's one rule for fitting requests into a server's max_model_len: how long a prompt to
ask for, the note when a long prompt is shortened, and the refusal (naming the option) when a sweep
workload cannot fit."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from vllm_spark_plugin.bench.scenarios import LongPrompts, fit_prompt_len
from vllm_spark_plugin.bench.workloads import (PROMPT_OVERHEAD_TOKENS, WORD_SLACK, ContextError, PromptFactory,
                                               context_budget, make_workload)


def test_budget_leaves_room_for_output_template_and_word_slack():
    assert context_budget(2048, 1, exact=True) == 2048 - 1 - PROMPT_OVERHEAD_TOKENS
    approx = context_budget(2048, 1, exact=False)
    assert approx * (1 + WORD_SLACK) <= 2048 - 1 - PROMPT_OVERHEAD_TOKENS < (approx + 1) * (1 + WORD_SLACK)


def test_long_prompt_is_shortened_with_the_note():
    n, note = fit_prompt_len(32000, 2048)
    assert n == context_budget(2048, 1, exact=True)
    assert note == f"long prompt shortened from 32000 to {n} tokens to fit max_model_len 2048"
    assert fit_prompt_len(1000, 2048) == (1000, None)
    assert fit_prompt_len(32000, None) == (32000, None)  # the server did not say: sent as asked
    assert fit_prompt_len(32000, 2048, exact=False)[0] == context_budget(2048, 1, exact=False)


def test_a_window_too_small_for_any_long_prompt_is_refused():
    with pytest.raises(ContextError, match="max_model_len 64 leaves no room .* larger --max-model-len"):
        fit_prompt_len(32000, 64)


@pytest.mark.parametrize("name,kw,option", [
    ("random", {"input_tokens": 4000}, "--random-input-len"),
    ("code", {"output_tokens": 4000}, "--output-tokens"),
    ("prose", {"output_tokens": 2000}, "--output-tokens"),
])
def test_sweep_workload_that_cannot_fit_names_the_option(name, kw, option):
    prompts = PromptFactory("run", seed=1)
    w = make_workload(name, **kw)
    with pytest.raises(ContextError, match=f"max_model_len 2048: use {option} (\\d+) or less") as err:
        prompts.check_fits(w, token_ids=False, max_model_len=2048)
    suggested = int(err.value.args[0].split(f"use {option} ")[1].split()[0])
    fixed = make_workload(name, **{k: suggested for k in kw})
    prompts.check_fits(fixed, token_ids=False, max_model_len=2048)  # the suggestion fits
    prompts.check_fits(w, token_ids=False, max_model_len=None)  # unknown window: nothing to check


def test_defaults_fit_the_test_server():
    prompts = PromptFactory("run", seed=1)
    for name in ("code", "prose", "random"):
        prompts.check_fits(make_workload(name), token_ids=False, max_model_len=2048)


def test_word_prompts_are_cut_until_the_server_count_fits():
    """Random words are only about n tokens: counted (here 3 tokens a word) and cut to fit."""
    calls = []

    async def count(text: str) -> int:
        calls.append(text)
        return 3 * len(text.split())

    prompts = PromptFactory("run", seed=3)  # about 1.3 tokens a word assumed: 3 is far more
    client = SimpleNamespace(token_ids_allowed=False)
    long = LongPrompts(client, prompts, 32000, 2048, count)
    assert long.tokens == context_budget(2048, 1, exact=True) and long.note
    text = asyncio.run(long.new())
    assert 3 * len(text.split()) <= long.tokens and len(calls) >= 2
    assert 3 * len(text.split()) > 0.9 * long.tokens  # cut to fit, not to nothing
    # without a counter the budget keeps the slack instead
    assert LongPrompts(client, prompts, 32000, 2048, None).tokens == context_budget(2048, 1, exact=False)

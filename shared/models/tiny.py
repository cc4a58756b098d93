"""A tiny causal LM and tokenizer built entirely from code: offline, seeded, a few hundred KB.

`build_tiny_model(dir)` writes a directory that `hf:<dir>` loads: a byte-level BPE tokenizer
trained on a small built-in corpus (plus any text you pass), a ChatML chat template that
renders tools, Hermes-style tool calls and tool results (with `{% generation %}` markers so
trainers can mask everything but the assistant's tokens), and a randomly initialised Llama.
Untrained it babbles; the learner trains it into `local/tiny-agent`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

PAD = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_TAGS = ("<tool_call>", "</tool_call>")

# ChatML with Hermes tool calls. Whitespace is explicit ('\n' literals, every tag trimmed) so
# that "<|im_start|>assistant\n" + what the model generates + "<|im_end|>" is exactly how the
# template renders that turn back: training and sampling see the same tokens.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(start=0) -%}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set ns.start = 1 -%}"
    "{{- '<|im_start|>system\\n' + messages[0].content -}}"
    "{%- if tools -%}{{- '\\n\\n' -}}{%- endif -%}"
    "{%- elif tools -%}{{- '<|im_start|>system\\n' -}}"
    "{%- endif -%}"
    "{%- if tools -%}"
    "{{- '# Tools\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\nTo call a tool, reply with <tool_call>\\n"
    '{"name": <tool>, "arguments": {...}}'
    "\\n</tool_call>' -}}"
    "{%- endif -%}"
    "{%- if ns.start == 1 or tools -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for message in messages[ns.start:] -%}"
    "{%- if message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}"
    "{{- message.content or '' -}}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if loop.first and message.content -%}{{- '\\n' -}}{%- endif -%}"
    "{%- if not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": ' + (fn.name | tojson) + ', \"arguments\": ' -}}"
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}"
    "{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}"
    "{%- if message.content is string -%}{{- message.content -}}"
    "{%- elif message.content is none -%}"
    "{%- else -%}{{- message.content | tojson -}}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Enough varied text for the BPE merges to cover chat scaffolding, JSON and tool vocabulary.
_BASE_CORPUS = [
    "system user assistant tool tools arguments name description parameters properties",
    'type object string number integer boolean array required {"name": "lookup", '
    '"arguments": {"id": "O-1"}}',
    "You are a helpful agent. Use the tools to complete the task, then answer briefly.",
    "Refund order O-1 for $100 for Alice. Look up the order, then issue the refund.",
    "SELECT name, amount FROM orders WHERE status = 'shipped' ORDER BY amount DESC;",
    "def add(a, b):\n    return a + b\n\nassert add(1, 2) == 3\n",
    "navigate click type submit read_page url form input button link page",
    "list_files read_file write_file delete_file run_tests describe_schema run_sql "
    "submit_answer lookup_order refund get_order",
    "error: unknown tool; invalid JSON arguments; the order was not found. ok done.",
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 10 100 1000",
]


def build_tokenizer(
    corpus: Iterable[str] = (), *, vocab_size: int = 1024
):  # -> PreTrainedTokenizerFast (import kept lazy: transformers is the `train` extra)
    """Train a byte-level BPE tokenizer on the built-in corpus plus `corpus`; deterministic."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = list(_BASE_CORPUS) + [_render_sample()] + list(corpus)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    # Atomic but not "special": decoding keeps them, so tool calls survive skip_special_tokens.
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TOOL_TAGS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        eos_token=IM_END,
        bos_token=None,
        unk_token=None,
        padding_side="left",
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    directory: str | Path,
    *,
    seed: int = 0,
    corpus: Iterable[str] = (),
    vocab_size: int = 1024,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    intermediate_size: int | None = None,
    max_positions: int = 2048,
) -> Path:
    """Write a seeded tiny Llama + tokenizer to `directory` and return its path."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(corpus, vocab_size=vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    pad_id = tokenizer.convert_tokens_to_ids(PAD)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or hidden_size * 3,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    # Seed both the global and a forked RNG so building never disturbs the caller's stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id, pad_token_id=pad_id, do_sample=True
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "rollout_tiny.json").write_text(
        json.dumps({"builder": "rollout.shared.models.tiny", "seed": seed}, indent=2) + "\n"
    )
    return path


def _render_sample() -> str:
    # One rendered conversation, so chat scaffolding gets its own merges.
    call = json.dumps({"name": "lookup_order", "arguments": {"order_id": "O-1"}})
    return (
        f"{IM_START}system\nYou are an agent.{IM_END}\n{IM_START}user\nRefund O-1{IM_END}\n"
        f"{IM_START}assistant\n<tool_call>\n{call}\n</tool_call>{IM_END}\n"
        f'{IM_START}tool\n{{"amount": 100}}{IM_END}\n{IM_START}assistant\nDone.{IM_END}\n'
    )

"""The API server's prompt tokenization, per prompt token: the measurement behind
efficiency.TOKENIZE_SECONDS_PER_PROMPT_TOKEN (docs/cost-model.md, Serving: the API server's
tokenizer).

Prompts are built as `vllm bench serve`'s random dataset builds them (and InferenceX's copy of
it, utils/bench_serving/benchmark_serving.py sample_random_requests): consecutive vocabulary ids
from a random offset, decoded to text, re-encoded and trimmed or padded until the text is the
wanted number of tokens. Each is then tokenized the way vLLM and SGLang do it, a
PreTrainedTokenizerFast called on the one text, and timed (median of the prompts).

Not part of the planner or its tests: it needs `transformers`, `tokenizers` and `tiktoken`
(pip install "transformers<5" tokenizers tiktoken, in a separate environment) and two
vocabularies that registries ship:
- o200k (gpt-oss's): `npm pack tiktoken@1.0.22`, package/encoders/o200k_base.json;
- Llama 3's: the PyPI wheel llama-models 0.3.0, llama_models/llama3/tokenizer.model.

    python bench/tokenize_cost.py --o200k-json package/encoders/o200k_base.json \
        --llama3-model llama_models/llama3/tokenizer.model [--text FILE ...]

`--text`: also spans of natural text (the license texts under /usr/share/common-licenses, say).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

# the pre-tokenizer patterns of the two vocabularies (o200k_base.json's pat_str; Llama 3's
# tokenizer.py in llama-models)
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+"""])
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
PROMPTS = 6
LENGTHS = (1024, 8192)


def tiktoken_file_from_npm_json(path: Path, out: Path) -> None:
    """npm tiktoken's compressed ranks ("! <offset> <base64 token> ...": rank = offset + index)
    as a .tiktoken file (one "<base64 token> <rank>" a line)."""
    ranks = json.loads(path.read_text())["bpe_ranks"]
    with out.open("w") as handle:
        for line in filter(None, ranks.split("\n")):
            _, offset, *tokens = line.split(" ")
            for k, token in enumerate(tokens):
                handle.write(f"{token} {int(offset) + k}\n")


def fast_tokenizer(tiktoken_file: Path, pattern: str):
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    converted = TikTokenConverter(vocab_file=str(tiktoken_file), pattern=pattern,
                                  additional_special_tokens=["<|endoftext|>"]).converted()
    return PreTrainedTokenizerFast(tokenizer_object=converted)


def random_prompts(tokenizer, vocab_size: int, length: int, count: int, seed: int = 0) -> list[str]:
    """sample_random_requests' prompts: consecutive ids from a random offset, decoded, then
    re-encoded and trimmed or padded (random ids) up to 10 times until the length holds."""
    import numpy as np

    rng = np.random.RandomState(seed)
    prompts = []
    for i in range(count):
        offset = int(rng.randint(0, vocab_size))
        text = tokenizer.decode([(offset + i + j) % vocab_size for j in range(length)])
        for _ in range(10):
            ids = tokenizer.encode(text, add_special_tokens=False)
            if len(ids) < length:
                ids += rng.randint(0, vocab_size, size=length - len(ids)).tolist()
            elif len(ids) > length:
                ids = ids[:length]
            else:
                break
            text = tokenizer.decode(ids)
        prompts.append(text)
    return prompts


def text_prompts(tokenizer, text: str, length: int, count: int) -> list[str]:
    """`count` spans of `length` tokens of a natural text, spread over it, as text."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) < length:
        raise SystemExit(f"--text: {len(ids):,} tokens, fewer than {length:,}")
    stride = max(1, (len(ids) - length) // count)
    return [tokenizer.decode(ids[k:k + length]) for k in range(0, len(ids) - length + 1, stride)][:count]


def measure(name: str, tokenizer, vocab_size: int, text: str | None = None) -> None:
    for length in LENGTHS:
        prompts = (random_prompts(tokenizer, vocab_size, length, PROMPTS) if text is None
                   else text_prompts(tokenizer, text, length, PROMPTS))
        tokenizer(prompts[0])  # warm
        seconds, tokens = [], []
        for prompt in prompts:
            start = time.perf_counter()
            encoded = tokenizer(prompt)
            seconds.append(time.perf_counter() - start)
            tokens.append(len(encoded["input_ids"]))
        per_token = statistics.median(s / t for s, t in zip(seconds, tokens, strict=True))
        size = statistics.mean(len(p.encode()) / t for p, t in zip(prompts, tokens, strict=True))
        print(f"{name:8s} {length:6,d} tokens: {statistics.median(seconds) * 1e3:6.2f} ms a prompt, "
              f"{per_token * 1e6:.2f} us a token ({size:.1f} bytes a token)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--o200k-json", type=Path, required=True, help="npm tiktoken 1.0.22: encoders/o200k_base.json")
    parser.add_argument("--llama3-model", type=Path, required=True, help="llama-models 0.3.0: llama3/tokenizer.model")
    parser.add_argument("--text", type=Path, nargs="*", default=(),
                        help="natural text files: also time spans of them (e.g. /usr/share/common-licenses/GPL-3)")
    args = parser.parse_args()
    text = " ".join(path.read_text(errors="ignore") for path in args.text) or None
    with tempfile.TemporaryDirectory() as scratch:
        o200k = Path(scratch) / "o200k_base.tiktoken"
        tiktoken_file_from_npm_json(args.o200k_json, o200k)
        tokenizers = {"o200k": (fast_tokenizer(o200k, O200K_PATTERN), 199_998)}
    tokenizers["llama3"] = (fast_tokenizer(args.llama3_model, LLAMA3_PATTERN), 128_000)
    for name, (tokenizer, vocab_size) in tokenizers.items():
        measure(name, tokenizer, vocab_size)
        if text is not None:
            measure(f"{name} text", tokenizer, vocab_size, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

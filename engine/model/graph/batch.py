"""Token batches as a model's keyword arguments, by task.

jobctl's data sources give each micro-batch as ``(x, y)``: ``x`` the tokens, ``y``
the same tokens shifted by one. A graph model is called with the keyword arguments
its task expects, and computes its own loss from ``labels`` (Hugging Face models
do). The masked-LM mask is drawn per sample from (seed, sample index), so any layout
and any resume mask the same tokens; it masks exactly ``round(0.15 * T)`` tokens of
every sample (not a Bernoulli draw per token), so every micro-batch has the same number
of labels, and the mean of the micro-batches' mean losses is the batch's mean loss
under any micro-batching -- as one process computes it.
"""

from __future__ import annotations

import torch

TASKS = ("causal_lm", "masked_lm", "seq2seq", "image_classification")
MASK_PROB = 0.15
IGNORE = -100


def infer_task(class_name: str) -> str | None:
    """The task of a Hugging Face class from its name, or None."""
    if class_name.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal_lm"
    if class_name.endswith("ForMaskedLM"):
        return "masked_lm"
    if class_name.endswith(("ForConditionalGeneration", "ForSeq2SeqLM")):
        return "seq2seq"
    if class_name.endswith("ForImageClassification"):
        return "image_classification"
    return None


def model_inputs(
    task: str,
    x: torch.Tensor,
    y: torch.Tensor,
    first: int = 0,
    seed: int = 0,
    mask_id: int | None = None,
    config: dict | None = None,
) -> dict[str, torch.Tensor]:
    """Keyword arguments of one micro-batch; ``first`` is its first global sample."""
    if task == "causal_lm":  # Hugging Face shifts the labels itself
        return {"input_ids": x, "labels": x}
    if task == "seq2seq":  # translate x into its continuation y
        return {"input_ids": x, "labels": y}
    if task == "masked_lm":
        return _masked(x, first, seed, mask_id)
    if task == "image_classification":
        return synthetic_images(x.shape[0], first, seed, config or {}, x.device)
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")


def _masked(x: torch.Tensor, first: int, seed: int, mask_id: int | None) -> dict:
    if mask_id is None:
        raise ValueError("a masked_lm batch needs the mask token id (graph.mask_token)")
    chosen = torch.zeros(x.shape, dtype=torch.bool)
    k = max(1, round(MASK_PROB * x.shape[1]))
    for j in range(x.shape[0]):  # per sample, so micro-batching does not change masks
        gen = torch.Generator().manual_seed(seed * 1_000_003 + first + j)
        chosen[j, torch.randperm(x.shape[1], generator=gen)[:k]] = True
    chosen = chosen.to(x.device)
    labels = torch.where(chosen, x, torch.full_like(x, IGNORE))
    return {"input_ids": torch.where(chosen, torch.full_like(x, mask_id), x), "labels": labels}


def synthetic_images(m: int, first: int, seed: int, config: dict, device) -> dict:
    """``data.source: synthetic`` for an image model: sample ``i``'s pixels are drawn
    from (seed, i) and its label is the horizontal band (of ``num_labels``) with the
    brightest mean, so the task is learnable and any layout sees the same samples."""
    c, size = config.get("num_channels", 3), config.get("image_size", 224)
    classes = max(1, config.get("num_labels", 2))
    pixels = torch.empty(m, c, size, size)
    labels = torch.empty(m, dtype=torch.long)
    for j in range(m):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + first + j)
        pixels[j] = torch.randn(c, size, size, generator=gen)
        bands = pixels[j].mean(0).chunk(classes, dim=0)
        labels[j] = int(torch.stack([b.mean() for b in bands]).argmax())
    return {"pixel_values": pixels.to(device), "labels": labels.to(device)}


def example_inputs(task: str, m: int, seq_len: int, device: str = "meta", config=None) -> dict:
    """Meta tensors shaped like one micro-batch of ``task`` (for tracing); an image
    task's shape comes from the model's config fields (channels, image size)."""
    config = config or {}
    if task == "image_classification":
        c = config.get("num_channels", 3)
        size = config.get("image_size", 224)
        pixels = torch.zeros(m, c, size, size, device=device)
        return {"pixel_values": pixels, "labels": torch.zeros(m, dtype=torch.long, device=device)}

    # Distinct tensors: export would merge two arguments that are one object.
    def tokens() -> torch.Tensor:
        return torch.zeros(m, seq_len, dtype=torch.long, device=device)

    return {"input_ids": tokens(), "labels": tokens()}

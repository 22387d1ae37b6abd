"""The names the optimizer accepts, in a module without torch (the CLI's parser uses them)."""

MODELS = ("translation", "rigid", "similarity", "affine", "deformable", "diffeomorphic")
LINEAR_MODELS = MODELS[:4]
METRICS = ("ncc", "lncc", "ssim", "mse", "mi")
#: the metric of ``metric=None`` per model, chosen by measurement (docs/benchmarks.md,
#: "Registration quality"): global NCC for linear models (more accurate and about twice
#: as fast as local NCC on the suite's cases), local NCC for dense ones (a field needs a
#: local similarity)
DEFAULT_METRICS = {m: ("ncc" if m in LINEAR_MODELS else "lncc") for m in MODELS}


def default_metric(model: str, metric: str | None = None) -> str | None:
    """``metric``, or the model's default when it is None (an unknown model: None)."""
    return DEFAULT_METRICS.get(model) if metric is None else metric

"""The names the optimizer accepts, in a module without torch (the CLI's parser uses them)."""

MODELS = ("translation", "rigid", "similarity", "affine", "deformable", "diffeomorphic")
LINEAR_MODELS = MODELS[:4]
METRICS = ("ncc", "lncc", "ssim", "mse", "mi")
#: the metric of ``metric=None`` per model, chosen by measurement (docs/benchmarks.md,
#: "Registration quality"): global NCC for linear models (more accurate and about twice
#: as fast as local NCC on the suite's cases) and for the deformable model's B-spline
#: field (issue 16: end-point error on three draws of each 2-D dense case of
#: benchmarks/bench_quality.py, local σ 8 px: mean 0.067 px against local NCC's 0.070 with
#: its best bending weight; a pair whose intensities differ locally wants "lncc"),
#: local NCC for the diffeomorphic one
DEFAULT_METRICS = {m: ("ncc" if m in LINEAR_MODELS else "lncc") for m in MODELS}
DEFAULT_METRICS["deformable"] = "ncc"


def default_metric(model: str, metric: str | None = None) -> str | None:
    """``metric``, or the model's default when it is None (an unknown model: None)."""
    return DEFAULT_METRICS.get(model) if metric is None else metric
